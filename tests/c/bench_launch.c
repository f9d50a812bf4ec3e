/* Host cost of an empty-kernel launch, of a 1 MiB alloc+free pair and of
 * cuMemGetInfo, for `cargo xtask bench` (simulated GPU) and
 * scripts/gpu-check.sh (real GPU). Prints `launch_ns_per_call N`,
 * `alloc_free_ns_per_pair N` and `meminfo_ns_per_call N`; on the
 * simulated driver also `driver_calls_per_launch N`: every driver call made
 * in the timed loop (the program's own launches and whatever an interposer
 * adds), per launch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda_min.h"
#define CHECK_OUT stderr
#include "check.h"

static const char PTX[] =
    ".version 8.0\n.target sm_80\n.address_size 64\n"
    ".visible .entry busy_0ns()\n{\n\tret;\n}\n";

/* The simulated driver's count of driver calls; absent (NULL) elsewhere. */
extern unsigned long long simgpu_driver_calls(void) __attribute__((weak));

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    int launches = argc > 1 ? atoi(argv[1]) : 100000;
    int allocs = argc > 2 ? atoi(argv[2]) : 2000;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "busy_0ns"));
    /* Warm up, then time launches with one sync at the end: the per-launch
     * cost without a sync per launch. */
    for (int i = 0; i < 1000; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    /* BENCH_WARM_S: keep launching that many seconds first (an SM
     * limiter's correction settles within a few). */
    const char *warm_s = getenv("BENCH_WARM_S");
    double warm = warm_s ? atof(warm_s) : 0.0;
    for (double w0 = now_ns(); now_ns() - w0 < warm * 1e9;)
        for (int i = 0; i < 1000; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuCtxSynchronize());
    unsigned long long c0 = simgpu_driver_calls ? simgpu_driver_calls() : 0;
    double t0 = now_ns();
    for (int i = 0; i < launches; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    unsigned long long c1 = simgpu_driver_calls ? simgpu_driver_calls() : 0;
    CHECK(cuCtxSynchronize());
    double t1 = now_ns();
    printf("launch_ns_per_call %.1f\n", (t1 - t0) / launches);
    if (simgpu_driver_calls) printf("driver_calls_per_launch %.4f\n", (double)(c1 - c0) / launches);

    CUdeviceptr p;
    for (int i = 0; i < 50; i++) {
        CHECK(cuMemAlloc_v2(&p, 1 << 20));
        CHECK(cuMemFree_v2(p));
    }
    t0 = now_ns();
    for (int i = 0; i < allocs; i++) {
        CHECK(cuMemAlloc_v2(&p, 1 << 20));
        CHECK(cuMemFree_v2(p));
    }
    t1 = now_ns();
    printf("alloc_free_ns_per_pair %.1f\n", (t1 - t0) / allocs);
    /* Memory info, as profilers and serving engines poll it. */
    size_t free_b, total_b;
    const int infos = allocs * 10;
    for (int i = 0; i < 100; i++) CHECK(cuMemGetInfo_v2(&free_b, &total_b));
    t0 = now_ns();
    for (int i = 0; i < infos; i++) CHECK(cuMemGetInfo_v2(&free_b, &total_b));
    t1 = now_ns();
    printf("meminfo_ns_per_call %.1f\n", (t1 - t0) / infos);
    /* `calls`: the cost of the driver calls a limited launch adds (the SM
     * limiter's per-launch queries), timed natively. */
    if (argc > 3 && !strcmp(argv[3], "calls")) {
        const int n = 200000;
        CUstreamCaptureStatus cs;
        CUcontext cur;
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        t0 = now_ns();
        for (int i = 0; i < n; i++) CHECK(cuStreamIsCapturing(NULL, &cs));
        t1 = now_ns();
        printf("stream_is_capturing_ns %.1f\n", (t1 - t0) / n);
        t0 = now_ns();
        for (int i = 0; i < n; i++) CHECK(cuCtxGetCurrent(&cur));
        t1 = now_ns();
        printf("ctx_get_current_ns %.1f\n", (t1 - t0) / n);
        t0 = now_ns();
        for (int i = 0; i < n; i++) CHECK(cuThreadExchangeStreamCaptureMode(&mode));
        t1 = now_ns();
        printf("exchange_capture_mode_ns %.1f\n", (t1 - t0) / n);
        struct timespec ts;
        t0 = now_ns();
        for (int i = 0; i < n; i++) clock_gettime(CLOCK_MONOTONIC, &ts);
        t1 = now_ns();
        printf("clock_monotonic_ns %.1f\n", (t1 - t0) / n);
        t0 = now_ns();
        for (int i = 0; i < n; i++) clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        t1 = now_ns();
        printf("clock_monotonic_coarse_ns %.1f\n", (t1 - t0) / n);
    }
    /* Threads the process runs at the end (the driver's, and any a hook added). */
    FILE *st = fopen("/proc/self/status", "r");
    char line[256];
    while (st && fgets(line, sizeof line, st))
        if (!strncmp(line, "Threads:", 8)) printf("threads %d\n", atoi(line + 8));
    if (st) fclose(st);
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
    return 0;
}
