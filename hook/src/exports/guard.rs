//! The panic firewall and the reentrancy guard around every export.
//!
//! A thread already inside the hook (the hook calling the driver, the driver
//! calling back into an exported symbol, a `dlsym` made by the driver) is
//! forwarded untouched: a `thread_local!` flag, not HAMi's ring buffer of
//! recent lookups.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::ffi::{nvmlReturn_t, CUresult, CUDA_ERROR_UNKNOWN, NVML_ERROR_UNKNOWN};

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside the hook's policy code now.
pub fn in_hook() -> bool {
    IN_HOOK.try_with(Cell::get).unwrap_or(true)
}

/// Runs `policy` with the guard set, or `forward` if the thread is already
/// inside the hook (or its thread-locals are gone, at thread exit).
fn enter<R>(name: &str, unknown: R, forward: impl FnOnce() -> R, policy: impl FnOnce() -> R) -> R {
    // One thread-local access per call (each is a `__tls_get_addr` in a
    // shared library): the whole policy runs inside it.
    let inside = IN_HOOK.try_with(|c| {
        if c.replace(true) {
            return None;
        }
        let r = catch_unwind(AssertUnwindSafe(policy));
        c.set(false);
        Some(r)
    });
    match inside {
        // Already inside the hook on this thread, or its thread-locals are
        // gone (thread exit): forward untouched.
        Ok(None) | Err(_) => forward(),
        Ok(Some(Ok(v))) => v,
        Ok(Some(Err(_))) => {
            vlog!(
                crate::log::ERROR,
                "internal error (panic) in {name}; the call reports an unknown error"
            );
            unknown
        }
    }
}

pub fn cuda(
    name: &str,
    forward: impl FnOnce() -> CUresult,
    policy: impl FnOnce() -> CUresult,
) -> CUresult {
    enter(name, CUDA_ERROR_UNKNOWN, forward, policy)
}

pub fn nvml(
    name: &str,
    forward: impl FnOnce() -> nvmlReturn_t,
    policy: impl FnOnce() -> nvmlReturn_t,
) -> nvmlReturn_t {
    enter(name, NVML_ERROR_UNKNOWN, forward, policy)
}
