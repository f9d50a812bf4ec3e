//! `cuGetProcAddress` / `_v2`: resolves driver symbols to this library's
//! own exports through a table generated at build time from the source
//! (`build.rs`), never through `dlsym` (a preloaded hook interposes
//! `dlsym`, and must not see its own lookups come back to it).
//!
//! Resolution of `symbol` for `cudaVersion` and `flags`:
//! 1. the ABI version: for names with several (`cuCtxCreate`, `cuMemAlloc`,
//!    …) the newest whose CUDA version is ≤ `cudaVersion` (none:
//!    `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`); else the exact name if
//!    exported; else its highest `_vN` export;
//! 2. with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` (2): that
//!    name's `_ptsz`, then `_ptds` variant when exported.

use std::ffi::{c_char, c_int, c_void};

use crate::{cstr, guard, put, CUresult, CuErr};

include!(concat!(env!("OUT_DIR"), "/exports.rs"));

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD: u64 = 2;

/// `CUdriverProcAddressQueryResult`.
const SYMBOL_SUCCESS: c_int = 0;
const SYMBOL_NOT_FOUND: c_int = 1;
const VERSION_NOT_SUFFICIENT: c_int = 2;

/// Names with several ABI versions: (CUDA version introduced, export).
const VERSIONED: &[(&str, &[(i32, &str)])] = &[
    (
        "cuCtxCreate",
        &[
            (3020, "cuCtxCreate_v2"),
            (11040, "cuCtxCreate_v3"),
            (12050, "cuCtxCreate_v4"),
        ],
    ),
    ("cuCtxDestroy", &[(4000, "cuCtxDestroy_v2")]),
    ("cuCtxPopCurrent", &[(4000, "cuCtxPopCurrent_v2")]),
    ("cuCtxPushCurrent", &[(4000, "cuCtxPushCurrent_v2")]),
    ("cuStreamDestroy", &[(4000, "cuStreamDestroy_v2")]),
    ("cuEventDestroy", &[(4000, "cuEventDestroy_v2")]),
    ("cuMemHostRegister", &[(6050, "cuMemHostRegister_v2")]),
    (
        "cuDevicePrimaryCtxRelease",
        &[(11000, "cuDevicePrimaryCtxRelease_v2")],
    ),
    (
        "cuDevicePrimaryCtxReset",
        &[(11000, "cuDevicePrimaryCtxReset_v2")],
    ),
    (
        "cuDevicePrimaryCtxSetFlags",
        &[(11000, "cuDevicePrimaryCtxSetFlags_v2")],
    ),
    ("cuIpcOpenMemHandle", &[(11000, "cuIpcOpenMemHandle_v2")]),
    (
        "cuDeviceGetUuid",
        &[(9020, "cuDeviceGetUuid"), (11040, "cuDeviceGetUuid_v2")],
    ),
    (
        "cuGraphInstantiate",
        &[
            (11000, "cuGraphInstantiate_v2"),
            (12000, "cuGraphInstantiateWithFlags"),
        ],
    ),
    (
        "cuGraphAddKernelNode",
        &[
            (10000, "cuGraphAddKernelNode"),
            (12000, "cuGraphAddKernelNode_v2"),
        ],
    ),
    (
        "cuGetProcAddress",
        &[(11030, "cuGetProcAddress"), (12050, "cuGetProcAddress_v2")],
    ),
    (
        "cuEventElapsedTime",
        &[
            (2000, "cuEventElapsedTime"),
            (12080, "cuEventElapsedTime_v2"),
        ],
    ),
    (
        "cuStreamBeginCapture",
        &[
            (10000, "cuStreamBeginCapture"),
            (10010, "cuStreamBeginCapture_v2"),
        ],
    ),
];

/// Resolves `symbol` to an export name, or the `symbolStatus` failure.
pub(crate) fn resolve(symbol: &str, version: i32, flags: u64) -> Result<String, c_int> {
    let base = if let Some((_, versions)) = VERSIONED.iter().find(|(n, _)| *n == symbol) {
        versions
            .iter()
            .filter(|(v, _)| *v <= version)
            .max_by_key(|(v, _)| *v)
            .map(|(_, n)| (*n).to_string())
            .ok_or(VERSION_NOT_SUFFICIENT)?
    } else if lookup(symbol).is_some() {
        symbol.to_string()
    } else {
        (2..=9)
            .rev()
            .map(|n| format!("{symbol}_v{n}"))
            .find(|n| lookup(n).is_some())
            .ok_or(SYMBOL_NOT_FOUND)?
    };
    if flags & PER_THREAD != 0 {
        for suffix in ["_ptsz", "_ptds"] {
            let n = format!("{base}{suffix}");
            if lookup(&n).is_some() {
                return Ok(n);
            }
        }
    }
    Ok(base)
}

fn get_proc(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Result<(), CuErr> {
    let name = cstr!(symbol);
    if pfn.is_null() {
        return Err(CuErr::InvalidValue);
    }
    let found = resolve(name, version, flags).and_then(|n| lookup(&n).ok_or(SYMBOL_NOT_FOUND));
    let (ptr, st) = match found {
        Ok(p) => (p as *mut c_void, SYMBOL_SUCCESS),
        Err(st) => (std::ptr::null_mut(), st),
    };
    put!(pfn, ptr);
    if !status.is_null() {
        put!(status, st);
    }
    if ptr.is_null() {
        Err(CuErr::NotFound)
    } else {
        Ok(())
    }
}

/// `cuGetProcAddress` (CUDA 11.3 – 12.4 form).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    guard(|| get_proc(symbol, pfn, cuda_version, flags, std::ptr::null_mut()))
}

/// `cuGetProcAddress_v2`: also fills `symbolStatus` (0 found, 1 not
/// found, 2 version not sufficient).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult {
    guard(|| get_proc(symbol, pfn, cuda_version, flags, symbol_status))
}

/// `cuGetExportTable`: not provided (`CUDA_ERROR_NOT_SUPPORTED`); the CUDA
/// runtime needs it, driver-API programs do not.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    _id: *const c_void,
) -> CUresult {
    guard(|| {
        put!(table, std::ptr::null());
        Err(CuErr::NotSupported)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves() {
        assert_eq!(
            resolve("cuMemAlloc", 12000, 0).as_deref(),
            Ok("cuMemAlloc_v2")
        );
        assert_eq!(
            resolve("cuLaunchKernel", 12000, 2).as_deref(),
            Ok("cuLaunchKernel_ptsz")
        );
        assert_eq!(
            resolve("cuLaunchKernel", 12000, 0).as_deref(),
            Ok("cuLaunchKernel")
        );
        assert_eq!(
            resolve("cuMemcpyHtoD", 12000, 2).as_deref(),
            Ok("cuMemcpyHtoD_v2_ptds")
        );
        assert_eq!(
            resolve("cuCtxCreate", 11000, 0).as_deref(),
            Ok("cuCtxCreate_v2")
        );
        assert_eq!(
            resolve("cuCtxCreate", 13000, 0).as_deref(),
            Ok("cuCtxCreate_v4")
        );
        assert_eq!(
            resolve("cuGraphInstantiate", 12000, 0).as_deref(),
            Ok("cuGraphInstantiateWithFlags")
        );
        assert_eq!(
            resolve("cuStreamBeginCapture", 12000, 2).as_deref(),
            Ok("cuStreamBeginCapture_v2_ptsz")
        );
        assert_eq!(
            resolve("cuStreamBeginCapture", 10000, 0).as_deref(),
            Ok("cuStreamBeginCapture")
        );
        assert_eq!(resolve("cuCtxCreate", 3000, 0), Err(VERSION_NOT_SUFFICIENT));
        assert_eq!(resolve("cuNoSuchThing", 12000, 0), Err(SYMBOL_NOT_FOUND));
        assert!(NAMES.len() > 150, "{}", NAMES.len());
    }
}
