/*
 * simgpu_tool: a scriptable CUDA driver-API client for the simulator's
 * tests. Retains device 0's primary context, then runs its arguments as
 * commands, printing one "key value..." line per result:
 *
 *   alloc BYTES         cuMemAlloc           -> "alloc RC"
 *   fill CHUNK          alloc CHUNK until OOM -> "fill COUNT RC"
 *   free                free the last allocation -> "free RC"
 *   freeall             free every allocation -> "freeall RC"
 *   info                cuMemGetInfo         -> "info FREE TOTAL"
 *   pid                 -> "pid GETPID HOSTPID" (host pid from simgpu_host_pid)
 *   launch NAME N       N launches of kernel NAME, then synchronize -> "launch RC MS"
 *   duty US PCT MS      for MS ms: a busy_<US>us kernel, synchronize, idle so
 *                       that the device is busy PCT % of the time -> "duty RC N"
 *   sleep MS            sleep
 *   hold                print "ready", then wait for stdin to close
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_min.h"

static CUdeviceptr ptrs[100000];
static int nptrs;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_until_ms(double t) {
    double left = t - now_ms();
    if (left > 0) {
        struct timespec ts = {(time_t)(left / 1e3), (long)((left - (time_t)(left / 1e3) * 1e3) * 1e6)};
        nanosleep(&ts, NULL);
    }
}

int main(int argc, char **argv) {
    CUresult rc = cuInit(0);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    if (rc == CUDA_SUCCESS) rc = cuDeviceGet(&dev, 0);
    if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(ctx);
    if (rc == CUDA_SUCCESS) rc = cuModuleLoadData(&mod, "image");
    printf("init %d\n", rc);
    fflush(stdout);
    if (rc != CUDA_SUCCESS) return 1;
    for (int i = 1; i < argc; i++) {
        const char *c = argv[i];
        if (!strcmp(c, "alloc") && i + 1 < argc) {
            size_t n = strtoull(argv[++i], NULL, 0);
            rc = cuMemAlloc(&ptrs[nptrs], n);
            if (rc == CUDA_SUCCESS) nptrs++;
            printf("alloc %d\n", rc);
        } else if (!strcmp(c, "fill") && i + 1 < argc) {
            size_t n = strtoull(argv[++i], NULL, 0);
            int count = 0;
            while (nptrs < 100000 && (rc = cuMemAlloc(&ptrs[nptrs], n)) == CUDA_SUCCESS) {
                nptrs++;
                count++;
            }
            printf("fill %d %d\n", count, rc);
        } else if (!strcmp(c, "free")) {
            rc = nptrs > 0 ? cuMemFree(ptrs[--nptrs]) : CUDA_ERROR_INVALID_VALUE;
            printf("free %d\n", rc);
        } else if (!strcmp(c, "freeall")) {
            rc = CUDA_SUCCESS;
            while (nptrs > 0 && rc == CUDA_SUCCESS) rc = cuMemFree(ptrs[--nptrs]);
            printf("freeall %d\n", rc);
        } else if (!strcmp(c, "info")) {
            size_t f = 0, t = 0;
            rc = cuMemGetInfo(&f, &t);
            printf("info %zu %zu %d\n", f, t, rc);
        } else if (!strcmp(c, "pid")) {
            unsigned (*host_pid)(void) = (unsigned (*)(void))dlsym(RTLD_DEFAULT, "simgpu_host_pid");
            printf("pid %d %u\n", (int)getpid(), host_pid ? host_pid() : 0);
        } else if (!strcmp(c, "launch") && i + 2 < argc) {
            CUfunction f;
            const char *name = argv[++i];
            int n = atoi(argv[++i]);
            double t0 = now_ms();
            rc = cuModuleGetFunction(&f, mod, name);
            for (int k = 0; k < n && rc == CUDA_SUCCESS; k++)
                rc = cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
            if (rc == CUDA_SUCCESS) rc = cuCtxSynchronize();
            printf("launch %d %.3f\n", rc, now_ms() - t0);
        } else if (!strcmp(c, "duty") && i + 3 < argc) {
            int us = atoi(argv[++i]);
            int pct = atoi(argv[++i]);
            double ms = atof(argv[++i]);
            char name[64];
            CUfunction f;
            snprintf(name, sizeof name, "busy_%dus", us);
            rc = cuModuleGetFunction(&f, mod, name);
            double period = us / 1e3 * 100.0 / (pct > 0 ? pct : 1);
            double t0 = now_ms(), next = t0;
            int n = 0;
            while (rc == CUDA_SUCCESS && now_ms() - t0 < ms) {
                rc = cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
                if (rc == CUDA_SUCCESS) rc = cuCtxSynchronize();
                n++;
                next += period;
                sleep_until_ms(next);
            }
            printf("duty %d %d\n", rc, n);
        } else if (!strcmp(c, "sleep") && i + 1 < argc) {
            usleep(atoi(argv[++i]) * 1000);
        } else if (!strcmp(c, "hold")) {
            printf("ready\n");
            fflush(stdout);
            char buf[64];
            while (fread(buf, 1, sizeof buf, stdin) > 0) {
            }
        } else {
            fprintf(stderr, "unknown command %s\n", c);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
