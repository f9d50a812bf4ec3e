//! `nvmlReturn_t` as a Rust error: a newtype over NVML's code, named by one
//! exhaustive map of nvml.h's `nvmlReturn_t`, keeping codes it does not know.

use crate::ffi::{nvmlReturn_t, NVML_SUCCESS};

/// An `nvmlReturn_t` other than `NVML_SUCCESS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{} ({})", self.name().unwrap_or("unknown nvmlReturn_t"), self.0)]
pub struct NvmlError(pub nvmlReturn_t);

impl NvmlError {
    /// `Ok(())` for `NVML_SUCCESS`, else the error.
    ///
    /// # Errors
    /// Every code but `NVML_SUCCESS`.
    pub fn result(rc: nvmlReturn_t) -> Result<(), Self> {
        if rc == NVML_SUCCESS {
            Ok(())
        } else {
            Err(Self(rc))
        }
    }

    /// NVML's code.
    pub fn code(self) -> nvmlReturn_t {
        self.0
    }

    /// The nvml.h name of the code, `None` for one this map does not know.
    pub fn name(self) -> Option<&'static str> {
        name(self.0)
    }
}

/// nvml.h's name of `rc`.
fn name(rc: nvmlReturn_t) -> Option<&'static str> {
    Some(match rc {
        0 => "NVML_SUCCESS",
        1 => "NVML_ERROR_UNINITIALIZED",
        2 => "NVML_ERROR_INVALID_ARGUMENT",
        3 => "NVML_ERROR_NOT_SUPPORTED",
        4 => "NVML_ERROR_NO_PERMISSION",
        5 => "NVML_ERROR_ALREADY_INITIALIZED",
        6 => "NVML_ERROR_NOT_FOUND",
        7 => "NVML_ERROR_INSUFFICIENT_SIZE",
        8 => "NVML_ERROR_INSUFFICIENT_POWER",
        9 => "NVML_ERROR_DRIVER_NOT_LOADED",
        10 => "NVML_ERROR_TIMEOUT",
        11 => "NVML_ERROR_IRQ_ISSUE",
        12 => "NVML_ERROR_LIBRARY_NOT_FOUND",
        13 => "NVML_ERROR_FUNCTION_NOT_FOUND",
        14 => "NVML_ERROR_CORRUPTED_INFOROM",
        15 => "NVML_ERROR_GPU_IS_LOST",
        16 => "NVML_ERROR_RESET_REQUIRED",
        17 => "NVML_ERROR_OPERATING_SYSTEM",
        18 => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        19 => "NVML_ERROR_IN_USE",
        20 => "NVML_ERROR_MEMORY",
        21 => "NVML_ERROR_NO_DATA",
        22 => "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
        23 => "NVML_ERROR_INSUFFICIENT_RESOURCES",
        24 => "NVML_ERROR_FREQ_NOT_SUPPORTED",
        25 => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
        26 => "NVML_ERROR_DEPRECATED",
        27 => "NVML_ERROR_NOT_READY",
        28 => "NVML_ERROR_GPU_NOT_FOUND",
        29 => "NVML_ERROR_INVALID_STATE",
        30 => "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED",
        999 => "NVML_ERROR_UNKNOWN",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_codes_are_named_and_unknown_ones_kept() {
        assert_eq!(NvmlError::result(0), Ok(()));
        let e = NvmlError::result(7).unwrap_err();
        assert_eq!(e.to_string(), "NVML_ERROR_INSUFFICIENT_SIZE (7)");
        assert_eq!(NvmlError(4242).to_string(), "unknown nvmlReturn_t (4242)");
        assert_eq!(NvmlError(4242).code(), 4242);
        assert_eq!(NvmlError::result(NVML_SUCCESS), Ok(()));
    }
}
