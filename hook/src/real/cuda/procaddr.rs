//! `cuGetProcAddress` (v1 and v2), forwarded as the application asked.

use std::ffi::{c_char, c_int, c_void};

use super::sym;
use crate::ffi::*;

/// `cuGetProcAddress`, forwarded with the application's pointers.
#[doc(alias = "cuGetProcAddress")]
pub fn get_v1(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    let Ok(f) = sym(|t| t.cuGetProcAddress) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `symbol` and `pfn` are the application's pointers of this
    // very call, passed unchanged.
    unsafe { f(symbol, pfn, cuda_version, flags) }
}

/// `cuGetProcAddress_v2`, forwarded with the application's pointers.
#[doc(alias = "cuGetProcAddress_v2")]
pub fn get_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    let Ok(f) = sym(|t| t.cuGetProcAddress_v2) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `symbol`, `pfn` and `status` are the application's pointers
    // of this very call, passed unchanged.
    unsafe { f(symbol, pfn, cuda_version, flags, status) }
}
