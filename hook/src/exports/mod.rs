//! The exported `extern "C"` symbols, all generated from the entry-point
//! list (`vgpu_common::entry_points!`, `common/src/entry.rs`), and the
//! name → wrapper lookup shared by `dlsym` and `cuGetProcAddress`.
//!
//! Each wrapper builds the one call that forwards it to the real driver
//! (`real_cuda!` / `real_nvml!` with the application's own arguments) and
//! passes it to its policy function as the first argument, `forward: impl
//! Fn() -> CUresult` (or `nvmlReturn_t`): the policy decides whether and
//! when the call goes through, and never writes a forwarder of its own.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::ffi::*;

pub mod dlsym;
pub mod guard;

macro_rules! gen_exports {
    (
        cuda_hooks { $(fn $ch:ident($($cha:ident: $cht:ty),*) -> $chr:ty => $($chp:ident)::+, cuda($cb:ident @ $cs:literal $(, $cpt:ident)?) $(, trace($cv:ident = $cid:literal, $ccl:ident))?;)* }
        cuda_older { $($co:tt)* }
        cuda_real { $($cr:tt)* }
        nvml_hooks { $(fn $nh:ident($($nha:ident: $nht:ty),*) -> $nhr:ty => $($nhp:ident)::+;)* }
        nvml_real { $($nr:tt)* }
    ) => {
        /// The hook's CUDA wrappers.
        pub mod cuda_exports {
            use super::*;
            $(
                /// Hooked CUDA entry point (see `vgpu_common::entry_points!`).
                ///
                /// # Safety
                /// 1. The caller passes arguments valid for the C API of the
                ///    same name.
                #[cfg_attr(not(test), no_mangle)]
                pub unsafe extern "C" fn $ch($($cha: $cht),*) -> $chr {
                    // The call as the application made it, to the real
                    // driver: what the guard forwards on reentry, and what
                    // the policy makes when (and if) it lets the call through.
                    let forward = move || real_cuda!($ch($($cha),*));
                    guard::cuda(
                        stringify!($ch),
                        forward,
                        move || crate::$($chp)::+(forward, $($cha),*),
                    )
                }
            )*
        }

        /// The hook's NVML wrappers.
        pub mod nvml_exports {
            use super::*;
            $(
                /// Hooked NVML entry point (see `vgpu_common::entry_points!`).
                ///
                /// # Safety
                /// 1. The caller passes arguments valid for the C API of the
                ///    same name.
                #[cfg_attr(not(test), no_mangle)]
                pub unsafe extern "C" fn $nh($($nha: $nht),*) -> $nhr {
                    // As for CUDA: the forwarding call, given to the policy.
                    let forward = move || real_nvml!($nh($($nha),*));
                    guard::nvml(
                        stringify!($nh),
                        forward,
                        move || crate::$($nhp)::+(forward, $($nha),*),
                    )
                }
            )*
        }

        /// Which library a hooked name belongs to.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Lib {
            Cuda,
            Nvml,
        }

        /// The hook's wrapper for exactly `name`, if it is hooked.
        pub fn lookup(name: &[u8]) -> Option<(Lib, *mut c_void)> {
            $(
                if name == stringify!($ch).as_bytes() {
                    let f: unsafe extern "C" fn($($cht),*) -> $chr = cuda_exports::$ch;
                    return Some((Lib::Cuda, f as *mut c_void));
                }
            )*
            $(
                if name == stringify!($nh).as_bytes() {
                    let f: unsafe extern "C" fn($($nht),*) -> $nhr = nvml_exports::$nh;
                    return Some((Lib::Nvml, f as *mut c_void));
                }
            )*
            None
        }

        /// Every hooked name, for tests.
        #[cfg(test)]
        pub const HOOKED: &[&str] = &[$(stringify!($ch),)* $(stringify!($nh),)*];
    };
}

vgpu_common::entry_points!(gen_exports);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_is_exact() {
        assert!(lookup(b"cuMemAlloc_v2").is_some());
        assert_eq!(lookup(b"nvmlInit_v2").map(|x| x.0), Some(Lib::Nvml));
        assert!(lookup(b"cuMemAlloc").is_none());
        assert!(lookup(b"curl_easy_init").is_none());
        assert!(lookup(b"cuMemAlloc_v2x").is_none());
    }

    /// Every entry point through which a process takes device memory, gets
    /// its memory figures, or launches work must be exported (docs/hook.md):
    /// one missing from the list is memory or time that escapes the limits.
    #[test]
    fn every_counted_entry_point_is_exported_and_found() {
        const REQUIRED: &[&str] = &[
            "cuInit",
            "cuGetProcAddress",
            "cuGetProcAddress_v2",
            "cuMemAlloc_v2",
            "cuMemAllocPitch_v2",
            "cuMemAllocManaged",
            "cuMemFree_v2",
            "cuMemCreate",
            "cuMemRelease",
            "cuMemRetainAllocationHandle",
            "cuMemMap",
            "cuMemUnmap",
            "cuMemAllocAsync",
            "cuMemAllocAsync_ptsz",
            "cuMemAllocFromPoolAsync",
            "cuMemAllocFromPoolAsync_ptsz",
            "cuMemFreeAsync",
            "cuMemFreeAsync_ptsz",
            "cuArrayCreate_v2",
            "cuArray3DCreate_v2",
            "cuMipmappedArrayCreate",
            "cuGraphAddMemAllocNode",
            "cuIpcOpenMemHandle_v2",
            "cuDevicePrimaryCtxRetain",
            "cuCtxCreate_v2",
            "cuCtxCreate_v3",
            "cuCtxCreate_v4",
            "cuMemGetInfo_v2",
            "cuLaunchKernel",
            "cuLaunchKernel_ptsz",
            "cuLaunchKernelEx",
            "cuLaunchKernelEx_ptsz",
            "cuLaunchCooperativeKernel",
            "cuLaunchCooperativeKernel_ptsz",
            "cuGraphLaunch",
            "cuGraphLaunch_ptsz",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetMemoryInfo_v2",
        ];
        for name in REQUIRED {
            assert!(HOOKED.contains(name), "{name} is not hooked");
        }
        for name in HOOKED {
            assert!(
                lookup(name.as_bytes()).is_some(),
                "{name} is hooked but not found"
            );
        }
        let mut sorted = HOOKED.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), HOOKED.len(), "an entry point is listed twice");
    }
}
