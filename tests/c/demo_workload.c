/* The demo's sample workload: allocate 64 MiB chunks until the driver (or
 * the hook's limit) refuses, free them, launch 100 kernels. Builds against
 * the simulated driver or a real one (cc ... -l:libcuda.so.1). */
#include <stdio.h>
#include <unistd.h>
#include "cuda_min.h"
#include "check.h"

static const char PTX[] =
    ".version 8.0\n.target sm_80\n.address_size 64\n"
    ".visible .entry busy_100us()\n{\n\tret;\n}\n";

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    size_t free_b = 0, total_b = 0;
    printf("pid %d\n", (int)getpid());
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemGetInfo_v2(&free_b, &total_b));
    printf("cuMemGetInfo: total %zu MiB, free %zu MiB\n", total_b >> 20, free_b >> 20);

    enum { CHUNK = 64 << 20, MAX = 4096 };
    static CUdeviceptr ptrs[MAX];
    int n = 0;
    CUresult r = CUDA_SUCCESS;
    while (n < MAX) {
        r = cuMemAlloc_v2(&ptrs[n], CHUNK);
        if (r != CUDA_SUCCESS) break;
        n++;
    }
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("allocated %d x 64 MiB = %d MiB, then cuMemAlloc_v2 returned %s\n", n, n * 64, name);
    for (int i = 0; i < n; i++) CHECK(cuMemFree_v2(ptrs[i]));

    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "busy_100us"));
    for (int i = 0; i < 100; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuCtxSynchronize());
    printf("launched 100 kernels and synchronized\n");
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
    return 0;
}
