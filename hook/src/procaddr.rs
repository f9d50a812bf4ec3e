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

#![forbid(unsafe_code)]

use std::ffi::{c_char, c_int, c_void};

use crate::ffi::*;

/// The versioned symbol a request for `name` at `cuda_version` with `flags`
/// binds to, when `name` is a base name the entry-point list knows
/// (`cuda(…)` in `vgpu_common::entry_points!`). `None` for a version older
/// than the first one (the driver answers that itself).
pub fn resolve(name: &str, cuda_version: c_int, flags: u64) -> Option<&'static str> {
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    vgpu_common::entry::resolve(name, cuda_version, per_thread)
}

/// The hook's wrapper to hand out for a successful request, if any.
fn substitute(symbol: *const c_char, cuda_version: c_int, flags: u64) -> Option<*mut c_void> {
    crate::ffi::with_c_str(symbol, |name| {
        let name = name.to_str().ok()?;
        let target = resolve(name, cuda_version, flags).unwrap_or(name);
        let (_, ours) = crate::exports::lookup(target.as_bytes())?;
        vlog!(
            crate::log::DEBUG,
            "cuGetProcAddress({name}, {cuda_version}, {flags:#x}) -> hook {target}"
        );
        Some(ours)
    })
    .flatten()
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
    } else if crate::log::enabled(crate::log::DEBUG) {
        // Which driver entry points a library takes past the hook: the
        // first thing to read when memory escapes the count.
        crate::ffi::with_c_str(symbol, |name| {
            vlog!(
                crate::log::DEBUG,
                "cuGetProcAddress({}, {cuda_version}, {flags:#x}) -> driver",
                name.to_string_lossy()
            );
        });
    }
    rc
}

pub fn get_proc_address_v1(
    forward: impl FnOnce() -> CUresult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    let rc = forward();
    finish(rc, symbol, pfn, cuda_version, flags)
}

pub fn get_proc_address_v2(
    forward: impl FnOnce() -> CUresult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    _status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    let rc = forward();
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

    /// Every symbol a request can bind to is the hook's wrapper exactly
    /// when the list says it is hooked; older ABI versions (v1 of `_v2`
    /// functions) are forwarded untouched.
    #[test]
    fn every_versioned_target_is_hooked_or_deliberately_not() {
        let unhooked = [
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
        for v in vgpu_common::entry::CUDA_VERSIONS {
            let exported = crate::exports::lookup(v.symbol.as_bytes()).is_some();
            assert_eq!(exported, v.hooked, "{}", v.symbol);
            assert_eq!(unhooked.contains(&v.symbol), !v.hooked, "{}", v.symbol);
        }
    }

    /// Every hooked CUDA symbol is reachable through `cuGetProcAddress`: a
    /// runtime that resolves it by base name gets the hook's wrapper.
    #[test]
    fn every_hooked_cuda_symbol_has_a_typedef() {
        let pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        for name in crate::exports::HOOKED
            .iter()
            .filter(|n| n.starts_with("cu"))
        {
            let v = vgpu_common::entry::CUDA_VERSIONS
                .iter()
                .find(|v| v.symbol == *name)
                .unwrap_or_else(|| panic!("{name} has no cuda(…) facts"));
            let flags = if v.per_thread { pt } else { 0 };
            assert_eq!(resolve(v.base, v.since, flags), Some(*name), "{name}");
        }
    }
}
