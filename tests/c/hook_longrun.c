/* A GPU process that outlives device-plugin restarts: allocates, says
 * "ready", waits (up to 30 s) for the file named by argv[1], then frees,
 * allocates and launches again with the hook it loaded at the start. */
#include <stdio.h>
#include <unistd.h>
#include "cuda_min.h"
#include "check.h"

static const char PTX[] =
    ".version 8.0\n.target sm_80\n.address_size 64\n"
    ".visible .entry busy_100us()\n{\n\tret;\n}\n";

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    size_t free_b = 0, total_b = 0;
    if (argc < 2) return 2;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc_v2(&p, 64 << 20));
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 600 && access(argv[1], F_OK) != 0; i++) usleep(50000);
    if (access(argv[1], F_OK) != 0) {
        printf("no %s within 30 s\n", argv[1]);
        return 1;
    }
    CHECK(cuMemFree_v2(p));
    CHECK(cuMemAlloc_v2(&p, 128 << 20));
    CHECK(cuMemGetInfo_v2(&free_b, &total_b));
    printf("later cuMemGetInfo: total %zu MiB\n", total_b >> 20);
    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "busy_100us"));
    for (int i = 0; i < 10; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemFree_v2(p));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
    printf("still working\n");
    return 0;
}
