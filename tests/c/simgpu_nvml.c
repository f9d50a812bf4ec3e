/*
 * simgpu_nvml: prints what NVML reports, for the simulator's tests.
 * Commands (one output line each unless noted):
 *   mem            "mem TOTAL FREE USED" (nvmlDeviceGetMemoryInfo) and
 *                  "mem2 TOTAL RESERVED FREE USED" (_v2)
 *   procs          "procs N", then "proc PID USED" per process (_v3, with the
 *                  count-0 size query); checks _v1 and _v2 agree
 *   util           "util GPU MEM"
 *   putil US_AGO   "putil RC N", then "sample PID SMUTIL TIMESTAMP" per sample
 *                  (lastSeenTimeStamp = now - US_AGO µs; 0 = all)
 *   sleep MS
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "nvml_min.h"
#define CHECK_OUT stderr
#include "check.h"


int main(int argc, char **argv) {
    nvmlDevice_t d;
    unsigned n;
    char buf[96];
    REQUIRE(nvmlDeviceGetCount(&n) == NVML_ERROR_UNINITIALIZED);
    REQUIRE(nvmlInit() == NVML_SUCCESS);
    REQUIRE(nvmlDeviceGetCount(&n) == NVML_SUCCESS && n >= 1);
    REQUIRE(nvmlDeviceGetHandleByIndex(0, &d) == NVML_SUCCESS);
    REQUIRE(nvmlDeviceGetUUID(d, buf, sizeof buf) == NVML_SUCCESS && strncmp(buf, "GPU-", 4) == 0);
    REQUIRE(nvmlDeviceGetUUID(d, buf, 5) == NVML_ERROR_INSUFFICIENT_SIZE);
    REQUIRE(nvmlDeviceGetIndex(d, &n) == NVML_SUCCESS && n == 0);
    for (int i = 1; i < argc; i++) {
        const char *c = argv[i];
        if (!strcmp(c, "mem")) {
            nvmlMemory_t m;
            nvmlMemory_v2_t m2;
            REQUIRE(nvmlDeviceGetMemoryInfo(d, &m) == NVML_SUCCESS);
            printf("mem %llu %llu %llu\n", m.total, m.free, m.used);
            memset(&m2, 0, sizeof m2);
            REQUIRE(nvmlDeviceGetMemoryInfo_v2(d, &m2) == NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
            m2.version = nvmlMemory_v2;
            REQUIRE(nvmlDeviceGetMemoryInfo_v2(d, &m2) == NVML_SUCCESS);
            printf("mem2 %llu %llu %llu %llu\n", m2.total, m2.reserved, m2.free, m2.used);
        } else if (!strcmp(c, "procs")) {
            unsigned cnt = 0;
            nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses_v3(d, &cnt, NULL);
            REQUIRE(r == NVML_SUCCESS || r == NVML_ERROR_INSUFFICIENT_SIZE);
            REQUIRE((cnt == 0) == (r == NVML_SUCCESS));
            nvmlProcessInfo_t p[64];
            nvmlProcessInfo_v1_t p1[64];
            unsigned c2 = 64, c1 = 64;
            REQUIRE(nvmlDeviceGetComputeRunningProcesses_v3(d, &c2, p) == NVML_SUCCESS);
            REQUIRE(nvmlDeviceGetComputeRunningProcesses(d, &c1, p1) == NVML_SUCCESS);
            REQUIRE(c1 == c2);
            printf("procs %u\n", c2);
            for (unsigned k = 0; k < c2; k++) {
                REQUIRE(p1[k].pid == p[k].pid && p1[k].usedGpuMemory == p[k].usedGpuMemory);
                printf("proc %u %llu\n", p[k].pid, p[k].usedGpuMemory);
            }
            cnt = 64;
            REQUIRE(nvmlDeviceGetGraphicsRunningProcesses_v3(d, &cnt, p) == NVML_SUCCESS && cnt == 0);
        } else if (!strcmp(c, "util")) {
            nvmlUtilization_t u;
            REQUIRE(nvmlDeviceGetUtilizationRates(d, &u) == NVML_SUCCESS);
            printf("util %u %u\n", u.gpu, u.memory);
        } else if (!strcmp(c, "putil") && i + 1 < argc) {
            unsigned long long ago = strtoull(argv[++i], NULL, 0), last = 0;
            if (ago) {
                struct timeval tv;
                gettimeofday(&tv, NULL);
                last = (unsigned long long)tv.tv_sec * 1000000ull + tv.tv_usec - ago;
            }
            unsigned cnt = 0;
            nvmlProcessUtilizationSample_t s[64];
            nvmlReturn_t r = nvmlDeviceGetProcessUtilization(d, NULL, &cnt, last);
            if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
                REQUIRE(cnt > 0 && cnt <= 64);
                r = nvmlDeviceGetProcessUtilization(d, s, &cnt, last);
            } else {
                REQUIRE(r == NVML_ERROR_NOT_FOUND && cnt == 0);
            }
            printf("putil %d %u\n", r, r == NVML_SUCCESS ? cnt : 0);
            for (unsigned k = 0; r == NVML_SUCCESS && k < cnt; k++)
                printf("sample %u %u %llu\n", s[k].pid, s[k].smUtil, s[k].timeStamp);
        } else if (!strcmp(c, "sleep") && i + 1 < argc) {
            usleep(atoi(argv[++i]) * 1000);
        } else {
            fprintf(stderr, "unknown command %s\n", c);
            return 2;
        }
        fflush(stdout);
    }
    REQUIRE(nvmlShutdown() == NVML_SUCCESS);
    return 0;
}
