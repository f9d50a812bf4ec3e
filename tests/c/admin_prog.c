/*
 * admin_prog: a CUDA program driven line by line on stdin, for the tests of
 * `vgpu inspect` and the admin commands. Each command prints one line:
 *
 *   ctx                 cuInit + primary context of device 0  -> "ctx RC"
 *   alloc BYTES         cuMemAlloc                             -> "alloc RC"
 *   free                free the last allocation               -> "free RC"
 *   pid                 -> "pid GETPID"
 *   sigs PATH           map the region file PATH, find the slot whose pid
 *                       is getpid(), and install SIGUSR2 (status := 2) and
 *                       SIGUSR1 (status := 1) handlers on it, as HAMi-core
 *                       does                                   -> "sigs SLOT"
 *   status              -> "status S" (own slot, after sigs)
 *   nosigs              restore the default SIGUSR1/SIGUSR2 actions (which
 *                       terminate), undoing what the hook installed, as an
 *                       application that resets its signals would
 *                                                          -> "nosigs 0"
 *   lock PATH           take the region lock the way a holder that then
 *                       hangs would: the OFD lock on the region's bytes
 *                       (vgpu), sem_wait on HAMi-core's semaphore, and
 *                       owner_pid := getpid()                  -> "lock RC"
 *   quit                exit(0)
 *
 * The program exits at stdin EOF.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <semaphore.h>
#include <stdint.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_min.h"

/* Offsets of the v1.2 region (common/src/region.rs asserts the same). */
#define REGION_SIZE 2008952
#define PROCS_AT 1856
#define SLOT_SIZE 1960
#define STATUS_AT 1928
#define PROC_NUM_AT 2008896
#define OWNER_PID_AT 16
#define SEM_AT 24

static CUdeviceptr ptrs[1024];
static int nptrs;
static _Atomic int *my_status;

static void on_suspend(int sig) {
    (void)sig;
    if (my_status) atomic_store(my_status, 2);
}

static void on_resume(int sig) {
    (void)sig;
    if (my_status) atomic_store(my_status, 1);
}

static int install(const char *path) {
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    char *base = mmap(NULL, REGION_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return -1;
    int n = *(_Atomic int *)(base + PROC_NUM_AT);
    for (int i = 0; i < n && i < 1024; i++) {
        char *slot = base + PROCS_AT + (size_t)i * SLOT_SIZE;
        if (*(_Atomic int *)slot == getpid()) {
            my_status = (_Atomic int *)(slot + STATUS_AT);
            signal(SIGUSR2, on_suspend);
            signal(SIGUSR1, on_resume);
            return i;
        }
    }
    return -1;
}

static int lock_region(const char *path) {
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    struct flock fl = {0};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = REGION_SIZE;
    if (fcntl(fd, F_OFD_SETLKW, &fl) != 0) return -2;
    char *base = mmap(NULL, REGION_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return -3;
    if (sem_wait((sem_t *)(base + SEM_AT)) != 0) return -4;
    atomic_store((_Atomic uint64_t *)(base + OWNER_PID_AT), (uint64_t)getpid());
    return 0; /* fd stays open: the lock is held until exit */
}

int main(void) {
    char line[4096];
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        char arg[4000] = "";
        char cmd[32] = "";
        sscanf(line, "%31s %3999s", cmd, arg);
        if (!strcmp(cmd, "ctx")) {
            CUdevice dev;
            CUcontext ctx;
            CUresult r;
            if (!(r = cuInit(0)) && !(r = cuDeviceGet(&dev, 0)) &&
                !(r = cuDevicePrimaryCtxRetain(&ctx, dev)))
                r = cuCtxSetCurrent(ctx);
            printf("ctx %d\n", (int)r);
        } else if (!strcmp(cmd, "alloc")) {
            CUdeviceptr p = 0;
            CUresult r = cuMemAlloc(&p, (size_t)strtoull(arg, NULL, 10));
            if (r == CUDA_SUCCESS && nptrs < 1024) ptrs[nptrs++] = p;
            printf("alloc %d\n", (int)r);
        } else if (!strcmp(cmd, "free")) {
            CUresult r = nptrs ? cuMemFree(ptrs[--nptrs]) : CUDA_ERROR_INVALID_VALUE;
            printf("free %d\n", (int)r);
        } else if (!strcmp(cmd, "pid")) {
            printf("pid %d\n", (int)getpid());
        } else if (!strcmp(cmd, "sigs")) {
            printf("sigs %d\n", install(arg));
        } else if (!strcmp(cmd, "nosigs")) {
            signal(SIGUSR1, SIG_DFL);
            signal(SIGUSR2, SIG_DFL);
            printf("nosigs 0\n");
        } else if (!strcmp(cmd, "status")) {
            printf("status %d\n", my_status ? atomic_load(my_status) : -1);
        } else if (!strcmp(cmd, "lock")) {
            printf("lock %d\n", lock_region(arg));
        } else if (!strcmp(cmd, "quit")) {
            return 0;
        } else {
            printf("unknown %s\n", cmd);
        }
    }
    return 0;
}
