//! The real libnvidia-ml.so.1, loaded on first use, and the safe layer over
//! it: what the hook asks NVML on its own behalf returns
//! `Result<_, NvmlError>`. A call forwarded with the application's own
//! arguments has no wrapper here: its export makes it (`real_nvml!`) and
//! hands it to the policy function.

use std::sync::OnceLock;

use super::{open_library, NvmlFns};
use crate::ffi::NVML_ERROR_FUNCTION_NOT_FOUND;

pub mod device;
pub mod error;
mod list;
pub mod process;

pub use error::NvmlError;

/// The real NVML functions; `None` when libnvidia-ml.so.1 cannot be loaded.
pub fn fns() -> Option<&'static NvmlFns> {
    static FNS: OnceLock<Option<NvmlFns>> = OnceLock::new();
    FNS.get_or_init(|| {
        let h = open_library(c"libnvidia-ml.so.1");
        if h.is_null() {
            vlog!(crate::log::INFO, "libnvidia-ml.so.1 not loadable");
            return None;
        }
        Some(NvmlFns::load(h))
    })
    .as_ref()
}

/// The real function `pick` selects.
///
/// # Errors
/// `NVML_ERROR_FUNCTION_NOT_FOUND` when the library (or the symbol) is
/// missing.
fn sym<F>(pick: impl FnOnce(&NvmlFns) -> Option<F>) -> Result<F, NvmlError> {
    fns()
        .and_then(pick)
        .ok_or(NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND))
}

/// Calls the real NVML function `name`, or `NVML_ERROR_FUNCTION_NOT_FOUND`.
/// For the generated exports only, each of which builds the call that
/// forwards it with this and hands it to its policy function (`cargo xtask
/// lint` rejects it elsewhere outside `real/`): the hook's own code calls
/// the wrappers of this module, through `crate::driver`.
macro_rules! real_nvml {
    ($name:ident($($a:expr),* $(,)?)) => {
        match $crate::real::nvml::fns().and_then(|t| t.$name) {
            // SAFETY: the real function has the C signature of the hook
            // list; the arguments are the application's own, passed through
            // unchanged, or pointers to live locals of the hook.
            Some(f) => unsafe { f($($a),*) },
            None => $crate::ffi::NVML_ERROR_FUNCTION_NOT_FOUND,
        }
    };
}

/// `nvmlInit_v2`.
///
/// # Errors
/// NVML's code.
#[doc(alias = "nvmlInit_v2")]
pub fn init() -> Result<(), NvmlError> {
    let f = sym(|t| t.nvmlInit_v2)?;
    // SAFETY: no arguments.
    NvmlError::result(unsafe { f() })
}

/// Initialises the real NVML once for the hook's own use (never shut down,
/// so the application's own init/shutdown pairs are unaffected).
pub fn ready() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| init().is_ok())
}
