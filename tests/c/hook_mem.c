/* Memory-limit scenarios for the hook (libvgpu.so), one subcommand each.
 * Builds against the simulated driver (cc hook_mem.c -l:libcuda.so.1 -ldl)
 * or a real one (cc -DUSE_CUDA_H -I/usr/local/cuda/include hook_mem.c
 * -lcuda -ldl). Functions a driver may lack are resolved with dlsym, so the
 * program always links; a missing one reports rc 500 (CUDA_ERROR_NOT_FOUND).
 *
 * Every subcommand may be preceded by `-d <ordinal>`: the CUDA device it works
 * on (default 0).
 *
 *   hook_mem limit <alloc|pitch|managed|create|async|pool|array|mipmap|graph|ipc> [ipc-handle-hex]
 *       exact-limit scenario: with F free after the context, fill F-S, the
 *       entry point with S bytes must succeed; with one byte more in use it
 *       must return CUDA_ERROR_OUT_OF_MEMORY; after freeing that byte it must
 *       succeed again, and free memory must come back to F. Prints PASS/FAIL.
 *   hook_mem ipc_export <bytes>   allocate, print the IPC handle as hex, wait for stdin EOF
 *   hook_mem stress <seconds>     context, "ready", wait for a stdin line, then
 *                                 random alloc/free; prints "ok <n> oom <m>" and
 *                                 exits at the next stdin line or EOF
 *   hook_mem hold <bytes>         context + allocation, "held", wait for stdin EOF
 *   hook_mem loop                 alloc/free forever (to be killed)
 *   hook_mem fill                 context + allocate everything cuMemGetInfo says is free
 *   hook_mem info                 print cuMemGetInfo and cuDeviceTotalMem
 *   hook_mem module <bytes> [idle]
 *                                 context, load a module (GPU code: the simulator charges it
 *                                 SIMGPU_MODULE_BYTES), then print cuMemGetInfo and the result
 *                                 of allocating <bytes>; with `idle`, print "loaded" after the
 *                                 load and make no CUDA call until a stdin line comes
 *   hook_mem overflow <bytes> <more> [pitch]
 *                                 context, allocate <bytes> ("alloc rc N"; with `pitch`, through
 *                                 cuMemAllocPitch_v2, 1 MiB rows: "pitch N"); on success write
 *                                 through the device pointer (cuMemsetD8 of its first and last
 *                                 MiB, cuMemcpyHtoD of a pattern into its middle) and read back
 *                                 (cuMemcpyDtoH): "readback ok" or "readback bad"; load a module
 *                                 and ask cuMemGetInfo ("module rc N"); "held", wait
 *                                 for a stdin line; allocate <more> ("more rc N", freed at once);
 *                                 free the first ("free rc N"), "freed", wait for stdin EOF
 *   hook_mem ctxdestroy           allocate half the free memory in a second context and
 *                                 destroy that context without freeing: free memory must
 *                                 come back, and a larger allocation must then succeed.
 *                                 Prints PASS/FAIL.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef USE_CUDA_H
#include <cuda.h>
#else
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;
typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    unsigned char reserved[64];
} CUmemPoolProps;
typedef struct {
    CUmemPoolProps poolProps;
    const void *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct {
    size_t Width;
    size_t Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_AD_FORMAT_FLOAT 0x20
#define CU_MEM_ATTACH_GLOBAL 1
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr p);
#endif

#define NOT_FOUND 500
/* Resolves a driver entry point by name (through the hook's exports when
 * it is preloaded, as a directly linked call would). */
static void *fn(const char *name) {
    void *p = dlsym(RTLD_DEFAULT, name);
    if (!p) fprintf(stderr, "driver lacks %s\n", name);
    return p;
}
#define CALL(type, name, ...) \
    (fn(#name) ? ((type)fn(#name))(__VA_ARGS__) : NOT_FOUND)

typedef CUresult (*pitch_t)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*managed_t)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*create_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*release_t)(CUmemGenericAllocationHandle);
typedef CUresult (*gran_t)(size_t *, const CUmemAllocationProp *, int);
typedef CUresult (*async_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*pool_alloc_t)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*free_async_t)(CUdeviceptr, CUstream);
typedef CUresult (*sync_t)(CUstream);
typedef CUresult (*default_pool_t)(CUmemoryPool *, CUdevice);
typedef CUresult (*array_t)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult (*array_destroy_t)(CUarray);
typedef CUresult (*mipmap_t)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
typedef CUresult (*mipmap_destroy_t)(CUmipmappedArray);
typedef CUresult (*graph_create_t)(CUgraph *, unsigned int);
typedef CUresult (*graph_node_t)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *);
typedef CUresult (*graph_destroy_t)(CUgraph);
typedef CUresult (*ipc_get_t)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*ipc_open_t)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*ipc_close_t)(CUdeviceptr);
typedef CUresult (*ctx_create_t)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*ctx_destroy_t)(CUcontext);
typedef CUresult (*ctx_current_t)(CUcontext *);

static CUdevice dev;
static int ordinal = 0;

static int context(void) {
    CUcontext ctx;
    CUresult r;
    if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, ordinal)) ||
        (r = cuDevicePrimaryCtxRetain(&ctx, dev)) || (r = cuCtxSetCurrent(ctx))) {
        printf("context failed: %d\n", (int)r);
        return 1;
    }
    return 0;
}

static size_t free_now(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo_v2(&f, &t);
    return f;
}

/* One object of an entry point: created with S bytes, destroyed. */
struct obj {
    CUdeviceptr p;
    CUmemGenericAllocationHandle h;
    CUarray a;
    CUmipmappedArray m;
    CUgraph g;
};
static CUipcMemHandle ipc_handle;

static size_t size_of(const char *e) {
    if (!strcmp(e, "pitch")) return 4096 * 256;
    if (!strcmp(e, "array")) return 512 * 512 * 4;
    if (!strcmp(e, "mipmap")) return 256 * 256 * 4 + 128 * 128 * 4;
    if (!strcmp(e, "ipc")) return 4 << 20;
    return 2 << 20; /* a multiple of any VMM granularity up to 2 MiB */
}

static CUresult create(const char *e, size_t s, struct obj *o) {
    memset(o, 0, sizeof *o);
    if (!strcmp(e, "alloc")) return cuMemAlloc_v2(&o->p, s);
    if (!strcmp(e, "pitch")) {
        size_t pitch = 0;
        CUresult r = CALL(pitch_t, cuMemAllocPitch_v2, &o->p, &pitch, 4096, 256, 4);
        if (r == CUDA_SUCCESS && pitch != 4096) fprintf(stderr, "pitch %zu\n", pitch);
        return r;
    }
    if (!strcmp(e, "managed")) return CALL(managed_t, cuMemAllocManaged, &o->p, s, CU_MEM_ATTACH_GLOBAL);
    if (!strcmp(e, "create")) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        return CALL(create_t, cuMemCreate, &o->h, s, &prop, 0);
    }
    if (!strcmp(e, "async")) return CALL(async_t, cuMemAllocAsync, &o->p, s, (CUstream)0);
    if (!strcmp(e, "pool")) {
        CUmemoryPool pool;
        CUresult r = CALL(default_pool_t, cuDeviceGetDefaultMemPool, &pool, dev);
        if (r) return r;
        return CALL(pool_alloc_t, cuMemAllocFromPoolAsync, &o->p, s, pool, (CUstream)0);
    }
    if (!strcmp(e, "array")) {
        CUDA_ARRAY_DESCRIPTOR d = {512, 512, CU_AD_FORMAT_FLOAT, 1};
        return CALL(array_t, cuArrayCreate_v2, &o->a, &d);
    }
    if (!strcmp(e, "mipmap")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {256, 256, 0, CU_AD_FORMAT_FLOAT, 1, 0};
        return CALL(mipmap_t, cuMipmappedArrayCreate, &o->m, &d, 2);
    }
    if (!strcmp(e, "graph")) {
        CUgraphNode node;
        CUDA_MEM_ALLOC_NODE_PARAMS prm;
        CUresult r = CALL(graph_create_t, cuGraphCreate, &o->g, 0);
        if (r) return r;
        memset(&prm, 0, sizeof prm);
        prm.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        prm.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prm.poolProps.location.id = dev;
        prm.bytesize = s;
        r = CALL(graph_node_t, cuGraphAddMemAllocNode, &node, o->g, NULL, 0, &prm);
        if (r) {
            CALL(graph_destroy_t, cuGraphDestroy, o->g);
            o->g = 0;
        }
        return r;
    }
    if (!strcmp(e, "ipc")) return CALL(ipc_open_t, cuIpcOpenMemHandle_v2, &o->p, ipc_handle, 1);
    return NOT_FOUND;
}

static void destroy(const char *e, struct obj *o) {
    if (!strcmp(e, "create")) CALL(release_t, cuMemRelease, o->h);
    else if (!strcmp(e, "async") || !strcmp(e, "pool")) {
        CALL(free_async_t, cuMemFreeAsync, o->p, (CUstream)0);
        CALL(sync_t, cuStreamSynchronize, (CUstream)0);
    } else if (!strcmp(e, "array")) CALL(array_destroy_t, cuArrayDestroy, o->a);
    else if (!strcmp(e, "mipmap")) CALL(mipmap_destroy_t, cuMipmappedArrayDestroy, o->m);
    else if (!strcmp(e, "graph")) CALL(graph_destroy_t, cuGraphDestroy, o->g);
    else if (!strcmp(e, "ipc")) CALL(ipc_close_t, cuIpcCloseMemHandle, o->p);
    else cuMemFree_v2(o->p);
}

static int hex_handle(const char *hex) {
    for (int i = 0; i < 64; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return 1;
        ipc_handle.reserved[i] = (char)v;
    }
    return 0;
}

#define EXPECT(cond, ...)                      \
    do {                                       \
        if (!(cond)) {                         \
            printf("FAIL %s: ", e);            \
            printf(__VA_ARGS__);               \
            printf("\n");                      \
            return 1;                          \
        }                                      \
    } while (0)

static int limit(const char *e) {
    struct obj o;
    CUdeviceptr filler, one;
    CUresult r;
    size_t s = size_of(e), f0;
    if (context()) return 1;
    f0 = free_now();
    printf("free after context %zu\n", f0);
    EXPECT(f0 > s, "only %zu free", f0);
    EXPECT(cuMemAlloc_v2(&filler, f0 - s) == CUDA_SUCCESS, "filler of %zu", f0 - s);
    EXPECT(free_now() == s, "free %zu after filler, want %zu", free_now(), s);
    r = create(e, s, &o);
    EXPECT(r == CUDA_SUCCESS, "at exactly the limit: rc %d", (int)r);
    EXPECT(free_now() == 0, "free %zu at the limit", free_now());
    destroy(e, &o);
    EXPECT(free_now() == s, "free %zu after destroy, want %zu", free_now(), s);
    EXPECT(cuMemAlloc_v2(&one, 1) == CUDA_SUCCESS, "one byte");
    r = create(e, s, &o);
    EXPECT(r == CUDA_ERROR_OUT_OF_MEMORY, "one byte over: rc %d, want 2", (int)r);
    EXPECT(free_now() == s - 1, "free %zu after refusal, want %zu", free_now(), s - 1);
    cuMemFree_v2(one);
    r = create(e, s, &o);
    EXPECT(r == CUDA_SUCCESS, "after freeing the byte: rc %d", (int)r);
    destroy(e, &o);
    cuMemFree_v2(filler);
    EXPECT(free_now() == f0, "free %zu at the end, want %zu (leak)", free_now(), f0);
    printf("PASS %s\n", e);
    return 0;
}

static int ipc_export(size_t bytes) {
    CUdeviceptr p;
    CUipcMemHandle h;
    char line[16];
    if (context()) return 1;
    if (cuMemAlloc_v2(&p, bytes) || CALL(ipc_get_t, cuIpcGetMemHandle, &h, p)) {
        printf("export failed\n");
        return 1;
    }
    for (int i = 0; i < 64; i++) printf("%02x", (unsigned char)h.reserved[i]);
    printf("\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
    }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int stress(double seconds) {
    enum { N = 8 };
    CUdeviceptr held[N] = {0};
    long ok = 0, oom = 0;
    char line[16];
    unsigned seed = (unsigned)getpid();
    if (context()) return 1;
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    double end = now_s() + seconds;
    while (now_s() < end) {
        int i = rand_r(&seed) % N;
        if (held[i]) {
            cuMemFree_v2(held[i]);
            held[i] = 0;
        } else {
            size_t sz = ((size_t)(rand_r(&seed) % 64) + 1) << 20;
            CUresult r = cuMemAlloc_v2(&held[i], sz);
            if (r == CUDA_SUCCESS) ok++;
            else if (r == CUDA_ERROR_OUT_OF_MEMORY) { oom++; held[i] = 0; }
            else { printf("alloc rc %d\n", (int)r); return 1; }
        }
    }
    printf("ok %ld oom %ld\n", ok, oom);
    fflush(stdout);
    /* Hold everything until told: the caller decides when exits happen. */
    (void)fgets(line, sizeof line, stdin);
    return 0;
}

/* Allocations die with their context (cuCtxDestroy); the hook must release
 * them, or the container's limit shrinks with every such context. */
static int ctxdestroy(void) {
    CUcontext prim = 0, other = 0;
    CUdeviceptr p = 0, q = 0;
    CUresult r;
    if (context()) return 1;
    if ((r = CALL(ctx_current_t, cuCtxGetCurrent, &prim))) {
        printf("FAIL ctxdestroy: cuCtxGetCurrent rc %d\n", (int)r);
        return 1;
    }
    size_t f0 = free_now();
    if ((r = CALL(ctx_create_t, cuCtxCreate_v2, &other, 0, dev))) {
        printf("FAIL ctxdestroy: cuCtxCreate rc %d\n", (int)r);
        return 1;
    }
    size_t half = f0 / 2;
    if ((r = cuMemAlloc_v2(&p, half))) {
        printf("FAIL ctxdestroy: alloc of %zu in the second context rc %d (free %zu)\n", half, (int)r,
               free_now());
        return 1;
    }
    if ((r = CALL(ctx_destroy_t, cuCtxDestroy_v2, other)) || (r = cuCtxSetCurrent(prim))) {
        printf("FAIL ctxdestroy: destroy rc %d\n", (int)r);
        return 1;
    }
    size_t f1 = free_now();
    size_t big = f0 - f0 / 8;
    r = cuMemAlloc_v2(&q, big);
    if (f1 != f0 || r != CUDA_SUCCESS) {
        printf("FAIL ctxdestroy: free before %zu after %zu; alloc of %zu rc %d\n", f0, f1, big, (int)r);
        return 1;
    }
    cuMemFree_v2(q);
    printf("PASS ctxdestroy free %zu\n", f1);
    return 0;
}

typedef CUresult (*memset8_t)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*htod_t)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_t)(void *, CUdeviceptr, size_t);
typedef CUresult (*modload_t)(void **, const void *);

/* Writes through `p` (n >= 2 MiB) and reads it back: 0 when every byte
 * read is the byte written. */
static int write_read(CUdeviceptr p, size_t n) {
    const size_t w = 1 << 20;
    static unsigned char want[1 << 20], got[1 << 20];
    size_t at[3] = {0, n / 2 - w / 2, n - w};
    for (int i = 0; i < 3; i++) {
        if (i == 1) {
            for (size_t k = 0; k < w; k++) want[k] = (unsigned char)(k * 7 + 3);
            if (CALL(htod_t, cuMemcpyHtoD_v2, p + at[i], want, w)) return 1;
        } else {
            memset(want, 0x5a + i, w);
            if (CALL(memset8_t, cuMemsetD8_v2, p + at[i], 0x5a + i, w)) return 1;
        }
        memset(got, 0, w);
        if (CALL(dtoh_t, cuMemcpyDtoH_v2, got, p + at[i], w)) return 1;
        if (memcmp(want, got, w)) return 1;
    }
    return 0;
}

static int overflow(size_t bytes, size_t more, int pitched) {
    CUdeviceptr p = 0, q = 0;
    char line[16];
    size_t pitch = 0;
    if (context()) return 1;
    CUresult r = pitched ? CALL(pitch_t, cuMemAllocPitch_v2, &p, &pitch, 1 << 20, bytes >> 20, 4)
                         : cuMemAlloc_v2(&p, bytes);
    printf("alloc rc %d\n", (int)r);
    if (pitched) printf("pitch %zu\n", pitch);
    if (r == CUDA_SUCCESS) printf("readback %s\n", write_read(p, bytes) ? "bad" : "ok");
    void *mod = NULL;
    size_t f = 0, t = 0;
    printf("module rc %d\n", (int)CALL(modload_t, cuModuleLoadData, &mod, "// ptx\n"));
    cuMemGetInfo_v2(&f, &t);
    printf("held\n");
    if (!fgets(line, sizeof line, stdin)) return 1;
    r = cuMemAlloc_v2(&q, more);
    printf("more rc %d\n", (int)r);
    if (r == CUDA_SUCCESS) cuMemFree_v2(q);
    if (p) printf("free rc %d\n", (int)cuMemFree_v2(p));
    printf("freed\n");
    while (fgets(line, sizeof line, stdin)) {
    }
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 3 && !strcmp(argv[1], "-d")) {
        ordinal = atoi(argv[2]);
        argv += 2;
        argc -= 2;
    }
    if (argc >= 3 && !strcmp(argv[1], "limit")) {
        if (!strcmp(argv[2], "ipc") && (argc < 4 || hex_handle(argv[3]))) return 2;
        return limit(argv[2]);
    }
    if (argc >= 3 && !strcmp(argv[1], "ipc_export")) return ipc_export(strtoull(argv[2], 0, 0));
    if (argc >= 3 && !strcmp(argv[1], "hold")) {
        CUdeviceptr p;
        char line[16];
        if (context()) return 1;
        CUresult r = cuMemAlloc_v2(&p, strtoull(argv[2], 0, 0));
        printf("held rc %d\n", (int)r);
        while (fgets(line, sizeof line, stdin)) {
        }
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "stress")) return stress(atof(argv[2]));
    if (argc >= 2 && !strcmp(argv[1], "loop")) {
        CUdeviceptr p;
        if (context()) return 1;
        printf("looping\n");
        for (;;) {
            if (cuMemAlloc_v2(&p, 1 << 20) == CUDA_SUCCESS) cuMemFree_v2(p);
        }
    }
    if (argc >= 2 && !strcmp(argv[1], "fill")) {
        CUdeviceptr p;
        double t0 = now_s();
        if (context()) return 1;
        size_t f = free_now();
        CUresult r = cuMemAlloc_v2(&p, f);
        printf("fill %zu rc %d in %.3f s\n", f, (int)r, now_s() - t0);
        return r != CUDA_SUCCESS;
    }
    if (argc >= 2 && !strcmp(argv[1], "ctxdestroy")) return ctxdestroy();
    if (argc >= 4 && !strcmp(argv[1], "overflow"))
        return overflow(strtoull(argv[2], 0, 0), strtoull(argv[3], 0, 0),
                        argc >= 5 && !strcmp(argv[4], "pitch"));
    if (argc >= 3 && !strcmp(argv[1], "module")) {
        typedef CUresult (*load_t)(void **, const void *);
        load_t load = (load_t)fn("cuModuleLoadData");
        void *mod = NULL;
        size_t f = 0, t = 0;
        CUdeviceptr p = 0;
        if (context() || !load) return 1;
        CUresult r0 = load(&mod, "// ptx\n");
        if (argc >= 4 && !strcmp(argv[3], "idle")) {
            char line[16];
            printf("loaded\n");
            if (!fgets(line, sizeof line, stdin)) return 1;
        }
        CUresult r1 = cuMemGetInfo_v2(&f, &t);
        CUresult r2 = cuMemAlloc_v2(&p, strtoull(argv[2], 0, 0));
        printf("module rc %d\nmeminfo total %zu free %zu rc %d\nalloc rc %d\n", (int)r0, t, f, (int)r1,
               (int)r2);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "info")) {
        size_t f = 0, t = 0, tm = 0;
        if (cuInit(0) || cuDeviceGet(&dev, ordinal)) return 1;
        CUresult r1 = cuDeviceTotalMem_v2(&tm, dev);
        if (context()) return 1;
        CUresult r2 = cuMemGetInfo_v2(&f, &t);
        printf("devtotal %zu rc %d\nmeminfo total %zu free %zu rc %d\n", tm, (int)r1, t, f, (int)r2);
        return 0;
    }
    fprintf(stderr, "usage: see the comment at the top of hook_mem.c\n");
    return 2;
}
