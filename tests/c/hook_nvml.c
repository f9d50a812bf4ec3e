/* NVML as nvidia-smi reaches it: dlopen("libnvidia-ml.so.1") + dlsym, no
 * link-time dependency. Needs no CUDA headers.
 *   hook_nvml [-i <index>] info          print total/used/free of device 0 (or <index>)
 *                                        (v1 and v2 structs)
 *   hook_nvml [-i <index>] watch <ms>    sample the device's used memory for <ms>, print
 *                                        the maximum */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
/* nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2) */
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

typedef nvmlReturn_t (*init_t)(void);
typedef nvmlReturn_t (*by_index_t)(unsigned int, nvmlDevice_t *);
typedef nvmlReturn_t (*mem_t)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*mem2_t)(nvmlDevice_t, nvmlMemory_v2_t *);

int main(int argc, char **argv) {
    unsigned int index = 0;
    if (argc >= 3 && !strcmp(argv[1], "-i")) {
        index = (unsigned int)atoi(argv[2]);
        argv += 2;
        argc -= 2;
    }
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) {
        printf("FAIL dlopen: %s\n", dlerror());
        return 1;
    }
    init_t init = (init_t)dlsym(h, "nvmlInit_v2");
    by_index_t by_index = (by_index_t)dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    mem_t mem = (mem_t)dlsym(h, "nvmlDeviceGetMemoryInfo");
    mem2_t mem2 = (mem2_t)dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    nvmlDevice_t d;
    if (!init || !by_index || !mem || init() != 0 || by_index(index, &d) != 0) {
        printf("FAIL nvml init\n");
        return 1;
    }
    if (argc >= 3 && !strcmp(argv[1], "watch")) {
        struct timespec t0, t;
        unsigned long long max = 0;
        long ms = atol(argv[2]), samples = 0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do {
            nvmlMemory_t m;
            if (mem(d, &m) == 0 && m.used > max) max = m.used;
            samples++;
            clock_gettime(CLOCK_MONOTONIC, &t);
        } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
        printf("max_used %llu samples %ld\n", max, samples);
        return 0;
    }
    nvmlMemory_t m;
    nvmlReturn_t r = mem(d, &m);
    printf("v1 rc %d total %llu used %llu free %llu\n", r, m.total, m.used, m.free);
    if (mem2) {
        nvmlMemory_v2_t m2;
        memset(&m2, 0, sizeof m2);
        m2.version = NVML_MEMORY_V2;
        r = mem2(d, &m2);
        printf("v2 rc %d total %llu used %llu free %llu\n", r, m2.total, m2.used, m2.free);
    }
    return 0;
}
