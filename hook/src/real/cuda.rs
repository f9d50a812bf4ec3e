//! The real libcuda.so.1, loaded on first use.

use std::sync::OnceLock;

use super::{open_library, CudaFns};

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

/// Calls the real CUDA function `name` with the given arguments, or returns
/// `CUDA_ERROR_NOT_FOUND` when the driver lacks it.
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
