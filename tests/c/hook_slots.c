/* A process driven line by line on stdin, for the slot and truncation
 * tests (tests/tests/security_hook.rs). Prints "ready" once its context
 * exists, then answers each command with one line:
 *
 *   alloc <bytes>    cuMemAlloc_v2; "alloc rc <r>" (kept until `free`)
 *   thread <bytes>   the same from a new thread; "thread rc <r>"
 *   free             frees the last kept allocation; "free rc <r>"
 *   info             "info free <f> total <t> rc <r>"
 *   exit             exit(0)
 *   return           (in the exit handler) lets exit() finish
 *
 *   hook_slots [stall]
 *       stall: an atexit handler, registered before the hook attaches (so
 *       it runs after the hook's own exit handling), prints "stalled" and
 *       runs the same commands until `return` or EOF: exit() is stalled
 *       with the process's memory still held. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_min.h"

static CUdeviceptr kept[64];
static int nkept;
static CUcontext ctx;

static void *alloc_thread(void *arg) {
    CUdeviceptr p;
    CUresult r = cuCtxSetCurrent(ctx);
    if (r == CUDA_SUCCESS) r = cuMemAlloc_v2(&p, *(size_t *)arg);
    printf("thread rc %d\n", (int)r);
    return NULL;
}

/* Runs commands until `return` (1) or EOF (0). */
static int commands(void) {
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long n = 0;
        if (sscanf(line, "alloc %llu", &n) == 1) {
            CUdeviceptr p = 0;
            CUresult r = cuMemAlloc_v2(&p, n);
            if (r == CUDA_SUCCESS && nkept < 64) kept[nkept++] = p;
            printf("alloc rc %d\n", (int)r);
        } else if (sscanf(line, "thread %llu", &n) == 1) {
            size_t s = n;
            pthread_t t;
            pthread_create(&t, NULL, alloc_thread, &s);
            pthread_join(t, NULL);
        } else if (!strncmp(line, "free", 4)) {
            CUresult r = nkept ? cuMemFree_v2(kept[--nkept]) : CUDA_ERROR_INVALID_VALUE;
            printf("free rc %d\n", (int)r);
        } else if (!strncmp(line, "info", 4)) {
            size_t f = 0, t = 0;
            CUresult r = cuMemGetInfo_v2(&f, &t);
            printf("info free %zu total %zu rc %d\n", f, t, (int)r);
        } else if (!strncmp(line, "exit", 4)) {
            exit(0);
        } else if (!strncmp(line, "return", 6)) {
            return 1;
        }
    }
    return 0;
}

static void stall(void) {
    printf("stalled\n");
    commands();
}

int main(int argc, char **argv) {
    CUdevice dev;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "stall")) atexit(stall);
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx)) {
        printf("context failed\n");
        return 1;
    }
    printf("ready\n");
    commands();
    return 0;
}
