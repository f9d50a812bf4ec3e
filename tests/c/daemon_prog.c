/*
 * daemon_prog: a CUDA process for the vgpu daemon tests.
 *
 *   daemon_prog <out-file> <hooked-MiB> [<hidden-MiB>]
 *
 * Waits for a line on stdin, writes "first_call <unix-ns>" to <out-file>,
 * then cuInit, primary context on device 0, cuMemAlloc_v2(<hooked-MiB>).
 * With <hidden-MiB>, loads a second copy of libcuda.so.1 with
 * dlmopen(LM_ID_NEWLM) -- a link-map namespace the preloaded hook is not
 * in -- and allocates <hidden-MiB> through it: the kernel (uprobes are per
 * file) and the driver see it, the hook does not. Then writes
 * "allocated <unix-ns>" and holds everything until stdin closes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_min.h"

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void note(const char *path, const char *what) {
    FILE *f = fopen(path, "a");
    if (!f) exit(10);
    fprintf(f, "%s %lld\n", what, now_ns());
    fclose(f);
}

typedef CUresult (*init_t)(unsigned);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);
typedef CUresult (*setcur_t)(CUcontext);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *out = argv[1];
    size_t hooked = (size_t)atol(argv[2]) << 20;
    size_t hidden = argc > 3 ? (size_t)atol(argv[3]) << 20 : 0;
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;

    note(out, "first_call");
    CUcontext ctx;
    CUdeviceptr p;
    if (cuInit(0) != CUDA_SUCCESS) return 3;
    if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS) return 4;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return 5;
    if (hooked && cuMemAlloc(&p, hooked) != CUDA_SUCCESS) return 6;

    if (hidden) {
        void *h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlmopen: %s\n", dlerror());
            return 7;
        }
        init_t init = (init_t)dlsym(h, "cuInit");
        retain_t retain = (retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
        setcur_t setcur = (setcur_t)dlsym(h, "cuCtxSetCurrent");
        alloc_t alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
        if (!init || !retain || !setcur || !alloc) return 8;
        CUcontext c2;
        CUdeviceptr q;
        if (init(0) || retain(&c2, 0) || setcur(c2) || alloc(&q, hidden)) return 9;
    }
    note(out, "allocated");
    while (fgets(line, sizeof line, stdin)) {
    }
    return 0;
}
