/* One tenant of `cargo xtask demo`'s shared GPU:
 *
 *   demo_tenant <hold MiB> <more MiB> <stop file>
 *
 * Prints the memory it sees, allocates <hold> MiB and keeps it, asks for
 * <more> MiB on top (granted or refused by its limit: it prints which),
 * prints `ready`, then launches 1 ms kernels (simulated GPU: busy_1000us
 * lasts exactly that) until <stop file> exists, and prints how many. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "cuda_min.h"
#include "check.h"

static const char PTX[] =
    ".version 8.0\n.target sm_80\n.address_size 64\n"
    ".visible .entry busy_1000us()\n{\n\tret;\n}\n";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: demo_tenant <hold MiB> <more MiB> <stop file>\n");
        return 2;
    }
    size_t hold = strtoull(argv[1], NULL, 10) << 20, more = strtoull(argv[2], NULL, 10) << 20;
    CUdevice dev;
    CUcontext ctx;
    size_t free_b = 0, total_b = 0;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemGetInfo_v2(&free_b, &total_b));
    printf("sees a GPU of %zu MiB (%zu MiB free)\n", total_b >> 20, free_b >> 20);
    CUdeviceptr held, extra;
    CHECK(cuMemAlloc_v2(&held, hold));
    printf("holds %zu MiB\n", hold >> 20);
    CUresult r = cuMemAlloc_v2(&extra, more);
    const char *name = "?";
    cuGetErrorName(r, &name);
    if (r == CUDA_SUCCESS)
        printf("asked for %zu MiB more: granted\n", more >> 20);
    else
        printf("asked for %zu MiB more: refused, %s\n", more >> 20, name);
    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "busy_1000us"));
    printf("ready\n");
    fflush(stdout);
    double t0 = now_s();
    long n = 0;
    while (access(argv[3], F_OK) != 0) {
        for (int i = 0; i < 20; i++, n++)
            CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CHECK(cuCtxSynchronize());
    }
    printf("launched %ld kernels of 1 ms in %.1f s\n", n, now_s() - t0);
    if (r == CUDA_SUCCESS) CHECK(cuMemFree_v2(extra));
    CHECK(cuMemFree_v2(held));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
    return 0;
}
