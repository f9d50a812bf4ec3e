//! THE list of CUDA and NVML entry points vgpu knows ([`entry_points!`]).
//! Every fact about an entry point comes from its one row:
//!
//! - the hook (`libvgpu.so`): the exported `extern "C"` wrapper and the policy
//!   function it routes to, and the typed pointer to the real function
//!   (`hook/src/exports`, `hook/src/real`);
//! - `cuGetProcAddress`: which `PFN_<base>_v<version>` of `cudaTypedefs.h`
//!   binds to the symbol, and whether it is the per-thread-default-stream
//!   (`_ptsz`) variant ([`CUDA_VERSIONS`]);
//! - the eBPF observer: the [`Func`](crate::event::Func) id (the uprobe
//!   cookie and the `func` field of every record), the symbol probed and
//!   named in traces, the class the programs and the loader aggregate by,
//!   and which argument is the call's device (its `CUdevice` argument).
//!
//! Adding an entry point is one row (plus, for a hook, its policy function).

/// Calls `$gen! { … }` with the list. Row grammar, by section:
///
/// - `cuda_hooks`: `fn <symbol>(<args>) -> CUresult => <policy path in the
///   hook>, cuda(<base> @ <first CUDA version>[, ptsz])[, trace(<Func
///   variant> = <id>, <FuncClass>)];` — exported by the hook, which routes
///   it to the policy function: first the call that forwards it to the real
///   driver (`forward: impl FnOnce() -> CUresult`, built by the export),
///   then the same arguments; same return type. Symbols of one signature
///   whose policy is the same (a `_ptsz` twin) may route to one function.
///   `cuda(…)`
///   names the `cudaTypedefs.h` typedef `PFN_<base>_v<version>[_ptsz]` that
///   binds to the symbol. `trace(…)` makes it an eBPF-probed [`Func`]; ids
///   are the kernel/user wire contract: never change or reuse one
///   (allocation and free 1..=31, launches 32..=63, context 64..=79). The
///   first argument typed `CUdevice` of a traced row is the device its
///   probe records ([`Func::device_arg`](crate::event::Func::device_arg)).
/// - `cuda_older`: `<symbol> @ <version>;` older ABI versions of hooked base
///   names (`cuMemAlloc` before `cuMemAlloc_v2`). Never hooked: such a call
///   is forwarded untouched. Listed so `cuGetProcAddress` resolves exactly
///   the symbol a request binds to.
/// - `cuda_real`, `nvml_real`: `fn <symbol>(<args>) -> <ret>;` loaded from
///   the real library for the hook's own use, never exported.
/// - `nvml_hooks`: `fn <symbol>(<args>) -> nvmlReturn_t => <policy path>;`
///   routed as for CUDA, the forwarding call first.
///
/// Types are the hook's C types (`hook/src/ffi.rs`); they are only resolved
/// where a generator uses them.
///
/// [`Func`]: crate::event::Func
#[macro_export]
macro_rules! entry_points {
    ($gen:ident) => {
        $gen! {
            cuda_hooks {
                fn cuInit(flags: c_uint) -> CUresult => memory::context::init, cuda(cuInit @ 2000), trace(Init = 64, Context);
                fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) -> CUresult => procaddr::get_proc_address_v1, cuda(cuGetProcAddress @ 11030);
                fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, status: *mut CUdriverProcAddressQueryResult) -> CUresult => procaddr::get_proc_address_v2, cuda(cuGetProcAddress @ 12000);

                fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult => memory::alloc::mem_alloc, cuda(cuMemAlloc @ 3020), trace(MemAlloc = 1, Alloc);
                fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) -> CUresult => memory::alloc::mem_alloc_pitch, cuda(cuMemAllocPitch @ 3020), trace(MemAllocPitch = 2, Alloc);
                fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult => memory::alloc::mem_alloc_managed, cuda(cuMemAllocManaged @ 6000), trace(MemAllocManaged = 3, Alloc);
                fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult => memory::alloc::mem_free, cuda(cuMemFree @ 3020), trace(MemFree = 4, Free);

                fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult => memory::async_pool::alloc_async, cuda(cuMemAllocAsync @ 11020), trace(MemAllocAsync = 5, Alloc);
                fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult => memory::async_pool::alloc_async, cuda(cuMemAllocAsync @ 11020, ptsz), trace(MemAllocAsyncPtsz = 6, Alloc);
                fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult => memory::async_pool::alloc_from_pool, cuda(cuMemAllocFromPoolAsync @ 11020), trace(MemAllocFromPoolAsync = 7, Alloc);
                fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult => memory::async_pool::alloc_from_pool, cuda(cuMemAllocFromPoolAsync @ 11020, ptsz), trace(MemAllocFromPoolAsyncPtsz = 8, Alloc);
                fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult => memory::async_pool::free_async, cuda(cuMemFreeAsync @ 11020), trace(MemFreeAsync = 9, Free);
                fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult => memory::async_pool::free_async, cuda(cuMemFreeAsync @ 11020, ptsz), trace(MemFreeAsyncPtsz = 10, Free);

                fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult => memory::vmm::mem_create, cuda(cuMemCreate @ 10020), trace(MemCreate = 11, Alloc);
                fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult => memory::vmm::mem_release, cuda(cuMemRelease @ 10020), trace(MemRelease = 12, Free);
                fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> CUresult => memory::vmm::mem_retain, cuda(cuMemRetainAllocationHandle @ 11000);
                fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult => memory::vmm::mem_map, cuda(cuMemMap @ 10020);
                fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult => memory::vmm::mem_unmap, cuda(cuMemUnmap @ 10020);

                fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult => memory::array::array_create, cuda(cuArrayCreate @ 3020);
                fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult => memory::array::array3d_create, cuda(cuArray3DCreate @ 3020);
                fn cuArrayDestroy(array: CUarray) -> CUresult => memory::array::array_destroy, cuda(cuArrayDestroy @ 2000);
                fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> CUresult => memory::array::mipmapped_create, cuda(cuMipmappedArrayCreate @ 5000);
                fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult => memory::array::mipmapped_destroy, cuda(cuMipmappedArrayDestroy @ 5000);

                fn cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult => memory::graph::add_mem_alloc_node, cuda(cuGraphAddMemAllocNode @ 11040);
                fn cuGraphDestroy(graph: CUgraph) -> CUresult => memory::graph::graph_destroy, cuda(cuGraphDestroy @ 10000);

                fn cuIpcOpenMemHandle_v2(dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CUresult => memory::ipc::open, cuda(cuIpcOpenMemHandle @ 11000);
                fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult => memory::ipc::close, cuda(cuIpcCloseMemHandle @ 4010);

                fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult => memory::context::primary_retain, cuda(cuDevicePrimaryCtxRetain @ 7000), trace(DevicePrimaryCtxRetain = 68, Context);
                fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult => memory::context::primary_release, cuda(cuDevicePrimaryCtxRelease @ 7000);
                fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult => memory::context::primary_release, cuda(cuDevicePrimaryCtxRelease @ 11000);
                fn cuCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult => memory::context::ctx_create_v2, cuda(cuCtxCreate @ 3020), trace(CtxCreate = 65, Context);
                fn cuCtxCreate_v3(ctx: *mut CUcontext, params: *mut c_void, nparams: c_int, flags: c_uint, dev: CUdevice) -> CUresult => memory::context::ctx_create_v3, cuda(cuCtxCreate @ 11040), trace(CtxCreateV3 = 66, Context);
                fn cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) -> CUresult => memory::context::ctx_create_v4, cuda(cuCtxCreate @ 12050), trace(CtxCreateV4 = 67, Context);
                fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult => memory::context::ctx_destroy, cuda(cuCtxDestroy @ 4000);
                fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult => memory::context::primary_reset, cuda(cuDevicePrimaryCtxReset @ 7000);
                fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult => memory::context::primary_reset, cuda(cuDevicePrimaryCtxReset @ 11000);

                fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult => memory::info::mem_get_info, cuda(cuMemGetInfo @ 3020);
                fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult => memory::info::device_total_mem, cuda(cuDeviceTotalMem @ 3020);

                fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult => launch::launch_kernel, cuda(cuLaunchKernel @ 4000), trace(LaunchKernel = 32, Launch);
                fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult => launch::launch_kernel_ptsz, cuda(cuLaunchKernel @ 4000, ptsz), trace(LaunchKernelPtsz = 33, Launch);
                fn cuLaunchKernelEx(config: *const c_void, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult => launch::launch_kernel_ex, cuda(cuLaunchKernelEx @ 11060), trace(LaunchKernelEx = 34, Launch);
                fn cuLaunchKernelEx_ptsz(config: *const c_void, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult => launch::launch_kernel_ex_ptsz, cuda(cuLaunchKernelEx @ 11060, ptsz), trace(LaunchKernelExPtsz = 35, Launch);
                fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult => launch::launch_cooperative, cuda(cuLaunchCooperativeKernel @ 9000), trace(LaunchCooperativeKernel = 36, Launch);
                fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult => launch::launch_cooperative_ptsz, cuda(cuLaunchCooperativeKernel @ 9000, ptsz), trace(LaunchCooperativeKernelPtsz = 37, Launch);
                fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult => launch::graph_launch, cuda(cuGraphLaunch @ 10000), trace(GraphLaunch = 38, GraphLaunch);
                fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult => launch::graph_launch_ptsz, cuda(cuGraphLaunch @ 10000, ptsz), trace(GraphLaunchPtsz = 39, GraphLaunch);
            }
            cuda_older {
                cuMemAlloc @ 2000;
                cuMemAllocPitch @ 2000;
                cuMemFree @ 2000;
                cuMemGetInfo @ 2000;
                cuDeviceTotalMem @ 2000;
                cuArrayCreate @ 2000;
                cuArray3DCreate @ 2000;
                cuIpcOpenMemHandle @ 4010;
                cuCtxCreate @ 2000;
                cuCtxDestroy @ 2000;
            }
            cuda_real {
                fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult;
                fn cuDeviceGetCount(count: *mut c_int) -> CUresult;
                fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult;
                fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
                fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, dptr: CUdeviceptr) -> CUresult;
                fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult;
                fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult;
                fn cuEventDestroy_v2(event: CUevent) -> CUresult;
                fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult;
                fn cuEventQuery(event: CUevent) -> CUresult;
                fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) -> CUresult;
                fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult;
                fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult;
                fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult;
                fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> CUresult;
                fn cuMemHostGetDevicePointer_v2(dptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) -> CUresult;
                fn cuMemFreeHost(p: *mut c_void) -> CUresult;
            }
            nvml_hooks {
                fn nvmlInit() -> nvmlReturn_t => nvml::init_v1;
                fn nvmlInit_v2() -> nvmlReturn_t => nvml::init_v2;
                fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t => nvml::init_with_flags;
                fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t => nvml::memory_info;
                fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t => nvml::memory_info_v2;
            }
            nvml_real {
                fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t;
                fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t;
                fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) -> nvmlReturn_t;
                fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> nvmlReturn_t;
                fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t;
                fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t;
                fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t;
                fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, samples: *mut nvmlProcessUtilizationSample_t, count: *mut c_uint, last_seen: u64) -> nvmlReturn_t;
                fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization: *mut nvmlUtilization_t) -> nvmlReturn_t;
                fn nvmlDeviceGetSamples(device: nvmlDevice_t, kind: c_uint, last_seen: u64, val_type: *mut c_uint, count: *mut c_uint, samples: *mut nvmlSample_t) -> nvmlReturn_t;
            }
        }
    };
}

/// One CUDA symbol as `cuGetProcAddress` knows it: the `cudaTypedefs.h`
/// typedef `PFN_<base>_v<since>[_ptsz]` binds to `symbol`.
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaVersion {
    /// The exported symbol (`cuMemAlloc_v2`).
    pub symbol: &'static str,
    /// The name callers ask `cuGetProcAddress` for (`cuMemAlloc`).
    pub base: &'static str,
    /// First CUDA version (`major * 1000 + minor * 10`) whose headers bind
    /// `base` to `symbol`.
    pub since: i32,
    /// The per-thread-default-stream variant, bound when the caller passes
    /// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
    pub per_thread: bool,
    /// Exported by the hook (`false`: an older ABI version, forwarded untouched).
    pub hooked: bool,
}

/// `cuda(… , ptsz)`: the per-thread-default-stream variant.
#[cfg(feature = "std")]
macro_rules! ptsz {
    () => {
        false
    };
    (ptsz) => {
        true
    };
}

#[cfg(feature = "std")]
macro_rules! gen_cuda_versions {
    (
        cuda_hooks { $(fn $n:ident($($a:ident: $t:ty),*) -> $r:ty => $($p:ident)::+, cuda($base:ident @ $since:literal $(, $pt:ident)?) $(, trace($v:ident = $id:literal, $class:ident))?;)* }
        cuda_older { $($on:ident @ $os:literal;)* }
        cuda_real { $($cr:tt)* }
        nvml_hooks { $($nh:tt)* }
        nvml_real { $($nr:tt)* }
    ) => {
        /// Every CUDA symbol a `cuGetProcAddress` request for a hooked base
        /// name can bind to.
        pub const CUDA_VERSIONS: &[CudaVersion] = &[
            $(CudaVersion {
                symbol: stringify!($n),
                base: stringify!($base),
                since: $since,
                per_thread: ptsz!($($pt)?),
                hooked: true,
            },)*
            $(CudaVersion {
                symbol: stringify!($on),
                base: stringify!($on),
                since: $os,
                per_thread: false,
                hooked: false,
            },)*
        ];
    };
}

#[cfg(feature = "std")]
crate::entry_points!(gen_cuda_versions);

/// The symbol a `cuGetProcAddress(name, cuda_version, flags)` request binds
/// to, when `name` is a base name in [`CUDA_VERSIONS`]: the newest version
/// not newer than `cuda_version`, or its `_ptsz` variant when
/// `per_thread_stream` is asked for and exists. `None` for an unknown name
/// or a version older than the first one (the driver answers those itself).
#[cfg(feature = "std")]
pub fn resolve(name: &str, cuda_version: i32, per_thread_stream: bool) -> Option<&'static str> {
    let mut plain: Option<&CudaVersion> = None;
    let mut per_thread: Option<&CudaVersion> = None;
    for v in CUDA_VERSIONS.iter().filter(|v| v.base == name) {
        if v.per_thread {
            per_thread = Some(v);
        } else if v.since <= cuda_version && plain.is_none_or(|p| p.since < v.since) {
            plain = Some(v);
        }
    }
    let plain = plain?;
    match per_thread {
        Some(pt) if per_thread_stream => Some(pt.symbol),
        _ => Some(plain.symbol),
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    #[test]
    fn each_symbol_and_version_is_listed_once() {
        for (i, a) in CUDA_VERSIONS.iter().enumerate() {
            for b in &CUDA_VERSIONS[i + 1..] {
                assert_ne!(a.symbol, b.symbol);
                assert!(
                    !(a.base == b.base && a.since == b.since && a.per_thread == b.per_thread),
                    "{} and {} bind the same typedef",
                    a.symbol,
                    b.symbol
                );
            }
        }
    }

    #[test]
    fn a_per_thread_variant_has_a_plain_one() {
        for pt in CUDA_VERSIONS.iter().filter(|v| v.per_thread) {
            assert!(pt.symbol.ends_with("_ptsz"), "{}", pt.symbol);
            assert!(
                CUDA_VERSIONS
                    .iter()
                    .any(|v| !v.per_thread && v.base == pt.base && v.since <= pt.since),
                "{}",
                pt.symbol
            );
        }
    }
}
