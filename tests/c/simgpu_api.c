/*
 * simgpu_api: exercises the simulated driver's API surface and checks the
 * model's numbers. Linked with -lcuda. Run with SIMGPU_MEMORY=1g,
 * SIMGPU_CONTEXT_BYTES=100m, SIMGPU_SMS=132 (see tests/tests/simgpu_api.rs).
 * Prints "ok" and exits 0 when every check holds; otherwise names the
 * failing check and exits 1.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_min.h"
#define CHECK_OUT stderr
#include "check.h"

#define MiB (1024ull * 1024ull)
#define OK(call) REQUIRE((call) == CUDA_SUCCESS)

static size_t used(void) {
    size_t f, t;
    OK(cuMemGetInfo(&f, &t));
    return t - f;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef unsigned long long (*count_fn)(unsigned);

/* Another thread's global-mode capture, begun and ended between barriers. */
static struct {
    CUcontext ctx;
    CUstream st;
    pthread_barrier_t bar;
    CUresult begin, end;
} other;

static void *other_capture(void *arg) {
    CUgraph g;
    (void)arg;
    other.begin = cuCtxSetCurrent(other.ctx);
    if (other.begin == CUDA_SUCCESS) other.begin = cuStreamBeginCapture(other.st, CU_STREAM_CAPTURE_MODE_GLOBAL);
    pthread_barrier_wait(&other.bar);
    pthread_barrier_wait(&other.bar);
    other.end = cuStreamEndCapture(other.st, &g);
    return NULL;
}

int main(void) {
    CUdevice dev;
    CUcontext ctx, ctx2, cur;
    int v;
    char name[64];
    const char *s;

    REQUIRE(cuDeviceGetCount(&v) == CUDA_ERROR_NOT_INITIALIZED);
    OK(cuDriverGetVersion(&v));
    REQUIRE(v == 13000);
    OK(cuInit(0));
    OK(cuDeviceGetCount(&v));
    REQUIRE(v == 1);
    OK(cuDeviceGet(&dev, 0));
    REQUIRE(cuDeviceGet(&dev, 1) == CUDA_ERROR_INVALID_DEVICE);
    OK(cuDeviceGetName(name, sizeof name, dev));
    REQUIRE(strstr(name, "SimGPU") != NULL);
    OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    REQUIRE(v == 132);
    OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev));
    REQUIRE(v == 2048);
    OK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
    REQUIRE(strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
    OK(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s));
    REQUIRE(cuGetErrorString(12345, &s) == CUDA_ERROR_INVALID_VALUE);

    /* Contexts: each costs 100 MiB. */
    REQUIRE(cuMemGetInfo_v2(NULL, NULL) == CUDA_ERROR_INVALID_CONTEXT);
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
    REQUIRE(used() == 100 * MiB);
    OK(cuCtxCreate(&ctx2, 0, dev));
    OK(cuCtxGetCurrent(&cur));
    REQUIRE(cur == ctx2);
    REQUIRE(used() == 200 * MiB);
    OK(cuCtxPopCurrent(&cur));
    REQUIRE(cur == ctx2);
    OK(cuCtxDestroy(ctx2));
    REQUIRE(used() == 100 * MiB);
    OK(cuCtxGetCurrent(&cur));
    REQUIRE(cur == ctx);

    /* Plain, pitch, managed allocations and frees. */
    CUdeviceptr a, b, m;
    size_t pitch;
    OK(cuMemAlloc(&a, 10 * MiB));
    REQUIRE(used() == 110 * MiB);
    OK(cuMemAllocPitch(&b, &pitch, 1000, 100, 4));
    REQUIRE(pitch == 1024);
    REQUIRE(used() == 110 * MiB + 1024 * 100);
    OK(cuMemFree(b));
    OK(cuMemAllocManaged(&m, 4 * MiB, CU_MEM_ATTACH_GLOBAL));
    memset((void *)(uintptr_t)m, 7, 4 * MiB); /* managed memory is real */
    REQUIRE(used() == 114 * MiB);
    OK(cuMemFree(m));
    REQUIRE(cuMemFree(12345) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(cuMemFree(b) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(cuMemAlloc(&b, 2000 * MiB) == CUDA_ERROR_OUT_OF_MEMORY);
    REQUIRE(used() == 110 * MiB);
    OK(cuMemcpyHtoD(a, name, 8));
    OK(cuMemcpyDtoH(name, a, 8));
    REQUIRE(cuMemcpyHtoD(a, NULL, 8) == CUDA_ERROR_INVALID_VALUE);
    OK(cuMemsetD8(a, 0, 16));
    size_t sz;
    CUdeviceptr base;
    OK(cuMemGetAddressRange(&base, &sz, a + 100));
    REQUIRE(base == a && sz == 10 * MiB);

    /* Host memory costs no device memory and is real. */
    void *h;
    OK(cuMemAllocHost(&h, 1 * MiB));
    memset(h, 1, 1 * MiB);
    OK(cuMemFreeHost(h));
    REQUIRE(cuMemFreeHost(h) == CUDA_ERROR_INVALID_VALUE);
    static char reg[8192];
    OK(cuMemHostRegister(reg, sizeof reg, 0));
    REQUIRE(cuMemHostRegister(reg, sizeof reg, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    OK(cuMemHostUnregister(reg));
    REQUIRE(used() == 110 * MiB);

    /* VMM: charged from cuMemCreate until released and unmapped. */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran;
    OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    REQUIRE(gran == 2 * MiB);
    CUmemGenericAllocationHandle mh;
    REQUIRE(cuMemCreate(&mh, 3 * MiB, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
    OK(cuMemCreate(&mh, 8 * MiB, &prop, 0));
    REQUIRE(used() == 118 * MiB);
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
    OK(cuMemMap(va, 8 * MiB, 0, mh, 0));
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    OK(cuMemSetAccess(va, 8 * MiB, &acc, 1));
    /* A retain (any address in the mapping) returns the handle with one
     * more reference; the memory stays until the last release and unmap. */
    CUmemGenericAllocationHandle rh = 0;
    OK(cuMemRetainAllocationHandle(&rh, (void *)(va + 4 * MiB)));
    REQUIRE(rh == mh);
    REQUIRE(cuMemRetainAllocationHandle(&rh, (void *)(va + 8 * MiB)) == CUDA_ERROR_INVALID_VALUE);
    CUmemAllocationProp got;
    memset(&got, 0xff, sizeof got);
    OK(cuMemGetAllocationPropertiesFromHandle(&got, mh));
    REQUIRE(got.type == CU_MEM_ALLOCATION_TYPE_PINNED && got.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
          got.location.id == dev && got.win32HandleMetaData == NULL);
    OK(cuMemRelease(rh));
    REQUIRE(used() == 118 * MiB); /* the creation's reference is left */
    OK(cuMemRelease(mh));
    REQUIRE(used() == 118 * MiB); /* still mapped */
    REQUIRE(cuMemRelease(mh) == CUDA_ERROR_INVALID_VALUE); /* no reference left */
    OK(cuMemUnmap(va, 8 * MiB));
    REQUIRE(used() == 110 * MiB);
    OK(cuMemAddressFree(va, 8 * MiB));
    /* One unmap over several mappings; one that cuts a mapping is refused. */
    CUmemGenericAllocationHandle ha, hb;
    OK(cuMemCreate(&ha, 2 * MiB, &prop, 0));
    OK(cuMemCreate(&hb, 2 * MiB, &prop, 0));
    OK(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0));
    OK(cuMemMap(va, 2 * MiB, 0, ha, 0));
    OK(cuMemMap(va + 2 * MiB, 2 * MiB, 0, hb, 0));
    OK(cuMemRelease(ha));
    OK(cuMemRelease(hb));
    REQUIRE(used() == 114 * MiB);
    REQUIRE(cuMemUnmap(va, 3 * MiB) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(cuMemUnmap(va + 1 * MiB, 1 * MiB) == CUDA_ERROR_INVALID_VALUE);
    OK(cuMemUnmap(va, 4 * MiB));
    REQUIRE(used() == 110 * MiB);
    OK(cuMemAddressFree(va, 4 * MiB));
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    OK(cuMemCreate(&mh, 2 * MiB, &prop, 0));
    REQUIRE(used() == 110 * MiB); /* host location: no device memory */
    OK(cuMemRelease(mh));

    /* Arrays: exact bytes, summed over mip levels. */
    CUarray arr;
    CUDA_ARRAY_DESCRIPTOR ad = {1000, 100, CU_AD_FORMAT_FLOAT, 4};
    OK(cuArrayCreate(&arr, &ad));
    REQUIRE(used() == 110 * MiB + 1000 * 100 * 16);
    OK(cuArrayDestroy(arr));
    CUDA_ARRAY3D_DESCRIPTOR a3 = {64, 64, 4, CU_AD_FORMAT_UNSIGNED_INT8, 2, 0};
    OK(cuArray3DCreate(&arr, &a3));
    REQUIRE(used() == 110 * MiB + 64 * 64 * 4 * 2);
    OK(cuArrayDestroy(arr));
    CUmipmappedArray mip;
    CUDA_ARRAY3D_DESCRIPTOR md = {64, 32, 0, CU_AD_FORMAT_HALF, 1, 0};
    OK(cuMipmappedArrayCreate(&mip, &md, 3));
    REQUIRE(used() == 110 * MiB + (64 * 32 + 32 * 16 + 16 * 8) * 2);
    OK(cuMipmappedArrayDestroy(mip));
    REQUIRE(used() == 110 * MiB);

    /* IPC import costs nothing. */
    CUipcMemHandle ih;
    CUdeviceptr imp;
    OK(cuIpcGetMemHandle(&ih, a));
    OK(cuIpcOpenMemHandle(&imp, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    REQUIRE(imp != 0 && imp != a);
    REQUIRE(used() == 110 * MiB);
    OK(cuIpcCloseMemHandle(imp));
    REQUIRE(cuIpcCloseMemHandle(imp) == CUDA_ERROR_INVALID_VALUE);

    /* Pools: reserved grows in 2 MiB steps, released at synchronize. */
    CUstream st;
    CUmemoryPool pool, dpool;
    cuuint64_t val;
    OK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    OK(cuDeviceGetDefaultMemPool(&dpool, dev));
    OK(cuDeviceGetMemPool(&pool, dev));
    REQUIRE(pool == dpool);
    CUdeviceptr p1, p2;
    OK(cuMemAllocAsync(&p1, 3 * MiB, st));
    REQUIRE(used() == 114 * MiB);
    OK(cuMemPoolGetAttribute(dpool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &val));
    REQUIRE(val == 3 * MiB);
    OK(cuMemPoolGetAttribute(dpool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &val));
    REQUIRE(val == 4 * MiB);
    OK(cuMemFreeAsync(p1, st));
    REQUIRE(used() == 114 * MiB); /* held until a synchronization */
    OK(cuStreamSynchronize(st));
    REQUIRE(used() == 110 * MiB);
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = 0;
    OK(cuMemPoolCreate(&pool, &pp));
    val = 64 * MiB;
    OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &val));
    OK(cuMemAllocFromPoolAsync(&p2, 10 * MiB, pool, st));
    REQUIRE(used() == 120 * MiB);
    OK(cuMemFreeAsync(p2, st));
    OK(cuStreamSynchronize(st));
    REQUIRE(used() == 120 * MiB); /* under the release threshold: kept */
    OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &val));
    REQUIRE(val == 10 * MiB);
    OK(cuMemPoolTrimTo(pool, 0));
    REQUIRE(used() == 110 * MiB);
    OK(cuDeviceSetMemPool(dev, pool));
    OK(cuMemAllocAsync(&p1, 1 * MiB, st));
    OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &val));
    REQUIRE(val == 1 * MiB);
    OK(cuMemFreeAsync(p1, st));
    OK(cuDeviceSetMemPool(dev, dpool));
    OK(cuMemPoolDestroy(pool));
    REQUIRE(cuMemPoolDestroy(dpool) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(used() == 110 * MiB);

    /* Launch entry points: counts and durations. */
    count_fn launches = (count_fn)dlsym(RTLD_DEFAULT, "simgpu_launch_count");
    REQUIRE(launches != NULL);
    CUmodule mod;
    CUfunction busy, geo;
    OK(cuModuleLoadData(&mod, "anything"));
    OK(cuModuleGetFunction(&busy, mod, "busy_2ms"));
    OK(cuModuleGetFunction(&geo, mod, "matmul"));
    unsigned long long n0 = launches(0);
    double t0 = now_ms();
    OK(cuLaunchKernel(busy, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    OK(cuLaunchKernel_ptsz(busy, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CUlaunchConfig lc;
    memset(&lc, 0, sizeof lc);
    lc.gridDimX = lc.gridDimY = lc.gridDimZ = 1;
    lc.blockDimX = 32;
    lc.blockDimY = lc.blockDimZ = 1;
    lc.hStream = st;
    OK(cuLaunchKernelEx(&lc, busy, NULL, NULL));
    OK(cuLaunchKernelEx_ptsz(&lc, busy, NULL, NULL));
    OK(cuLaunchCooperativeKernel(busy, 1, 1, 1, 32, 1, 1, 0, st, NULL));
    OK(cuLaunchCooperativeKernel_ptsz(busy, 1, 1, 1, 32, 1, 1, 0, NULL, NULL));
    REQUIRE(now_ms() - t0 < 2.0); /* launches are asynchronous */
    REQUIRE(cuStreamQuery(st) == CUDA_ERROR_NOT_READY);
    OK(cuCtxSynchronize());
    double dt = now_ms() - t0;
    REQUIRE(dt >= 12.0 && dt < 30.0); /* 6 x 2 ms, one at a time */
    REQUIRE(launches(0) - n0 == 6);
    REQUIRE(cuLaunchCooperativeKernel(busy, 100000, 1, 1, 1024, 1, 1, 0, st, NULL) ==
          CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    REQUIRE(cuLaunchKernel(busy, 0, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(cuLaunchKernel((CUfunction)0x1234, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) ==
          CUDA_ERROR_INVALID_HANDLE);

    /* Geometry model: 2112 blocks of 256 threads on 132 SMs = 2 waves of 5 us. */
    CUevent e0, e1;
    float ms;
    OK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    OK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    CUfunction lead;
    OK(cuModuleGetFunction(&lead, mod, "busy_20ms"));
    OK(cuLaunchKernel(lead, 1, 1, 1, 1, 1, 1, 0, st, NULL, NULL)); /* queue behind it: exact timings */
    OK(cuEventRecord(e0, st));
    for (int i = 0; i < 100; i++) OK(cuLaunchKernel(geo, 2112, 1, 1, 256, 1, 1, 0, st, NULL, NULL));
    OK(cuEventRecord(e1, st));
    OK(cuEventSynchronize(e1));
    OK(cuEventQuery(e1));
    OK(cuEventElapsedTime(&ms, e0, e1));
    REQUIRE(ms > 0.999f && ms < 1.001f); /* 100 x 10 us */

    /* Library / kernel handles work as functions. */
    CUlibrary lib;
    CUkernel k;
    CUfunction kf;
    OK(cuLibraryLoadData(&lib, "image", NULL, NULL, 0, NULL, NULL, 0));
    OK(cuLibraryGetKernel(&k, lib, "busy_100us"));
    OK(cuKernelGetFunction(&kf, k));
    OK(cuLaunchKernel(kf, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    OK(cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    OK(cuCtxSynchronize());
    OK(cuLibraryUnload(lib));

    /* Graphs: kernel nodes back to back; memory nodes charged at first launch. */
    CUgraph g;
    CUgraphNode kn[3], an, fn;
    CUgraphExec ge;
    OK(cuGraphCreate(&g, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS anp;
    memset(&anp, 0, sizeof anp);
    anp.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    anp.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    anp.poolProps.location.id = 0;
    anp.bytesize = 32 * MiB;
    OK(cuGraphAddMemAllocNode(&an, g, NULL, 0, &anp));
    REQUIRE(anp.dptr != 0);
    CUDA_KERNEL_NODE_PARAMS kp;
    memset(&kp, 0, sizeof kp);
    kp.func = busy;
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
    for (int i = 0; i < 3; i++) OK(cuGraphAddKernelNode(&kn[i], g, i ? &kn[i - 1] : &an, 1, &kp));
    OK(cuGraphAddMemFreeNode(&fn, g, &kn[2], 1, anp.dptr));
    OK(cuGraphInstantiateWithFlags(&ge, g, 0));
    REQUIRE(used() == 110 * MiB); /* not yet */
    n0 = launches(0);
    t0 = now_ms();
    OK(cuGraphLaunch(ge, st));
    REQUIRE(used() == 142 * MiB);
    OK(cuGraphLaunch_ptsz(ge, NULL));
    OK(cuStreamSynchronize_ptsz(NULL));
    dt = now_ms() - t0;
    REQUIRE(dt >= 12.0 && dt < 30.0); /* 2 launches x 3 nodes x 2 ms */
    REQUIRE(launches(0) - n0 == 6);
    REQUIRE(used() == 142 * MiB); /* kept between launches */
    OK(cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &val));
    REQUIRE(val == 32 * MiB);
    OK(cuDeviceGraphMemTrim(dev));
    REQUIRE(used() == 110 * MiB);
    OK(cuGraphLaunch(ge, st));
    REQUIRE(used() == 142 * MiB);
    OK(cuStreamSynchronize(st));
    OK(cuGraphExecDestroy(ge));
    REQUIRE(used() == 110 * MiB);
    OK(cuGraphDestroy(g));

    /* Stream capture: launches become kernel nodes of the returned graph. */
    CUstreamCaptureStatus cs;
    CUstreamCaptureMode cm;
    CUgraph cg;
    REQUIRE(cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    OK(cuStreamIsCapturing(st, &cs));
    REQUIRE(cs == CU_STREAM_CAPTURE_STATUS_NONE);
    n0 = launches(0);
    OK(cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_GLOBAL));
    REQUIRE(cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_ILLEGAL_STATE);
    OK(cuStreamIsCapturing(st, &cs));
    REQUIRE(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    OK(cuLaunchKernel(busy, 1, 1, 1, 1, 1, 1, 0, st, NULL, NULL));
    OK(cuEventRecord(e0, st)); /* captured */
    cm = CU_STREAM_CAPTURE_MODE_RELAXED;
    OK(cuThreadExchangeStreamCaptureMode(&cm));
    REQUIRE(cm == CU_STREAM_CAPTURE_MODE_GLOBAL);
    OK(cuCtxSynchronize()); /* relaxed: allowed */
    REQUIRE(cuStreamQuery(st) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); /* never the capturing stream */
    OK(cuThreadExchangeStreamCaptureMode(&cm));
    REQUIRE(cm == CU_STREAM_CAPTURE_MODE_RELAXED);
    OK(cuStreamIsCapturing(st, &cs));
    REQUIRE(cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    cg = (CUgraph)1;
    REQUIRE(cuStreamEndCapture(st, &cg) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && cg == NULL);
    REQUIRE(cuStreamEndCapture(st, &cg) == CUDA_ERROR_ILLEGAL_STATE);
    REQUIRE(cuEventQuery(e0) == CUDA_ERROR_CAPTURED_EVENT);
    OK(cuEventRecord(e0, st)); /* a normal record clears it */
    OK(cuEventSynchronize(e0));
    REQUIRE(launches(0) == n0); /* nothing ran */

    OK(cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    OK(cuLaunchKernel(busy, 1, 1, 1, 1, 1, 1, 0, st, NULL, NULL));
    OK(cuLaunchKernel_ptsz(busy, 1, 1, 1, 1, 1, 1, 0, st, NULL, NULL));
    OK(cuStreamEndCapture(st, &cg));
    OK(cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cuGraphInstantiateWithFlags(&ge, cg, 0));
    OK(cuGraphLaunch(ge, st)); /* a graph launched into a capture adds its kernels */
    OK(cuGraphExecDestroy(ge));
    OK(cuGraphDestroy(cg));
    OK(cuStreamEndCapture(st, &cg));
    REQUIRE(launches(0) == n0);
    OK(cuGraphInstantiateWithFlags(&ge, cg, 0));
    t0 = now_ms();
    OK(cuGraphLaunch(ge, st));
    OK(cuStreamSynchronize(st));
    REQUIRE(now_ms() - t0 >= 4.0 && launches(0) - n0 == 2); /* 2 x busy_2ms */
    OK(cuGraphExecDestroy(ge));
    OK(cuGraphDestroy(cg));

    /* Unsafe calls: a thread in global mode may not wait during its own
     * capture or another thread's global capture. */
    OK(cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    REQUIRE(cuEventSynchronize(e0) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    REQUIRE(cuStreamEndCapture(st, &cg) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    other.ctx = ctx;
    OK(cuStreamCreate(&other.st, CU_STREAM_NON_BLOCKING));
    pthread_t th;
    REQUIRE(pthread_barrier_init(&other.bar, NULL, 2) == 0);
    REQUIRE(pthread_create(&th, NULL, other_capture, NULL) == 0);
    pthread_barrier_wait(&other.bar);
    OK(other.begin);
    cm = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    OK(cuThreadExchangeStreamCaptureMode(&cm));
    OK(cuEventQuery(e0)); /* thread-local mode: other threads' captures do not matter */
    OK(cuThreadExchangeStreamCaptureMode(&cm));
    REQUIRE(cuEventQuery(e0) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    REQUIRE(cuStreamEndCapture(other.st, &cg) == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    pthread_barrier_wait(&other.bar);
    pthread_join(th, NULL);
    REQUIRE(other.end == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    OK(cuEventQuery(e0));
    OK(cuStreamDestroy(other.st));
    pthread_barrier_destroy(&other.bar);

    /* cuGetProcAddress_v2 resolves versions and per-thread variants. */
    void *pfn;
    CUdriverProcAddressQueryResult qr;
    OK(cuGetProcAddress_v2("cuLaunchKernel", &pfn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &qr));
    REQUIRE(qr == CU_GET_PROC_ADDRESS_SUCCESS && pfn == (void *)cuLaunchKernel_ptsz);
    OK(cuGetProcAddress_v2("cuLaunchKernel", &pfn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &qr));
    REQUIRE(pfn == (void *)cuLaunchKernel);
    OK(cuGetProcAddress_v2("cuGraphLaunch", &pfn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &qr));
    REQUIRE(pfn == (void *)cuGraphLaunch_ptsz);
    OK(cuGetProcAddress_v2("cuMemAlloc", &pfn, 12000, 0, &qr));
    REQUIRE(pfn == (void *)cuMemAlloc_v2);
    OK(cuGetProcAddress("cuMemFree", &pfn, 12000, 0));
    REQUIRE(pfn == (void *)cuMemFree_v2);
    REQUIRE(cuGetProcAddress_v2("cuNoSuchFunction", &pfn, 12000, 0, &qr) == CUDA_ERROR_NOT_FOUND);
    REQUIRE(qr == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && pfn == NULL);
    REQUIRE(cuGetProcAddress_v2("cuCtxCreate", &pfn, 3000, 0, &qr) == CUDA_ERROR_NOT_FOUND);
    REQUIRE(qr == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       CUstream, void **, void **);
    OK(cuGetProcAddress_v2("cuLaunchKernel", (void **)&launch, 13000,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &qr));
    n0 = launches(0);
    OK(launch(busy, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    OK(cuStreamSynchronize_ptsz(NULL));
    REQUIRE(launches(0) - n0 == 1);

    OK(cuEventDestroy(e0));
    OK(cuEventDestroy(e1));
    OK(cuStreamDestroy(st));
    OK(cuMemFree(a));
    OK(cuModuleUnload(mod));
    OK(cuDevicePrimaryCtxRelease(dev));
    REQUIRE(cuCtxSynchronize() == CUDA_ERROR_INVALID_CONTEXT);
    printf("ok\n");
    return 0;
}
