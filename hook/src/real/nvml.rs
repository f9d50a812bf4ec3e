//! The real libnvidia-ml.so.1, loaded on first use.

use std::sync::OnceLock;

use super::{open_library, NvmlFns};

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

/// Calls the real NVML function `name`, or `NVML_ERROR_FUNCTION_NOT_FOUND`.
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
