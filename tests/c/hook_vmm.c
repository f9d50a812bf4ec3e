/* The virtual memory API in the orders real clients use it, step by step,
 * for the hook's VMM accounting. The entry points are resolved through
 * cuGetProcAddress_v2, as NCCL and the CUDA runtime resolve them.
 *
 * After each step the program prints `step <name> [<key> <value>...]` and
 * waits for a line on stdin (the test compares the hook's count with the
 * simulated driver's meanwhile); EOF ends it.
 *
 *   hook_vmm nccl <n>        NCCL's cuMem allocator: n buffers of 2 MiB, each
 *                            created, reserved, mapped and made accessible
 *                            (step alloc); three retain/properties/release
 *                            rounds on every live buffer (step pairs); its
 *                            free order (retain, release, unmap, release,
 *                            address free) on the first half (step half),
 *                            then on the rest (step freed).
 *   hook_vmm expandable <n>  PyTorch's expandable segments: one reservation
 *                            of n segments, each created and mapped (step
 *                            grow); the last half unmapped then released
 *                            (step shrink); the rest likewise (step freed).
 *   hook_vmm early <n>       n segments created and mapped in one
 *                            reservation, every handle released while
 *                            mapped (step released), then one cuMemUnmap
 *                            of the whole range (step unmapped).
 *   hook_vmm limit           NCCL-style buffers until cuMemCreate refuses
 *                            (step full: created <k> rc <rc>); retain/release
 *                            pairs on all of them, then one more cuMemCreate
 *                            (step over: rc <rc>); all freed in NCCL's order,
 *                            then one more (step after: rc <rc>).
 *
 * A failed driver call prints `<call> failed: <rc>` and exits 1 (check.h).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_min.h"
#include "check.h"

#define SEG (2u << 20)
#define MAX_BUFS 1024

typedef CUresult (*create_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                             unsigned long long);
typedef CUresult (*release_t)(CUmemGenericAllocationHandle);
typedef CUresult (*retain_t)(CUmemGenericAllocationHandle *, void *);
typedef CUresult (*props_t)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
typedef CUresult (*reserve_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*addr_free_t)(CUdeviceptr, size_t);
typedef CUresult (*map_t)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*unmap_t)(CUdeviceptr, size_t);
typedef CUresult (*access_t)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);

static struct {
    create_t create;
    release_t release;
    retain_t retain;
    props_t props;
    reserve_t reserve;
    addr_free_t addr_free;
    map_t map;
    unmap_t unmap;
    access_t access;
} vmm;

static CUdevice dev;

static void *proc(const char *name) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (cuGetProcAddress_v2(name, &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || !p) {
        printf("FAIL cuGetProcAddress %s status %d\n", name, (int)st);
        exit(1);
    }
    return p;
}


/* Prints the step and waits for the test to go on. */
static void step(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void step(const char *fmt, ...) {
    char line[64];
    va_list ap;
    va_start(ap, fmt);
    printf("step ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) exit(0);
}

/* Every mode's start: a current context on device 0 and the VMM entry
 * points, then step context. */
static void setup(void) {
    CUcontext ctx;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));
    vmm.create = (create_t)proc("cuMemCreate");
    vmm.release = (release_t)proc("cuMemRelease");
    vmm.retain = (retain_t)proc("cuMemRetainAllocationHandle");
    vmm.props = (props_t)proc("cuMemGetAllocationPropertiesFromHandle");
    vmm.reserve = (reserve_t)proc("cuMemAddressReserve");
    vmm.addr_free = (addr_free_t)proc("cuMemAddressFree");
    vmm.map = (map_t)proc("cuMemMap");
    vmm.unmap = (unmap_t)proc("cuMemUnmap");
    vmm.access = (access_t)proc("cuMemSetAccess");
    step("context");
}

static CUmemAllocationProp device_prop(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

static CUresult create(CUmemGenericAllocationHandle *h) {
    CUmemAllocationProp prop = device_prop();
    return vmm.create(h, SEG, &prop, 0);
}

static void map_rw(CUdeviceptr p, CUmemGenericAllocationHandle h) {
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    MUST(vmm.map(p, SEG, 0, h, 0));
    MUST(vmm.access(p, SEG, &acc, 1));
}

/* The address of segment i of a reservation at base. */
static CUdeviceptr segment(CUdeviceptr base, int i) { return base + (CUdeviceptr)i * SEG; }

/* One reservation of n segments, none mapped yet. */
static CUdeviceptr reserve_segments(int n) {
    CUdeviceptr base;
    MUST(vmm.reserve(&base, (size_t)n * SEG, SEG, 0, 0));
    return base;
}

/* The reservation of n segments at base given back. */
static void free_reservation(CUdeviceptr base, int n) {
    MUST(vmm.addr_free(base, (size_t)n * SEG));
}

/* Segment i of base created (its handle in *h) and mapped read-write. */
static void create_mapped(CUdeviceptr base, int i, CUmemGenericAllocationHandle *h) {
    MUST(create(h));
    map_rw(segment(base, i), *h);
}

/* Segments hi-1 down to lo unmapped, each then released, as PyTorch
 * shrinks an expandable segment from its end. */
static void unmap_release(CUdeviceptr base, CUmemGenericAllocationHandle *hs, int lo, int hi) {
    for (int i = hi - 1; i >= lo; i--) {
        MUST(vmm.unmap(segment(base, i), SEG));
        MUST(vmm.release(hs[i]));
    }
}

/* One more cuMemCreate: step <name> rc <rc>, then its handle released if
 * it was created. */
static void one_more(const char *name) {
    CUmemGenericAllocationHandle extra;
    CUresult r = create(&extra);
    step("%s rc %d", name, (int)r);
    if (r == CUDA_SUCCESS) vmm.release(extra);
}

/* NCCL's allocation: granularity, create, reserve, map, access. */
static CUresult nccl_alloc(CUdeviceptr *p) {
    CUmemAllocationProp prop = device_prop();
    CUmemGenericAllocationHandle h;
    size_t gran = 0;
    MUST(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUresult r = vmm.create(&h, SEG, &prop, 0);
    if (r != CUDA_SUCCESS) return r;
    MUST(vmm.reserve(p, SEG, gran, 0, 0));
    map_rw(*p, h);
    return CUDA_SUCCESS;
}

/* What NCCL does to learn about a live buffer: retain its handle, read the
 * properties, release. */
static void nccl_query(CUdeviceptr p) {
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp prop;
    MUST(vmm.retain(&h, (void *)p));
    MUST(vmm.props(&prop, h));
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != dev) {
        printf("FAIL properties: location %d/%d\n", (int)prop.location.type, prop.location.id);
        exit(1);
    }
    MUST(vmm.release(h));
}

/* NCCL's free: retain, release, unmap, release, address free. */
static void nccl_free(CUdeviceptr p) {
    CUmemGenericAllocationHandle h;
    MUST(vmm.retain(&h, (void *)p));
    MUST(vmm.release(h));
    MUST(vmm.unmap(p, SEG));
    MUST(vmm.release(h));
    MUST(vmm.addr_free(p, SEG));
}

/* Buffers lo to hi-1 freed in NCCL's order. */
static void nccl_free_range(const CUdeviceptr *bufs, int lo, int hi) {
    for (int i = lo; i < hi; i++) nccl_free(bufs[i]);
}

static int nccl(int n) {
    CUdeviceptr bufs[MAX_BUFS];
    setup();
    for (int i = 0; i < n; i++) MUST(nccl_alloc(&bufs[i]));
    step("alloc");
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < n; i++) nccl_query(bufs[i]);
    step("pairs");
    nccl_free_range(bufs, 0, n / 2);
    step("half");
    nccl_free_range(bufs, n / 2, n);
    step("freed");
    return 0;
}

static int expandable(int n) {
    CUmemGenericAllocationHandle hs[MAX_BUFS];
    setup();
    CUdeviceptr base = reserve_segments(n);
    for (int i = 0; i < n; i++) create_mapped(base, i, &hs[i]);
    step("grow");
    unmap_release(base, hs, n / 2, n);
    step("shrink");
    unmap_release(base, hs, 0, n / 2);
    free_reservation(base, n);
    step("freed");
    return 0;
}

static int early(int n) {
    setup();
    CUdeviceptr base = reserve_segments(n);
    for (int i = 0; i < n; i++) {
        CUmemGenericAllocationHandle h;
        create_mapped(base, i, &h);
        MUST(vmm.release(h));
    }
    step("released");
    MUST(vmm.unmap(base, (size_t)n * SEG));
    free_reservation(base, n);
    step("unmapped");
    return 0;
}

static int limit(void) {
    CUdeviceptr bufs[MAX_BUFS];
    CUresult r = CUDA_SUCCESS;
    int k = 0;
    setup();
    while (k < MAX_BUFS && (r = nccl_alloc(&bufs[k])) == CUDA_SUCCESS) k++;
    step("full created %d rc %d", k, (int)r);
    for (int i = 0; i < k; i++) nccl_query(bufs[i]);
    one_more("over");
    nccl_free_range(bufs, 0, k);
    one_more("after");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = argc >= 3 ? atoi(argv[2]) : 0;
    if (n < 0 || n > MAX_BUFS) n = 0;
    if (argc >= 3 && !strcmp(argv[1], "nccl") && n > 0) return nccl(n);
    if (argc >= 3 && !strcmp(argv[1], "expandable") && n > 0) return expandable(n);
    if (argc >= 3 && !strcmp(argv[1], "early") && n > 0) return early(n);
    if (argc >= 2 && !strcmp(argv[1], "limit")) return limit();
    fprintf(stderr, "usage: see the comment at the top of hook_vmm.c\n");
    return 2;
}
