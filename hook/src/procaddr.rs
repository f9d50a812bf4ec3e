//! `cuGetProcAddress` / `cuGetProcAddress_v2`: how CUDA ≥ 11.3 runtimes get
//! every driver entry point.
//!
//! The request is `(base name, cudaVersion, flags)`. As the driver does, the
//! hook maps it to the versioned symbol the caller's headers would bind
//! (`cudaTypedefs.h`: `PFN_cuMemAlloc_v3020` is `cuMemAlloc_v2`,
//! `PFN_cuCtxCreate_v11040` is `cuCtxCreate_v3`, …), picks the `_ptsz`
//! variant when the per-thread-default-stream flag is set, and only then
//! substitutes its wrapper for that exact symbol. The real
//! `cuGetProcAddress` is always called first, so its status output and
//! errors are the driver's.

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::ffi::*;

/// One base name: `(first CUDA version, symbol)` ascending, and the
/// per-thread-stream symbol if it has one.
struct Entry {
    name: &'static str,
    versions: &'static [(c_int, &'static str)],
    per_thread: Option<&'static str>,
}

const fn e(
    name: &'static str,
    versions: &'static [(c_int, &'static str)],
    per_thread: Option<&'static str>,
) -> Entry {
    Entry {
        name,
        versions,
        per_thread,
    }
}

/// Facts from cudaTypedefs.h (`PFN_<name>_v<version>[_ptsz]`), for every
/// base name whose versions include a hooked symbol.
const TABLE: &[Entry] = &[
    e("cuInit", &[(2000, "cuInit")], None),
    e(
        "cuGetProcAddress",
        &[(11030, "cuGetProcAddress"), (12000, "cuGetProcAddress_v2")],
        None,
    ),
    e(
        "cuMemAlloc",
        &[(2000, "cuMemAlloc"), (3020, "cuMemAlloc_v2")],
        None,
    ),
    e(
        "cuMemAllocPitch",
        &[(2000, "cuMemAllocPitch"), (3020, "cuMemAllocPitch_v2")],
        None,
    ),
    e("cuMemAllocManaged", &[(6000, "cuMemAllocManaged")], None),
    e(
        "cuMemFree",
        &[(2000, "cuMemFree"), (3020, "cuMemFree_v2")],
        None,
    ),
    e(
        "cuMemGetInfo",
        &[(2000, "cuMemGetInfo"), (3020, "cuMemGetInfo_v2")],
        None,
    ),
    e(
        "cuDeviceTotalMem",
        &[(2000, "cuDeviceTotalMem"), (3020, "cuDeviceTotalMem_v2")],
        None,
    ),
    e("cuMemCreate", &[(10020, "cuMemCreate")], None),
    e("cuMemRelease", &[(10020, "cuMemRelease")], None),
    e(
        "cuMemAllocAsync",
        &[(11020, "cuMemAllocAsync")],
        Some("cuMemAllocAsync_ptsz"),
    ),
    e(
        "cuMemAllocFromPoolAsync",
        &[(11020, "cuMemAllocFromPoolAsync")],
        Some("cuMemAllocFromPoolAsync_ptsz"),
    ),
    e(
        "cuMemFreeAsync",
        &[(11020, "cuMemFreeAsync")],
        Some("cuMemFreeAsync_ptsz"),
    ),
    e(
        "cuArrayCreate",
        &[(2000, "cuArrayCreate"), (3020, "cuArrayCreate_v2")],
        None,
    ),
    e(
        "cuArray3DCreate",
        &[(2000, "cuArray3DCreate"), (3020, "cuArray3DCreate_v2")],
        None,
    ),
    e("cuArrayDestroy", &[(2000, "cuArrayDestroy")], None),
    e(
        "cuMipmappedArrayCreate",
        &[(5000, "cuMipmappedArrayCreate")],
        None,
    ),
    e(
        "cuMipmappedArrayDestroy",
        &[(5000, "cuMipmappedArrayDestroy")],
        None,
    ),
    e(
        "cuGraphAddMemAllocNode",
        &[(11040, "cuGraphAddMemAllocNode")],
        None,
    ),
    e("cuGraphDestroy", &[(10000, "cuGraphDestroy")], None),
    e(
        "cuIpcOpenMemHandle",
        &[
            (4010, "cuIpcOpenMemHandle"),
            (11000, "cuIpcOpenMemHandle_v2"),
        ],
        None,
    ),
    e(
        "cuIpcCloseMemHandle",
        &[(4010, "cuIpcCloseMemHandle")],
        None,
    ),
    e(
        "cuDevicePrimaryCtxRetain",
        &[(7000, "cuDevicePrimaryCtxRetain")],
        None,
    ),
    e(
        "cuDevicePrimaryCtxRelease",
        &[
            (7000, "cuDevicePrimaryCtxRelease"),
            (11000, "cuDevicePrimaryCtxRelease_v2"),
        ],
        None,
    ),
    e(
        "cuDevicePrimaryCtxReset",
        &[
            (7000, "cuDevicePrimaryCtxReset"),
            (11000, "cuDevicePrimaryCtxReset_v2"),
        ],
        None,
    ),
    e(
        "cuCtxCreate",
        &[
            (2000, "cuCtxCreate"),
            (3020, "cuCtxCreate_v2"),
            (11040, "cuCtxCreate_v3"),
            (12050, "cuCtxCreate_v4"),
        ],
        None,
    ),
    e(
        "cuCtxDestroy",
        &[(2000, "cuCtxDestroy"), (4000, "cuCtxDestroy_v2")],
        None,
    ),
    e(
        "cuLaunchKernel",
        &[(4000, "cuLaunchKernel")],
        Some("cuLaunchKernel_ptsz"),
    ),
    e(
        "cuLaunchKernelEx",
        &[(11060, "cuLaunchKernelEx")],
        Some("cuLaunchKernelEx_ptsz"),
    ),
    e(
        "cuLaunchCooperativeKernel",
        &[(9000, "cuLaunchCooperativeKernel")],
        Some("cuLaunchCooperativeKernel_ptsz"),
    ),
    e(
        "cuGraphLaunch",
        &[(10000, "cuGraphLaunch")],
        Some("cuGraphLaunch_ptsz"),
    ),
];

/// The versioned symbol a request for `name` at `cuda_version` with `flags`
/// binds to, when `name` is a base name the hook knows. `None` for a version
/// older than the first one (the driver answers that itself).
pub fn resolve(name: &str, cuda_version: c_int, flags: u64) -> Option<&'static str> {
    let entry = TABLE.iter().find(|e| e.name == name)?;
    let (_, sym) = entry
        .versions
        .iter()
        .rev()
        .find(|(v, _)| cuda_version >= *v)?;
    if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 {
        if let Some(pt) = entry.per_thread {
            return Some(pt);
        }
    }
    Some(sym)
}

/// The hook's wrapper to hand out for a successful request, if any.
fn substitute(symbol: *const c_char, cuda_version: c_int, flags: u64) -> Option<*mut c_void> {
    if symbol.is_null() {
        return None;
    }
    // SAFETY: non-NULL C string from the caller (API contract).
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().ok()?;
    let target = resolve(name, cuda_version, flags).unwrap_or(name);
    let (_, ours) = crate::exports::lookup(target.as_bytes())?;
    vlog!(
        crate::log::DEBUG,
        "cuGetProcAddress({name}, {cuda_version}, {flags:#x}) -> hook {target}"
    );
    Some(ours)
}

fn finish(
    rc: CUresult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    if rc != CUDA_SUCCESS || pfn.is_null() {
        return rc;
    }
    if crate::ffi::read(pfn as *const *mut c_void).is_none_or(|p| p.is_null()) {
        return rc;
    }
    if let Some(ours) = substitute(symbol, cuda_version, flags) {
        crate::ffi::write(pfn, ours);
    }
    rc
}

pub fn get_proc_address_v1(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    let rc = real_cuda!(cuGetProcAddress(symbol, pfn, cuda_version, flags));
    finish(rc, symbol, pfn, cuda_version, flags)
}

pub fn get_proc_address_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    let rc = real_cuda!(cuGetProcAddress_v2(
        symbol,
        pfn,
        cuda_version,
        flags,
        status
    ));
    finish(rc, symbol, pfn, cuda_version, flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_flags() {
        let pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        let cases: &[(&str, c_int, u64, Option<&str>)] = &[
            ("cuMemAlloc", 11080, 0, Some("cuMemAlloc_v2")),
            ("cuMemAlloc", 12040, 1, Some("cuMemAlloc_v2")),
            ("cuMemAlloc", 13000, pt, Some("cuMemAlloc_v2")),
            ("cuMemAlloc", 2000, 0, Some("cuMemAlloc")),
            ("cuCtxCreate", 11000, 0, Some("cuCtxCreate_v2")),
            ("cuCtxCreate", 11040, 0, Some("cuCtxCreate_v3")),
            ("cuCtxCreate", 12000, 0, Some("cuCtxCreate_v3")),
            ("cuCtxCreate", 12050, 0, Some("cuCtxCreate_v4")),
            ("cuCtxCreate", 13000, 0, Some("cuCtxCreate_v4")),
            ("cuLaunchKernel", 12000, 0, Some("cuLaunchKernel")),
            ("cuLaunchKernel", 12000, pt, Some("cuLaunchKernel_ptsz")),
            ("cuMemAllocAsync", 11020, pt, Some("cuMemAllocAsync_ptsz")),
            ("cuMemAllocAsync", 11010, 0, None),
            ("cuGetProcAddress", 12000, 0, Some("cuGetProcAddress_v2")),
            ("cuGetProcAddress", 11080, 0, Some("cuGetProcAddress")),
            (
                "cuDevicePrimaryCtxRelease",
                12000,
                0,
                Some("cuDevicePrimaryCtxRelease_v2"),
            ),
            (
                "cuDevicePrimaryCtxReset",
                12000,
                0,
                Some("cuDevicePrimaryCtxReset_v2"),
            ),
            ("cuStreamCreate", 12000, 0, None),
        ];
        for (name, v, f, want) in cases {
            assert_eq!(resolve(name, *v, *f), *want, "{name} {v} {f}");
        }
    }

    #[test]
    fn every_versioned_target_is_hooked_or_deliberately_not() {
        // Old ABI symbols (v1 of _v2 functions) are forwarded untouched.
        let unhooked_ok = [
            "cuMemAlloc",
            "cuMemAllocPitch",
            "cuMemFree",
            "cuMemGetInfo",
            "cuDeviceTotalMem",
            "cuArrayCreate",
            "cuArray3DCreate",
            "cuIpcOpenMemHandle",
            "cuCtxCreate",
            "cuCtxDestroy",
        ];
        for e in TABLE {
            let syms = e.versions.iter().map(|(_, s)| *s).chain(e.per_thread);
            for sym in syms {
                assert!(
                    crate::exports::lookup(sym.as_bytes()).is_some() || unhooked_ok.contains(&sym),
                    "{sym}"
                );
            }
        }
    }
}
