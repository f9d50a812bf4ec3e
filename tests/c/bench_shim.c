/* The cheapest possible interposer, for overhead baselines: an LD_PRELOAD
 * library whose cuLaunchKernel only forwards to the next definition. What
 * it adds over native is the floor any launch hook pays (PLT, an indirect
 * call, cache footprint); scripts/gpu-check.sh measures the hook against it.
 * Build: cc -O2 -shared -fPIC -o bench_shim.so bench_shim.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
static launch_t next;

__attribute__((constructor)) static void init(void) {
    next = (launch_t)dlsym(RTLD_NEXT, "cuLaunchKernel");
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, void *stream, void **params, void **extra) {
    return next(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}
