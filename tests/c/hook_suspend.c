/* Suspend/resume under the hook (libvgpu.so), against the simulated driver.
 *
 *   hook_suspend loop    installs its own SIGUSR1 handler, makes a context,
 *                        then loops: allocate, launch a 100 µs kernel,
 *                        synchronize, free. Prints "ready" once, then
 *                        "iter <n> usr1 <calls>" every 10 iterations, until
 *                        stdin is closed (a reader thread watches it).
 *   hook_suspend reset   context, allocate 3 x 16 MiB, print the usage the
 *                        hook reports (cuMemGetInfo), reset the primary
 *                        context, retain it again, print the usage again:
 *                        "before <used> after <used>".
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cuda_min.h"
#include "check.h"

static const char PTX[] = ".version 8.0\n.target sm_80\n.address_size 64\n";
static volatile sig_atomic_t usr1_calls;
static volatile int stop;

static void on_usr1(int sig) {
    (void)sig;
    usr1_calls++;
}

static void *watch_stdin(void *arg) {
    char buf[64];
    (void)arg;
    while (fgets(buf, sizeof buf, stdin)) {
    }
    stop = 1;
    return NULL;
}

static int context(CUdevice *dev) {
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, *dev));
    CHECK(cuCtxSetCurrent(ctx));
    return 0;
}

static int loop(void) {
    CUdevice dev;
    CUmodule mod;
    CUfunction fn;
    pthread_t t;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    if (context(&dev)) return 1;
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "busy_100us"));
    pthread_create(&t, NULL, watch_stdin, NULL);
    printf("ready\n");
    fflush(stdout);
    for (unsigned long n = 1; !stop; n++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, 1 << 20));
        CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CHECK(cuStreamSynchronize(NULL));
        CHECK(cuMemFree_v2(p));
        if (n % 10 == 0) {
            printf("iter %lu usr1 %d\n", n, (int)usr1_calls);
            fflush(stdout);
        }
    }
    return 0;
}

static size_t used_now(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo_v2(&f, &t);
    return t - f;
}

static int reset(void) {
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p[3];
    if (context(&dev)) return 1;
    for (int i = 0; i < 3; i++) CHECK(cuMemAlloc_v2(&p[i], 16 << 20));
    size_t before = used_now();
    CHECK(cuDevicePrimaryCtxReset_v2(dev));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    printf("before %zu after %zu\n", before, used_now());
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "loop")) return loop();
    if (argc >= 2 && !strcmp(argv[1], "reset")) return reset();
    fprintf(stderr, "usage: hook_suspend loop|reset\n");
    return 2;
}
