//! CUDA arrays and mipmapped arrays.

use std::ffi::c_uint;

use super::{sym, CuError};
use crate::ffi::*;

/// `cuArrayCreate_v2`, forwarded with the application's pointers.
#[doc(alias = "cuArrayCreate_v2")]
pub fn create(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult {
    let Ok(f) = sym(|t| t.cuArrayCreate_v2) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `handle` and `desc` are the application's pointers of this
    // very call, passed unchanged.
    unsafe { f(handle, desc) }
}

/// `cuArray3DCreate_v2`, forwarded with the application's pointers.
#[doc(alias = "cuArray3DCreate_v2")]
pub fn create_3d(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult {
    let Ok(f) = sym(|t| t.cuArray3DCreate_v2) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: as in `create`.
    unsafe { f(handle, desc) }
}

/// `cuMipmappedArrayCreate`, forwarded with the application's pointers.
#[doc(alias = "cuMipmappedArrayCreate")]
pub fn create_mipmapped(
    handle: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    let Ok(f) = sym(|t| t.cuMipmappedArrayCreate) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: as in `create`.
    unsafe { f(handle, desc, levels) }
}

/// `cuArrayDestroy`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuArrayDestroy")]
pub fn destroy(array: CUarray) -> Result<(), CuError> {
    let f = sym(|t| t.cuArrayDestroy)?;
    // SAFETY: the application's array handle by value; the driver
    // validates it.
    CuError::result(unsafe { f(array) })
}

/// `cuMipmappedArrayDestroy`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuMipmappedArrayDestroy")]
pub fn destroy_mipmapped(array: CUmipmappedArray) -> Result<(), CuError> {
    let f = sym(|t| t.cuMipmappedArrayDestroy)?;
    // SAFETY: as in `destroy`.
    CuError::result(unsafe { f(array) })
}
