//! THE list of hooked functions. Everything else is generated from it: the
//! typed real-function tables (`real::cuda`, `real::nvml`), the exported
//! `extern "C"` wrappers (`exports`), and the name → wrapper lookup used by
//! the exported `dlsym` and by `cuGetProcAddress`.
//!
//! `*_hooks` entries are exported and routed to the named policy function
//! (same arguments, same return type); `*_real` entries are only loaded from
//! the real library, for the hook's own use. Adding a hook is one line here
//! plus the policy function (and, for `cuGetProcAddress`, a row in
//! `procaddr::TABLE` when the base name differs).

macro_rules! hook_list {
    ($gen:ident) => {
        $gen! {
            cuda_hooks {
                fn cuInit(flags: c_uint) -> CUresult => crate::memory::context::init;
                fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) -> CUresult => crate::procaddr::get_proc_address_v1;
                fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, status: *mut CUdriverProcAddressQueryResult) -> CUresult => crate::procaddr::get_proc_address_v2;

                fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult => crate::memory::alloc::mem_alloc;
                fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) -> CUresult => crate::memory::alloc::mem_alloc_pitch;
                fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult => crate::memory::alloc::mem_alloc_managed;
                fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult => crate::memory::alloc::mem_free;

                fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult => crate::memory::vmm::mem_create;
                fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult => crate::memory::vmm::mem_release;

                fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult => crate::memory::async_pool::alloc_async;
                fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult => crate::memory::async_pool::alloc_async_ptsz;
                fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult => crate::memory::async_pool::alloc_from_pool;
                fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult => crate::memory::async_pool::alloc_from_pool_ptsz;
                fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult => crate::memory::async_pool::free_async;
                fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult => crate::memory::async_pool::free_async_ptsz;

                fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult => crate::memory::array::array_create;
                fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult => crate::memory::array::array3d_create;
                fn cuArrayDestroy(array: CUarray) -> CUresult => crate::memory::array::array_destroy;
                fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> CUresult => crate::memory::array::mipmapped_create;
                fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult => crate::memory::array::mipmapped_destroy;

                fn cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult => crate::memory::graph::add_mem_alloc_node;
                fn cuGraphDestroy(graph: CUgraph) -> CUresult => crate::memory::graph::graph_destroy;

                fn cuIpcOpenMemHandle_v2(dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CUresult => crate::memory::ipc::open;
                fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult => crate::memory::ipc::close;

                fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult => crate::memory::context::primary_retain;
                fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult => crate::memory::context::primary_release_v1;
                fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult => crate::memory::context::primary_release_v2;
                fn cuCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult => crate::memory::context::ctx_create_v2;
                fn cuCtxCreate_v3(ctx: *mut CUcontext, params: *mut c_void, nparams: c_int, flags: c_uint, dev: CUdevice) -> CUresult => crate::memory::context::ctx_create_v3;
                fn cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) -> CUresult => crate::memory::context::ctx_create_v4;
                fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult => crate::memory::context::ctx_destroy;
                fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult => crate::memory::context::primary_reset_v1;
                fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult => crate::memory::context::primary_reset_v2;

                fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult => crate::memory::info::mem_get_info;
                fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult => crate::memory::info::device_total_mem;

                fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult => crate::launch::launch_kernel;
                fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult => crate::launch::launch_kernel_ptsz;
                fn cuLaunchKernelEx(config: *const c_void, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult => crate::launch::launch_kernel_ex;
                fn cuLaunchKernelEx_ptsz(config: *const c_void, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult => crate::launch::launch_kernel_ex_ptsz;
                fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult => crate::launch::launch_cooperative;
                fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult => crate::launch::launch_cooperative_ptsz;
                fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult => crate::launch::graph_launch;
                fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult => crate::launch::graph_launch_ptsz;
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
            }
            nvml_hooks {
                fn nvmlInit() -> nvmlReturn_t => crate::nvml::init_v1;
                fn nvmlInit_v2() -> nvmlReturn_t => crate::nvml::init_v2;
                fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t => crate::nvml::init_with_flags;
                fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t => crate::nvml::memory_info;
                fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t => crate::nvml::memory_info_v2;
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
