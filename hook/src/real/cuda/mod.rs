//! The real libcuda.so.1, loaded on first use, and the safe layer over it.
//!
//! Each wrapper holds the one `unsafe` call with the contract it relies on.
//! What the hook asks on its own behalf returns `Result<_, CuError>`. A call
//! forwarded with the application's own arguments has no wrapper here: its
//! export makes it (`real_cuda!`, the arguments passed unchanged, the
//! driver's `CUresult` returned) and hands it to the policy function.

use std::sync::OnceLock;

use super::{open_library, CudaFns};
use crate::ffi::CUDA_ERROR_NOT_FOUND;

pub mod ctx;
pub mod device;
pub mod error;
pub mod events;
pub mod mem;

pub use error::{status, CuError};

/// The real driver's functions; `None` when libcuda.so.1 cannot be loaded.
pub fn fns() -> Option<&'static CudaFns> {
    static FNS: OnceLock<Option<CudaFns>> = OnceLock::new();
    FNS.get_or_init(|| {
        let h = open_library(c"libcuda.so.1");
        if h.is_null() {
            vlog!(
                crate::log::ERROR,
                "cannot load libcuda.so.1; CUDA calls fail"
            );
            return None;
        }
        Some(CudaFns::load(h))
    })
    .as_ref()
}

/// The real function `pick` selects.
///
/// # Errors
/// `CUDA_ERROR_NOT_FOUND` when the driver (or the symbol) is missing.
fn sym<F>(pick: impl FnOnce(&CudaFns) -> Option<F>) -> Result<F, CuError> {
    fns().and_then(pick).ok_or(CuError(CUDA_ERROR_NOT_FOUND))
}

/// Calls the real CUDA function `name` with the given arguments, or returns
/// `CUDA_ERROR_NOT_FOUND` when the driver lacks it. For the generated
/// exports only, each of which builds the call that forwards it with this
/// and hands it to its policy function (`cargo xtask lint` rejects it
/// elsewhere outside `real/`): the hook's own code calls the wrappers of
/// this module, through `crate::driver`.
macro_rules! real_cuda {
    ($name:ident($($a:expr),* $(,)?)) => {
        match $crate::real::cuda::fns().and_then(|t| t.$name) {
            // SAFETY: the real function has the C signature of the hook
            // list; the arguments are either the application's own, passed
            // through unchanged, or pointers to live locals of the hook.
            Some(f) => unsafe { f($($a),*) },
            None => $crate::ffi::CUDA_ERROR_NOT_FOUND,
        }
    };
}
