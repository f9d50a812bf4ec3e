//! The real libraries: `dlopen` (RTLD_NOLOAD first, to reuse the copy the
//! process already has) and the *real* `dlsym`, which the hook's own exported
//! `dlsym` must never be confused with. One typed `Option<fn>` per symbol,
//! generated from the entry-point list (`vgpu_common::entry_points!`).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

#[macro_use]
pub mod cuda;
#[macro_use]
pub mod nvml;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

extern "C" {
    fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void;
}

/// glibc's `dlsym`, found with `dlvsym(RTLD_NEXT, …)` so the hook's exported
/// `dlsym` is skipped.
pub fn real_dlsym() -> Option<DlsymFn> {
    static REAL: OnceLock<Option<DlsymFn>> = OnceLock::new();
    *REAL.get_or_init(|| {
        let versions: &[&CStr] = &[c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"];
        for v in versions {
            // SAFETY: both strings are NUL-terminated literals; RTLD_NEXT is a
            // valid pseudo-handle for dlvsym.
            let p = unsafe { dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
            if !p.is_null() {
                // SAFETY: glibc's `dlsym` has exactly this C signature.
                return Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) });
            }
        }
        vlog!(
            crate::log::ERROR,
            "cannot find glibc's dlsym; the hook forwards nothing"
        );
        None
    })
}

/// Opens `name` (RTLD_NOLOAD first, then a normal load). Returns the handle
/// or NULL.
pub fn open_library(name: &CStr) -> *mut c_void {
    let flags: c_int = libc::RTLD_NOW | libc::RTLD_NOLOAD;
    // SAFETY: `name` is NUL-terminated; dlopen is thread-safe.
    let h = unsafe { libc::dlopen(name.as_ptr(), flags) };
    if !h.is_null() {
        return h;
    }
    // SAFETY: as above.
    unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) }
}

/// The address of `name` in `handle` through the real dlsym, or NULL.
pub(crate) fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
    let Some(dlsym) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    if handle.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `handle` came from dlopen and is never closed; `name` is
    // NUL-terminated.
    unsafe { dlsym(handle, name.as_ptr()) }
}

/// Converts a symbol address into a typed function pointer.
///
/// # Safety
/// 1. `p` is non-NULL and is the address of a function whose C signature is
///    exactly `F`.
unsafe fn typed<F: Copy>(p: *mut c_void) -> F {
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: by the caller's contract; `F` is a function-pointer type of
    // pointer size.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

fn sym<F: Copy>(handle: *mut c_void, name: &str) -> Option<F> {
    let cname = std::ffi::CString::new(name).ok()?;
    let p = lookup(handle, &cname);
    if p.is_null() {
        None
    } else {
        // SAFETY: the symbol of this name in the real driver library has the
        // C signature declared for it in the hook list (cuda.h / nvml.h).
        Some(unsafe { typed::<F>(p) })
    }
}

macro_rules! gen_real_tables {
    (
        cuda_hooks { $(fn $ch:ident($($cha:ident: $cht:ty),*) -> $chr:ty => $($chp:ident)::+, cuda($cb:ident @ $cs:literal $(, $cpt:ident)?) $(, trace($cv:ident = $cid:literal, $ccl:ident))?;)* }
        cuda_older { $($co:tt)* }
        cuda_real { $(fn $cr:ident($($cra:ident: $crt:ty),*) -> $crr:ty;)* }
        nvml_hooks { $(fn $nh:ident($($nha:ident: $nht:ty),*) -> $nhr:ty => $($nhp:ident)::+;)* }
        nvml_real { $(fn $nr:ident($($nra:ident: $nrt:ty),*) -> $nrr:ty;)* }
    ) => {
        /// Real libcuda entry points, one typed `Option` per symbol.
        #[derive(Debug)]
        pub struct CudaFns {
            pub handle: usize,
            $(pub $ch: Option<unsafe extern "C" fn($($cht),*) -> $chr>,)*
            $(pub $cr: Option<unsafe extern "C" fn($($crt),*) -> $crr>,)*
        }

        impl CudaFns {
            pub fn load(handle: *mut c_void) -> Self {
                Self {
                    handle: handle as usize,
                    $($ch: sym(handle, stringify!($ch)),)*
                    $($cr: sym(handle, stringify!($cr)),)*
                }
            }
        }

        /// Real libnvidia-ml entry points.
        #[derive(Debug)]
        pub struct NvmlFns {
            pub handle: usize,
            $(pub $nh: Option<unsafe extern "C" fn($($nht),*) -> $nhr>,)*
            $(pub $nr: Option<unsafe extern "C" fn($($nrt),*) -> $nrr>,)*
        }

        impl NvmlFns {
            pub fn load(handle: *mut c_void) -> Self {
                Self {
                    handle: handle as usize,
                    $($nh: sym(handle, stringify!($nh)),)*
                    $($nr: sym(handle, stringify!($nr)),)*
                }
            }
        }
    };
}

use crate::ffi::*;
use std::ffi::c_uint;
vgpu_common::entry_points!(gen_real_tables);
