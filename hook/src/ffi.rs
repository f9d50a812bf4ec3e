//! CUDA driver and NVML C types and constants the hook needs, hand-written
//! from the public API (cuda.h / nvml.h facts: enum values, struct layouts).
//! Only what the policy code reads is spelled out; opaque handles are
//! `*mut c_void`.

#![expect(non_camel_case_types, reason = "C type names as in cuda.h / nvml.h")]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type CUdriverProcAddressQueryResult = c_int;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;

/// `CUipcMemHandle`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcMemHandle {
    pub reserved: [c_char; 64],
}

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub type_: c_uint,
    pub id: c_int,
}

/// `CUmemAllocationProp` (v1): only the leading fields are read.
#[repr(C)]
pub struct CUmemAllocationProp {
    pub type_: c_uint,
    pub requested_handle_types: c_uint,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

/// `CUmemPoolProps` (v1), 88 bytes.
#[repr(C)]
pub struct CUmemPoolProps {
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location: CUmemLocation,
    pub win32_security_attributes: *mut c_void,
    pub reserved: [u8; 64],
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1).
#[repr(C)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub pool_props: CUmemPoolProps,
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// `CUDA_ARRAY_DESCRIPTOR` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<CUmemPoolProps>() == 88);
    assert!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize) == 104);
    assert!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, dptr) == 112);
    assert!(size_of::<CUmemAllocationProp>() == 32);
    assert!(offset_of!(CUmemAllocationProp, location) == 8);
    assert!(size_of::<CUDA_ARRAY_DESCRIPTOR>() == 24);
    assert!(size_of::<CUDA_ARRAY3D_DESCRIPTOR>() == 40);
    assert!(size_of::<CUipcMemHandle>() == 64);
};

pub type nvmlReturn_t = c_uint;
pub type nvmlDevice_t = *mut c_void;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
/// `CU_STREAM_CAPTURE_STATUS_NONE` of `cuStreamIsCapturing`.
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_RELAXED` of `cuThreadExchangeStreamCaptureMode`.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
/// `NVML_VALUE_NOT_AVAILABLE` as an `unsigned long long`.
pub const NVML_VALUE_NOT_AVAILABLE_U64: u64 = u64::MAX;

/// `nvmlProcessInfo_t` of `nvmlDeviceGetComputeRunningProcesses_v2/_v3`
/// (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

const _: () = assert!(std::mem::size_of::<nvmlProcessInfo_t>() == 24);

/// `nvmlProcessUtilizationSample_t` of `nvmlDeviceGetProcessUtilization`
/// (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    /// µs since the Unix epoch.
    pub time_stamp: u64,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

const _: () = assert!(std::mem::size_of::<nvmlProcessUtilizationSample_t>() == 32);

/// `nvmlUtilization_t` of `nvmlDeviceGetUtilizationRates` (percent of the
/// last sample period in which a kernel ran / memory was read or written).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

const _: () = assert!(std::mem::size_of::<nvmlUtilization_t>() == 8);

/// `nvmlSample_t` of `nvmlDeviceGetSamples`: CPU timestamp (Unix µs) and
/// the `nvmlValue_t` union, read per `nvmlValueType_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlSample_t {
    pub time_stamp: u64,
    pub value: u64,
}

const _: () = assert!(std::mem::size_of::<nvmlSample_t>() == 16);

/// `NVML_GPU_UTILIZATION_SAMPLES` of `nvmlSamplingType_t`.
pub const NVML_GPU_UTILIZATION_SAMPLES: c_uint = 1;
/// `NVML_VALUE_TYPE_UNSIGNED_INT` of `nvmlValueType_t` (utilization
/// samples come as this).
pub const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// Reads `*p` if `p` is non-NULL.
pub(crate) fn read<T: Copy>(p: *const T) -> Option<T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL pointers handed to the hook by the application point
    // to a `T` of the C signature's type (the API's contract); unaligned
    // reads are tolerated.
    Some(unsafe { p.read_unaligned() })
}

/// Writes `v` to `*p` if `p` is non-NULL; false when NULL.
pub(crate) fn write<T>(p: *mut T, v: T) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: as in `read`: a non-NULL out-pointer of the C signature's type.
    unsafe { p.write_unaligned(v) };
    true
}

/// `prop->location` of the application's `CUmemAllocationProp`, if `prop`
/// is non-NULL.
pub(crate) fn alloc_prop_location(prop: *const CUmemAllocationProp) -> Option<CUmemLocation> {
    if prop.is_null() {
        return None;
    }
    // SAFETY: a non-NULL `prop` handed to `cuMemCreate` points to a
    // `CUmemAllocationProp` (the API's contract); only its leading
    // `location` field is read, unaligned-tolerant.
    Some(unsafe { std::ptr::addr_of!((*prop).location).read_unaligned() })
}

/// `(bytesize, pool_props.location)` of the application's
/// `CUDA_MEM_ALLOC_NODE_PARAMS`, if `params` is non-NULL.
pub(crate) fn alloc_node_request(
    params: *const CUDA_MEM_ALLOC_NODE_PARAMS,
) -> Option<(usize, CUmemLocation)> {
    if params.is_null() {
        return None;
    }
    // SAFETY: a non-NULL `params` handed to `cuGraphAddMemAllocNode` points
    // to the node parameters (the API's contract); two plain fields are
    // read, unaligned-tolerant.
    Some(unsafe {
        (
            std::ptr::addr_of!((*params).bytesize).read_unaligned(),
            std::ptr::addr_of!((*params).pool_props.location).read_unaligned(),
        )
    })
}

/// Runs `f` on the application's C string `p`, if `p` is non-NULL; the
/// borrow ends with `f`.
pub(crate) fn with_c_str<R>(p: *const c_char, f: impl FnOnce(&std::ffi::CStr) -> R) -> Option<R> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-NULL string argument of a C API is NUL-terminated and
    // stays valid for the call that passed it (the API's contract); the
    // borrow does not outlive `f`, which runs within that call.
    Some(f(unsafe { std::ffi::CStr::from_ptr(p) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_structs_are_read_at_their_fields_and_null_is_none() {
        let prop = CUmemAllocationProp {
            type_: 1,
            requested_handle_types: 0,
            location: CUmemLocation { type_: 1, id: 3 },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        };
        let loc = alloc_prop_location(&prop).unwrap();
        assert_eq!((loc.type_, loc.id), (CU_MEM_LOCATION_TYPE_DEVICE, 3));
        assert!(alloc_prop_location(std::ptr::null()).is_none());

        let params = CUDA_MEM_ALLOC_NODE_PARAMS {
            pool_props: CUmemPoolProps {
                alloc_type: 1,
                handle_types: 0,
                location: CUmemLocation { type_: 1, id: 2 },
                win32_security_attributes: std::ptr::null_mut(),
                reserved: [0; 64],
            },
            access_descs: std::ptr::null(),
            access_desc_count: 0,
            bytesize: 12345,
            dptr: 0,
        };
        let (bytes, loc) = alloc_node_request(&params).unwrap();
        assert_eq!((bytes, loc.type_, loc.id), (12345, 1, 2));
        assert!(alloc_node_request(std::ptr::null()).is_none());

        assert_eq!(
            with_c_str(c"cuMemAlloc".as_ptr(), |s| s.to_bytes().len()),
            Some(10)
        );
        assert_eq!(with_c_str(std::ptr::null(), |_| ()), None);
    }
}
