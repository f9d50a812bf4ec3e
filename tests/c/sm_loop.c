/* A launch loop for the SM-limit tests (simulated GPU: kernels named
 * busy_<N>us last exactly N µs).
 *
 *   sm_loop kernel <name> <seconds>   cuLaunchKernel loop on a stream
 *   sm_loop graph <name> <seconds>    a 4-node graph of <name>, cuGraphLaunch loop
 *   sm_loop coop <name> <seconds>     cuLaunchCooperativeKernel loop
 *   sm_loop ex <name> <seconds>       cuLaunchKernelEx_ptsz loop on the per-thread stream
 *
 * Launches asynchronously (the driver blocks when its queue is full), then
 * synchronizes and prints `launches N` and `seconds S`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda_min.h"

static const char PTX[] = ".version 8.0\n.target sm_80\n.address_size 64\n";

#define CHECK(call)                                                   \
    do {                                                              \
        CUresult r_ = (call);                                         \
        if (r_ != CUDA_SUCCESS) {                                     \
            fprintf(stderr, "%s failed: %d\n", #call, (int)r_);       \
            return 1;                                                 \
        }                                                             \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: sm_loop kernel|graph|coop|ex <name> <seconds>\n");
        return 2;
    }
    const char *mode = argv[1];
    double secs = atof(argv[3]);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream stream;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, argv[2]));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    CUgraphExec exec = NULL;
    if (!strcmp(mode, "graph")) {
        CUgraph g;
        CUgraphNode prev = NULL, node;
        CHECK(cuGraphCreate(&g, 0));
        for (int i = 0; i < 4; i++) {
            CUDA_KERNEL_NODE_PARAMS p;
            memset(&p, 0, sizeof p);
            p.func = fn;
            p.gridDimX = p.gridDimY = p.gridDimZ = 1;
            p.blockDimX = 128;
            p.blockDimY = p.blockDimZ = 1;
            CHECK(cuGraphAddKernelNode_v2(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &p));
            prev = node;
        }
        CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
    }

    printf("ready\n");
    fflush(stdout);
    long n = 0;
    double t0 = now_s(), t;
    do {
        for (int i = 0; i < 16; i++, n++) {
            if (exec) {
                CHECK(cuGraphLaunch(exec, stream));
            } else if (!strcmp(mode, "coop")) {
                CHECK(cuLaunchCooperativeKernel(fn, 1, 1, 1, 128, 1, 1, 0, stream, NULL));
            } else if (!strcmp(mode, "ex")) {
                CUlaunchConfig c;
                memset(&c, 0, sizeof c);
                c.gridDimX = c.gridDimY = c.gridDimZ = 1;
                c.blockDimX = 128;
                c.blockDimY = c.blockDimZ = 1;
                c.hStream = NULL;
                CHECK(cuLaunchKernelEx_ptsz(&c, fn, NULL, NULL));
            } else {
                CHECK(cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, stream, NULL, NULL));
            }
        }
        t = now_s();
    } while (t - t0 < secs);
    CHECK(cuCtxSynchronize());
    printf("launches %ld\nseconds %.3f\n", n, now_s() - t0);
    return 0;
}
