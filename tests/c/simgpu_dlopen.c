/*
 * simgpu_dlopen: loads libcuda.so.1 and libnvidia-ml.so.1 by name with
 * dlopen (as the CUDA runtime, PyTorch and nvidia-smi do; found through
 * LD_LIBRARY_PATH) and calls them only through dlsym / cuGetProcAddress_v2.
 * Built WITHOUT -lcuda. Prints "ok" on success.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_min.h"
#include "nvml_min.h"
#define CHECK_OUT stderr
#include "check.h"


int main(void) {
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    REQUIRE(cu != NULL);
    void *ml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    REQUIRE(ml != NULL);

    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(cu, "cuInit");
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
        (CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))dlsym(
            cu, "cuGetProcAddress_v2");
    REQUIRE(init && gpa);
    REQUIRE(init(0) == CUDA_SUCCESS);

    CUdriverProcAddressQueryResult q;
    CUresult (*count)(int *);
    REQUIRE(gpa("cuDeviceGetCount", (void **)&count, 13000, 0, &q) == CUDA_SUCCESS && q == 0);
    int n = 0;
    REQUIRE(count(&n) == CUDA_SUCCESS && n == 2);
    void *ptsz = NULL, *plain = NULL;
    REQUIRE(gpa("cuLaunchKernel", &ptsz, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q) == 0);
    REQUIRE(gpa("cuLaunchKernel", &plain, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &q) == 0);
    REQUIRE(ptsz == dlsym(cu, "cuLaunchKernel_ptsz"));
    REQUIRE(plain == dlsym(cu, "cuLaunchKernel"));
    void *p = NULL;
    REQUIRE(gpa("cuStreamSynchronize", &p, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q) == 0);
    REQUIRE(p == dlsym(cu, "cuStreamSynchronize_ptsz"));
    REQUIRE(gpa("cuMemcpyHtoD", &p, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q) == 0);
    REQUIRE(p == dlsym(cu, "cuMemcpyHtoD_v2_ptds"));
    REQUIRE(gpa("cuCtxCreate", &p, 12000, 0, &q) == 0 && p == dlsym(cu, "cuCtxCreate_v3"));

    nvmlReturn_t (*ninit)(void) = (nvmlReturn_t(*)(void))dlsym(ml, "nvmlInit_v2");
    nvmlReturn_t (*ncount)(unsigned *) = (nvmlReturn_t(*)(unsigned *))dlsym(ml, "nvmlDeviceGetCount_v2");
    REQUIRE(ninit && ncount);
    unsigned un = 0;
    REQUIRE(ninit() == NVML_SUCCESS && ncount(&un) == NVML_SUCCESS && un == 2);
    printf("ok\n");
    return 0;
}
