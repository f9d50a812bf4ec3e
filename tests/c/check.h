/* The checks of every C test program. Each prints what failed (flushed:
 * the tests read a program's output line by line while it runs) on
 * CHECK_OUT, which is stdout unless the program defines it first (the
 * benchmark, the SM loop and the simulator's own programs keep stdout for
 * their figures and use stderr).
 *
 * CHECK(call): a CUDA driver call the test program cannot go on without.
 * On failure it prints "<call> failed: <code>" and returns 1 from the
 * calling function (main, or a helper whose 1 main returns).
 * MUST(call): the same for a helper that cannot return 1 (it returns
 * something else or nothing): it exits 1 instead.
 * REQUIRE(cond): a condition the program cannot go on without. On failure
 * it prints "check failed at line <n>: <cond>" and exits 1. */
#ifndef VGPU_TEST_CHECK_H
#define VGPU_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include "cuda_min.h"

#ifndef CHECK_OUT
#define CHECK_OUT stdout
#endif

#define CHECK(call)                                                   \
    do {                                                              \
        CUresult r_ = (call);                                         \
        if (r_ != CUDA_SUCCESS) {                                     \
            fprintf(CHECK_OUT, "%s failed: %d\n", #call, (int)r_);    \
            fflush(CHECK_OUT);                                        \
            return 1;                                                 \
        }                                                             \
    } while (0)

#define MUST(call)                                                    \
    do {                                                              \
        CUresult r_ = (call);                                         \
        if (r_ != CUDA_SUCCESS) {                                     \
            fprintf(CHECK_OUT, "%s failed: %d\n", #call, (int)r_);    \
            fflush(CHECK_OUT);                                        \
            exit(1);                                                  \
        }                                                             \
    } while (0)

#define REQUIRE(cond)                                                         \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(CHECK_OUT, "check failed at line %d: %s\n", __LINE__,     \
                    #cond);                                                   \
            fflush(CHECK_OUT);                                                \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

#endif
