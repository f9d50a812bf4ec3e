//! The exported `dlsym`, so a program that `dlopen`s libcuda or NVML (the
//! CUDA runtime, nvidia-smi) and resolves entry points by name gets the
//! hook's wrappers.
//!
//! Only *exact* hooked names looked up in a handle whose symbol is the real
//! driver's are answered with a wrapper (`curl_*` and friends are not CUDA).
//! Everything else — `RTLD_DEFAULT`, `RTLD_NEXT`, unhooked names, lookups
//! made from inside the hook — is a *tail jump* into glibc's `dlsym` with
//! the caller's own return address still on the stack, so glibc resolves
//! `RTLD_NEXT` relative to the real caller exactly as without the hook
//! (a Rust function calling glibc would make every `RTLD_NEXT` lookup
//! relative to libvgpu.so instead, and a wrapper preloaded after the hook
//! would find itself as its own "next" and recurse). On x86_64 and aarch64
//! that takes a few instructions of assembly; other architectures use a
//! plain call (RTLD_NEXT from other objects is then resolved relative to
//! libvgpu.so).

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{guard, lookup, Lib};
use crate::real;

/// Decides a `dlsym` call. Returns glibc's `dlsym` to jump to with the
/// original arguments, or NULL after storing the hook's answer in `*out`.
extern "C" fn route(
    handle: *mut c_void,
    symbol: *const c_char,
    out: *mut *mut c_void,
) -> *const c_void {
    let Some(real_dlsym) = real::real_dlsym() else {
        crate::ffi::write(out, std::ptr::null_mut());
        return std::ptr::null();
    };
    match catch_unwind(AssertUnwindSafe(|| decide(handle, symbol))) {
        Ok(Some(ours)) => {
            crate::ffi::write(out, ours);
            std::ptr::null()
        }
        _ => real_dlsym as *const c_void,
    }
}

/// The hook's wrapper when `symbol` is hooked and `handle` resolves it to
/// the real driver's function; `None` to let glibc answer.
fn decide(handle: *mut c_void, symbol: *const c_char) -> Option<*mut c_void> {
    if symbol.is_null() || handle.is_null() || handle == libc::RTLD_NEXT || guard::in_hook() {
        return None;
    }
    // SAFETY: `symbol` is a non-NULL C string, dlsym's contract.
    let name = unsafe { CStr::from_ptr(symbol) };
    let bytes = name.to_bytes();
    if !(bytes.starts_with(b"cu") || bytes.starts_with(b"nvml")) {
        return None;
    }
    let (lib, ours) = lookup(bytes)?;
    let theirs = real::lookup(handle, name);
    if theirs.is_null() {
        return None;
    }
    let driver_handle = match lib {
        Lib::Cuda => real::cuda::fns()?.handle,
        Lib::Nvml => real::nvml::fns()?.handle,
    } as *mut c_void;
    let driver = real::lookup(driver_handle, name);
    if driver == theirs {
        vlog!(crate::log::DEBUG, "dlsym({:?}) -> hook", name);
        Some(ours)
    } else {
        None
    }
}

/// glibc `dlsym`, interposed.
///
/// # Safety
/// 1. Same contract as glibc's `dlsym`.
// Not in unit tests: the test binary must not interpose its own dlsym.
#[cfg(all(target_arch = "x86_64", not(test)))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Entry: rsp = 8 mod 16. Save the two arguments, reserve an 8-byte out
    // slot keeping rsp 16-aligned at the call, call `route(handle, symbol,
    // &out)`, restore, and either tail-jump to glibc's dlsym (the caller's
    // return address is again on top of the stack) or return `out`.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 24",
        "mov rdx, rsp",
        "call {route}",
        "mov rcx, [rsp]",
        "add rsp, 24",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "mov rax, rcx",
        "ret",
        route = sym route,
    )
}

/// glibc `dlsym`, interposed.
///
/// # Safety
/// 1. Same contract as glibc's `dlsym`.
// Not in unit tests: the test binary must not interpose its own dlsym.
#[cfg(all(target_arch = "aarch64", not(test)))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Entry: x0 = handle, x1 = symbol, x30 = the caller's return address,
    // which glibc's dlsym reads. Push a 48-byte frame (sp stays 16-aligned):
    // x29/x30, the two arguments, an 8-byte out slot. Call `route(handle,
    // symbol, &out)`, restore, and either branch to glibc's dlsym with x30
    // again the caller's (x16: the register an indirect tail branch uses,
    // which BTI landing pads accept) or return `out`.
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-48]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "add x2, sp, #32",
        "bl {route}",
        "mov x16, x0",
        "ldr x9, [sp, #32]",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #48",
        "cbz x16, 2f",
        "br x16",
        "2:",
        "mov x0, x9",
        "ret",
        route = sym route,
    )
}

/// glibc `dlsym`, interposed (portable version).
///
/// # Safety
/// 1. Same contract as glibc's `dlsym`.
#[cfg(all(not(any(target_arch = "x86_64", target_arch = "aarch64")), not(test)))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let mut out = std::ptr::null_mut();
    let f = route(handle, symbol, &mut out);
    if f.is_null() {
        return out;
    }
    // SAFETY: `route` returns glibc's dlsym, which has this signature.
    let real: unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void =
        unsafe { std::mem::transmute(f) };
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real(handle, symbol) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decides `name` in `handle` the way the exported `dlsym` does: `None`
    /// when glibc answers, `Some(out)` when the hook does.
    fn routed(handle: *mut c_void, name: Option<&CStr>) -> Option<*mut c_void> {
        let mut out = std::ptr::dangling_mut::<c_void>();
        let symbol = name.map_or(std::ptr::null(), CStr::as_ptr);
        let jump = route(handle, symbol, &mut out);
        let glibc = real::real_dlsym().map(|f| f as *const c_void);
        if jump.is_null() {
            Some(out)
        } else {
            assert_eq!(Some(jump), glibc, "route jumps only to glibc's dlsym");
            None
        }
    }

    #[test]
    fn glibc_answers_everything_the_driver_does_not_define() {
        let default = libc::RTLD_DEFAULT;
        // Not CUDA, a NULL name, a NULL handle, RTLD_NEXT.
        assert_eq!(routed(default, Some(c"strlen")), None);
        assert_eq!(routed(default, None), None);
        assert_eq!(routed(std::ptr::null_mut(), Some(c"cuMemAlloc_v2")), None);
        assert_eq!(routed(libc::RTLD_NEXT, Some(c"cuMemAlloc_v2")), None);
        // A hooked name the handle does not resolve (no driver in this
        // process): the caller gets glibc's answer, not a wrapper.
        assert!(lookup(b"cuMemAlloc_v2").is_some());
        assert_eq!(routed(default, Some(c"cuMemAlloc_v2")), None);
        // An unhooked CUDA name.
        assert_eq!(routed(default, Some(c"cuStreamCreate")), None);
    }

    #[test]
    fn a_lookup_made_from_inside_the_hook_is_never_redirected() {
        let inside = guard::cuda(
            "test",
            || crate::ffi::CUDA_ERROR_UNKNOWN,
            || {
                assert!(guard::in_hook());
                assert_eq!(decide(libc::RTLD_DEFAULT, c"cuMemAlloc_v2".as_ptr()), None);
                crate::ffi::CUDA_SUCCESS
            },
        );
        assert_eq!(inside, crate::ffi::CUDA_SUCCESS);
        assert!(!guard::in_hook());
    }
}
