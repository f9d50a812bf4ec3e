//! System queries and error strings.

use std::ffi::{c_char, c_int, CStr};

use crate::{guard, put, with, write_str, NvmlReturn};

/// The driver version reported.
const DRIVER_VERSION: &str = "580.65.06";

/// `nvmlErrorString`.
#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let s: &CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        15 => c"GPU is lost",
        17 => c"Operating System Error",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not Ready",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

/// `nvmlSystemGetDriverVersion`.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, len: u32) -> NvmlReturn {
    guard(|| {
        with(|_| Ok(()))?;
        write_str(version, len, DRIVER_VERSION)
    })
}

/// `nvmlSystemGetNVMLVersion`.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, len: u32) -> NvmlReturn {
    guard(|| {
        with(|_| Ok(()))?;
        write_str(version, len, &format!("13.{DRIVER_VERSION}"))
    })
}

/// `nvmlSystemGetCudaDriverVersion`: 13000.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> NvmlReturn {
    guard(|| {
        with(|_| Ok(()))?;
        put!(version, 13000);
        Ok(())
    })
}

/// `nvmlSystemGetCudaDriverVersion_v2`: 13000.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> NvmlReturn {
    // SAFETY: same contract as the v1 function.
    unsafe { nvmlSystemGetCudaDriverVersion(version) }
}
