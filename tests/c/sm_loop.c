/* A launch loop for the SM-limit tests (simulated GPU: kernels named
 * busy_<N>us last exactly N µs).
 *
 *   sm_loop kernel <name> <seconds>   cuLaunchKernel loop on a stream
 *   sm_loop graph <name> <seconds>    a 4-node graph of <name>, cuGraphLaunch loop
 *   sm_loop coop <name> <seconds>     cuLaunchCooperativeKernel loop
 *   sm_loop ex <name> <seconds>       cuLaunchKernelEx_ptsz loop on the per-thread stream
 *   sm_loop capture <name> <seconds>  a 20-kernel graph captured from a stream, replayed
 *   sm_loop refused <name> <seconds>  cuLaunchKernel of a NULL function in a loop: the
 *                                     driver refuses every call; CPU busy, GPU idle
 *
 * Launches asynchronously (the driver blocks when its queue is full), then
 * synchronizes and prints `launches N` and `seconds S`.
 *
 * capture (PyTorch's torch.cuda.graph under a limit): launches <name> for
 * 0.3 s (the limiter has learnt it and its bucket is drained), then begins
 * a global-mode capture on its stream and captures 20 launches of <name>
 * in a geometry not launched before (a limiter that timed them would
 * record events into the capture and poll them). A second thread launches
 * <name> on a second stream, in a third geometry, from the beginning of
 * the capture to the end of the run: its first launches are timed, and the
 * limiter polls those events from that thread while the capture is open,
 * which it keeps open until that thread has launched 8 times. Then it ends
 * the capture (on failure: prints `capture failed <code>`, exits 1),
 * instantiates the graph, prints `ready`, and replays the graph until
 * <seconds> after the start are up; prints `launches N` (graph launches)
 * and `seconds S`. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cuda_min.h"
#define CHECK_OUT stderr
#include "check.h"

static const char PTX[] = ".version 8.0\n.target sm_80\n.address_size 64\n";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The second thread of `capture`: launches from `go` to `until`. */
struct side {
    CUcontext ctx;
    CUfunction fn;
    double until;
    atomic_int go, done;
    atomic_long launched;
    int rc;
};

static void *side_loop(void *arg) {
    struct side *s = arg;
    CUstream st;
    CUresult r = cuCtxSetCurrent(s->ctx);
    if (r == CUDA_SUCCESS) r = cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);
    while (r == CUDA_SUCCESS && !atomic_load(&s->go)) usleep(100);
    while (r == CUDA_SUCCESS && now_s() < s->until) {
        r = cuLaunchKernel(s->fn, 1, 1, 1, 64, 1, 1, 0, st, NULL, NULL);
        atomic_fetch_add(&s->launched, 1);
    }
    if (r == CUDA_SUCCESS) r = cuStreamSynchronize(st);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "second thread: CUDA call failed: %d\n", (int)r);
        s->rc = 1;
    }
    atomic_store(&s->done, 1);
    return NULL;
}

static int capture(CUcontext ctx, CUfunction fn, CUstream stream, double secs) {
    double t0 = now_s();
    while (now_s() - t0 < 0.3) {
        CHECK(cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, stream, NULL, NULL));
    }
    struct side side = {ctx, fn, t0 + secs, 0, 0, 0, 0};
    pthread_t th;
    if (pthread_create(&th, NULL, side_loop, &side) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        return 1;
    }

    CUgraph g;
    CUgraphExec exec;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    atomic_store(&side.go, 1);
    for (int i = 0; i < 20; i++) {
        CHECK(cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, stream, NULL, NULL));
    }
    while (atomic_load(&side.launched) < 8 && !atomic_load(&side.done)) usleep(1000);
    CUresult r = cuStreamEndCapture(stream, &g);
    if (r != CUDA_SUCCESS) {
        printf("capture failed %d\n", (int)r);
        fprintf(stderr, "capture failed %d\n", (int)r);
        fflush(stdout);
        exit(1);
    }
    CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
    printf("ready\n");
    fflush(stdout);
    long n = 0;
    while (now_s() - t0 < secs) {
        CHECK(cuGraphLaunch(exec, stream));
        n++;
    }
    pthread_join(th, NULL);
    CHECK(cuCtxSynchronize());
    printf("launches %ld\nseconds %.3f\n", n, now_s() - t0);
    return side.rc;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: sm_loop kernel|graph|coop|ex|capture|refused <name> <seconds>\n");
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
    if (!strcmp(mode, "capture")) return capture(ctx, fn, stream, secs);

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
            } else if (!strcmp(mode, "refused")) {
                if (cuLaunchKernel(NULL, 1, 1, 1, 128, 1, 1, 0, stream, NULL, NULL) == CUDA_SUCCESS) {
                    fprintf(stderr, "a launch of no function succeeded\n");
                    return 1;
                }
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
