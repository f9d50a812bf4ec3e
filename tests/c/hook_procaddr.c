/* cuGetProcAddress under the hook: for each (name, CUDA version, flags) the
 * pointer handed out must be the hook's export of the versioned symbol the
 * request binds to (cudaTypedefs.h PFN_*_vNNNNN), `_ptsz` with the
 * per-thread-default-stream flag. The hook's exports are looked up with
 * dlsym on the hook library itself ($VGPU_HOOK_LIB).
 * Prints one line per case and "PASS"/"FAIL n" at the end.
 * Real driver: cc -DUSE_CUDA_H -I/usr/local/cuda/include hook_procaddr.c -lcuda -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef USE_CUDA_H
#include <cuda.h>
#else
typedef int CUresult;
typedef unsigned long long cuuint64_t;
typedef int CUdriverProcAddressQueryResult;
#define CUDA_SUCCESS 0
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
CUresult cuInit(unsigned int flags);
#endif

typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

struct tc {
    const char *name;
    int version;
    unsigned long long flags;
    const char *want;
};

int main(void) {
    const char *lib = getenv("VGPU_HOOK_LIB");
    void *hook = dlopen(lib ? lib : "libvgpu.so", RTLD_NOW | RTLD_NOLOAD);
    if (!hook) {
        printf("FAIL hook library not loaded (%s)\n", lib ? lib : "libvgpu.so");
        return 1;
    }
    if (cuInit(0) != CUDA_SUCCESS) {
        printf("FAIL cuInit\n");
        return 1;
    }
    /* The way CUDA 12+ runtimes start: cuGetProcAddress_v2 by dlsym on the driver. */
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    gpa2_t gpa = drv ? (gpa2_t)dlsym(drv, "cuGetProcAddress_v2") : NULL;
    if (!gpa || gpa != (gpa2_t)dlsym(hook, "cuGetProcAddress_v2")) {
        printf("FAIL dlsym(libcuda, cuGetProcAddress_v2) is not the hook's\n");
        return 1;
    }
    const unsigned long long PT = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    const unsigned long long LEG = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    static const struct tc cases[] = {
        {"cuMemAlloc", 11080, 0, "cuMemAlloc_v2"},
        {"cuMemAlloc", 12040, 1, "cuMemAlloc_v2"},
        {"cuMemAlloc", 13000, 0, "cuMemAlloc_v2"},
        {"cuMemFree", 11080, 0, "cuMemFree_v2"},
        {"cuMemFree", 13000, 0, "cuMemFree_v2"},
        {"cuMemGetInfo", 12000, 0, "cuMemGetInfo_v2"},
        {"cuDeviceTotalMem", 13000, 0, "cuDeviceTotalMem_v2"},
        {"cuMemAllocManaged", 11080, 0, "cuMemAllocManaged"},
        {"cuMemAllocPitch", 12000, 0, "cuMemAllocPitch_v2"},
        {"cuMemCreate", 12000, 0, "cuMemCreate"},
        {"cuMemRelease", 13000, 0, "cuMemRelease"},
        {"cuMemRetainAllocationHandle", 12000, 0, "cuMemRetainAllocationHandle"},
        {"cuMemMap", 12000, 0, "cuMemMap"},
        {"cuMemUnmap", 13000, 0, "cuMemUnmap"},
        {"cuMemAllocAsync", 11080, 0, "cuMemAllocAsync"},
        {"cuMemAllocAsync", 12000, 2, "cuMemAllocAsync_ptsz"},
        {"cuMemAllocFromPoolAsync", 12000, 0, "cuMemAllocFromPoolAsync"},
        {"cuMemAllocFromPoolAsync", 13000, 2, "cuMemAllocFromPoolAsync_ptsz"},
        {"cuMemFreeAsync", 12000, 2, "cuMemFreeAsync_ptsz"},
        {"cuLaunchKernel", 11080, 0, "cuLaunchKernel"},
        {"cuLaunchKernel", 12000, 1, "cuLaunchKernel"},
        {"cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"},
        {"cuLaunchKernel", 13000, 2, "cuLaunchKernel_ptsz"},
        {"cuLaunchKernelEx", 12000, 0, "cuLaunchKernelEx"},
        {"cuLaunchKernelEx", 13000, 2, "cuLaunchKernelEx_ptsz"},
        {"cuGraphLaunch", 12000, 2, "cuGraphLaunch_ptsz"},
        {"cuDevicePrimaryCtxRetain", 11080, 0, "cuDevicePrimaryCtxRetain"},
        {"cuDevicePrimaryCtxRelease", 12000, 0, "cuDevicePrimaryCtxRelease_v2"},
        {"cuCtxCreate", 11080, 0, "cuCtxCreate_v3"},
        {"cuCtxCreate", 12000, 0, "cuCtxCreate_v3"},
        {"cuCtxCreate", 12080, 0, "cuCtxCreate_v4"},
        {"cuCtxCreate", 13000, 0, "cuCtxCreate_v4"},
        {"cuCtxDestroy", 12000, 0, "cuCtxDestroy_v2"},
        {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
        {"cuGetProcAddress", 13000, 0, "cuGetProcAddress_v2"},
        {"cuInit", 12000, 0, "cuInit"},
    };
    (void)LEG;
    int fails = 0, n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        const struct tc *c = &cases[i];
        void *p = NULL;
        CUdriverProcAddressQueryResult st = 0;
        CUresult r = gpa(c->name, &p, c->version, c->flags, &st);
        void *want = dlsym(hook, c->want);
        int ok = r == CUDA_SUCCESS && p && p == want;
        printf("%s %s %d %llu -> %s rc %d\n", ok ? "ok" : "BAD", c->name, c->version,
               c->flags & PT ? 2ULL : c->flags, c->want, (int)r);
        fails += !ok;
    }
    /* An unhooked name comes back from the driver untouched. */
    void *p = NULL;
    CUdriverProcAddressQueryResult st = 0;
    if (gpa("cuStreamCreate", &p, 12000, 0, &st) == CUDA_SUCCESS && p == dlsym(hook, "cuStreamCreate") &&
        dlsym(hook, "cuStreamCreate") != dlsym(drv, "cuStreamCreate")) {
        printf("BAD cuStreamCreate was substituted\n");
        fails++;
    }
    if (fails) printf("FAIL %d\n", fails);
    else printf("PASS\n");
    return fails != 0;
}
