/* CHECK(call): a CUDA driver call the test program cannot go on without.
 * On failure it prints "<call> failed: <code>" (flushed: the tests read a
 * program's output line by line while it runs) on CHECK_OUT and returns 1
 * from the calling function (main, or a helper whose 1 main returns).
 * CHECK_OUT is stdout unless the program defines it first (the benchmark
 * and the SM loop keep stdout for their figures and use stderr). */
#ifndef VGPU_TEST_CHECK_H
#define VGPU_TEST_CHECK_H

#include <stdio.h>
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

#endif
