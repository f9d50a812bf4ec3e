//! `CUresult` codes (values from the CUDA driver API) and their strings.

use std::ffi::{c_char, CStr};

use crate::{guard, put, CUresult};

/// A CUDA driver error; the discriminant is the `CUresult` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[repr(u32)]
pub enum CuErr {
    /// CUDA_ERROR_INVALID_VALUE
    #[error("invalid argument")]
    InvalidValue = 1,
    /// CUDA_ERROR_OUT_OF_MEMORY
    #[error("out of memory")]
    OutOfMemory = 2,
    /// CUDA_ERROR_NOT_INITIALIZED
    #[error("initialization error")]
    NotInitialized = 3,
    /// CUDA_ERROR_DEINITIALIZED
    #[error("driver shutting down")]
    Deinitialized = 4,
    /// CUDA_ERROR_NO_DEVICE
    #[error("no CUDA-capable device is detected")]
    NoDevice = 100,
    /// CUDA_ERROR_INVALID_DEVICE
    #[error("invalid device ordinal")]
    InvalidDevice = 101,
    /// CUDA_ERROR_INVALID_IMAGE
    #[error("device kernel image is invalid")]
    InvalidImage = 200,
    /// CUDA_ERROR_INVALID_CONTEXT
    #[error("invalid device context")]
    InvalidContext = 201,
    /// CUDA_ERROR_FILE_NOT_FOUND
    #[error("file not found")]
    FileNotFound = 301,
    /// CUDA_ERROR_INVALID_HANDLE
    #[error("invalid resource handle")]
    InvalidHandle = 400,
    /// CUDA_ERROR_ILLEGAL_STATE
    #[error("the operation cannot be performed in the present state")]
    IllegalState = 401,
    /// CUDA_ERROR_NOT_FOUND
    #[error("named symbol not found")]
    NotFound = 500,
    /// CUDA_ERROR_NOT_READY
    #[error("device not ready")]
    NotReady = 600,
    /// CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    #[error("too many resources requested for launch")]
    LaunchOutOfResources = 701,
    /// CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
    #[error("peer access is already enabled")]
    PeerAccessAlreadyEnabled = 704,
    /// CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    #[error("part or all of the requested memory range is already mapped")]
    HostMemoryAlreadyRegistered = 712,
    /// CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    #[error("pointer does not correspond to a registered memory region")]
    HostMemoryNotRegistered = 713,
    /// CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
    #[error("too many blocks in cooperative launch")]
    CooperativeLaunchTooLarge = 720,
    /// CUDA_ERROR_NOT_PERMITTED
    #[error("operation not permitted")]
    NotPermitted = 800,
    /// CUDA_ERROR_NOT_SUPPORTED
    #[error("operation not supported")]
    NotSupported = 801,
    /// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    #[error("operation not permitted when stream is capturing")]
    StreamCaptureUnsupported = 900,
    /// CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    #[error("operation failed due to a previous error during capture")]
    StreamCaptureInvalidated = 901,
    /// CUDA_ERROR_CAPTURED_EVENT
    #[error("operation not permitted on an event last recorded in a capturing stream")]
    CapturedEvent = 907,
    /// CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
    #[error("attempt to terminate a thread-local capture sequence from another thread")]
    StreamCaptureWrongThread = 908,
    /// CUDA_ERROR_UNKNOWN
    #[error("unknown error")]
    Unknown = 999,
}

impl From<simgpu::SimError> for CuErr {
    fn from(e: simgpu::SimError) -> Self {
        match e {
            simgpu::SimError::OutOfMemory { .. } => CuErr::OutOfMemory,
            simgpu::SimError::InvalidDevice(_) => CuErr::InvalidDevice,
            simgpu::SimError::NoSlot => CuErr::NotInitialized,
            _ => CuErr::Unknown,
        }
    }
}

/// `(code, name, description)` for every code `cuGetErrorName` knows.
const CODES: &[(u32, &CStr, &CStr)] = &[
    (0, c"CUDA_SUCCESS", c"no error"),
    (1, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
    (2, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (3, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
    (4, c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
    (
        5,
        c"CUDA_ERROR_PROFILER_DISABLED",
        c"profiler disabled while using external profiling tool",
    ),
    (
        100,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (101, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
    (
        200,
        c"CUDA_ERROR_INVALID_IMAGE",
        c"device kernel image is invalid",
    ),
    (
        201,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        202,
        c"CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
        c"context already current",
    ),
    (
        205,
        c"CUDA_ERROR_MAP_FAILED",
        c"mapping of buffer object failed",
    ),
    (
        206,
        c"CUDA_ERROR_UNMAP_FAILED",
        c"unmapping of buffer object failed",
    ),
    (
        209,
        c"CUDA_ERROR_NO_BINARY_FOR_GPU",
        c"no kernel image is available for execution on the device",
    ),
    (
        300,
        c"CUDA_ERROR_INVALID_SOURCE",
        c"device kernel image is invalid",
    ),
    (301, c"CUDA_ERROR_FILE_NOT_FOUND", c"file not found"),
    (
        400,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (
        401,
        c"CUDA_ERROR_ILLEGAL_STATE",
        c"the operation cannot be performed in the present state",
    ),
    (500, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
    (600, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (
        700,
        c"CUDA_ERROR_ILLEGAL_ADDRESS",
        c"an illegal memory access was encountered",
    ),
    (
        701,
        c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        c"too many resources requested for launch",
    ),
    (
        702,
        c"CUDA_ERROR_LAUNCH_TIMEOUT",
        c"the launch timed out and was terminated",
    ),
    (
        704,
        c"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        c"peer access is already enabled",
    ),
    (
        705,
        c"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        c"peer access has not been enabled",
    ),
    (
        708,
        c"CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
        c"cannot set while device is active in this process",
    ),
    (
        709,
        c"CUDA_ERROR_CONTEXT_IS_DESTROYED",
        c"context is destroyed",
    ),
    (
        712,
        c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        c"part or all of the requested memory range is already mapped",
    ),
    (
        713,
        c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        c"pointer does not correspond to a registered memory region",
    ),
    (
        719,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
    (
        720,
        c"CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
        c"too many blocks in cooperative launch",
    ),
    (800, c"CUDA_ERROR_NOT_PERMITTED", c"operation not permitted"),
    (801, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
    (
        900,
        c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        c"operation not permitted when stream is capturing",
    ),
    (
        901,
        c"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        c"operation failed due to a previous error during capture",
    ),
    (
        907,
        c"CUDA_ERROR_CAPTURED_EVENT",
        c"operation not permitted on an event last recorded in a capturing stream",
    ),
    (
        908,
        c"CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        c"attempt to terminate a thread-local capture sequence from another thread",
    ),
    (999, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

fn lookup(code: CUresult) -> Option<&'static (u32, &'static CStr, &'static CStr)> {
    CODES.iter().find(|(c, _, _)| *c == code)
}

/// `cuGetErrorString`: a description of `error`; unknown codes are
/// `CUDA_ERROR_INVALID_VALUE` with `*pStr = NULL`.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    guard(|| match lookup(error) {
        Some((_, _, s)) => {
            put!(p_str, s.as_ptr());
            Ok(())
        }
        None => {
            put!(p_str, std::ptr::null());
            Err(CuErr::InvalidValue)
        }
    })
}

/// `cuGetErrorName`: the enum name of `error`.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    guard(|| match lookup(error) {
        Some((_, n, _)) => {
            put!(p_str, n.as_ptr());
            Ok(())
        }
        None => {
            put!(p_str, std::ptr::null());
            Err(CuErr::InvalidValue)
        }
    })
}
