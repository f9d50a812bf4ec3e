/*
 * daemon_prog: a CUDA process for the vgpu daemon tests.
 *
 *   daemon_prog <out-file> <hooked-MiB> [<hidden-MiB> [<libcuda>]]
 *
 * Waits for a line on stdin, writes "first_call <unix-ns>" to <out-file>,
 * then cuInit, primary context on device 0, cuMemAlloc_v2(<hooked-MiB>).
 * With <hidden-MiB>, loads a second copy of libcuda.so.1 with
 * dlmopen(LM_ID_NEWLM) -- a link-map namespace the preloaded hook is not
 * in -- and allocates <hidden-MiB> through it: the kernel (uprobes are per
 * file) and the driver see it, the hook does not. With <libcuda> (a path),
 * that file is loaded instead: a copy the daemon does not probe, so only
 * the driver sees the hidden bytes. Then writes
 * "allocated <unix-ns>" and holds everything until stdin closes.
 *
 * DAEMON_PROG_DEVICE=<n>: the context (and every allocation) is on device
 * <n>. DAEMON_PROG_FLIP=1: the tenant's trick on its own region
 * (CUDA_DEVICE_MEMORY_SHARED_CACHE): limit[<n>] raised to 64 GiB just
 * before the hooked allocation and put back right after it; writes
 * "flip_us <microseconds the raised limit stood>".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
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

static const char *out_path;

/* Records why the program stopped, for the test's message. */
static int fail(int code, int rc) {
    FILE *f = fopen(out_path, "a");
    if (f) {
        fprintf(f, "error %d (CUresult %d)\n", code, rc);
        fclose(f);
    }
    return code;
}
#define TRY(call, code) do { int rc_ = (call); if (rc_ != CUDA_SUCCESS) return fail(code, rc_); } while (0)

/* limit[dev] in the v1.2 region. */
#define LIMIT_OFFSET(dev) (1600 + 8 * (off_t)(dev))

typedef CUresult (*init_t)(unsigned);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);
typedef CUresult (*setcur_t)(CUcontext);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *out = argv[1];
    out_path = out;
    size_t hooked = (size_t)atol(argv[2]) << 20;
    size_t hidden = argc > 3 ? (size_t)atol(argv[3]) << 20 : 0;
    const char *hidden_lib = argc > 4 ? argv[4] : "libcuda.so.1";
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;

    note(out, "first_call");
    CUcontext ctx;
    CUdeviceptr p;
    TRY(cuInit(0), 3);
    const char *dev_s = getenv("DAEMON_PROG_DEVICE");
    int dev = dev_s ? atoi(dev_s) : 0;
    const char *flip = getenv("DAEMON_PROG_FLIP");
    TRY(cuDevicePrimaryCtxRetain(&ctx, dev), 4);
    TRY(cuCtxSetCurrent(ctx), 5);
    if (hooked && flip && *flip == '1') {
        const char *region = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
        int fd = region ? open(region, O_RDWR) : -1;
        uint64_t was = 0, raised = 64ULL << 30;
        if (fd < 0 || pread(fd, &was, 8, LIMIT_OFFSET(dev)) != 8) return fail(13, 0);
        long long t0 = now_ns();
        if (pwrite(fd, &raised, 8, LIMIT_OFFSET(dev)) != 8) return fail(14, 0);
        int rc = cuMemAlloc(&p, hooked);
        if (pwrite(fd, &was, 8, LIMIT_OFFSET(dev)) != 8) return fail(15, 0);
        long long t1 = now_ns();
        close(fd);
        if (rc != CUDA_SUCCESS) return fail(6, rc);
        FILE *f = fopen(out, "a");
        if (!f) return 10;
        fprintf(f, "flip_us %lld\n", (t1 - t0) / 1000);
        fclose(f);
    } else if (hooked) {
        TRY(cuMemAlloc(&p, hooked), 6);
    }

    if (hidden) {
        void *h = dlmopen(LM_ID_NEWLM, hidden_lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlmopen: %s\n", dlerror());
            return fail(7, 0);
        }
        init_t init = (init_t)dlsym(h, "cuInit");
        retain_t retain = (retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
        setcur_t setcur = (setcur_t)dlsym(h, "cuCtxSetCurrent");
        alloc_t alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
        if (!init || !retain || !setcur || !alloc) return fail(8, 0);
        CUcontext c2;
        CUdeviceptr q;
        TRY(init(0), 9);
        TRY(retain(&c2, dev), 10);
        TRY(setcur(c2), 11);
        TRY(alloc(&q, hidden), 12);
    }
    note(out, "allocated");
    while (fgets(line, sizeof line, stdin)) {
    }
    return 0;
}
