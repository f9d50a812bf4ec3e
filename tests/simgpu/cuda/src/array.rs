//! CUDA arrays and mipmapped arrays: they cost exactly
//! `width * max(height, 1) * max(depth, 1) * channels * element size` bytes
//! of device memory, summed over mip levels (each level halves every
//! non-zero extent, down to 1).

use std::ffi::c_uint;

use crate::state::with;
use crate::{get, guard, put, CUresult, CuErr, Handle};

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_uint,
    channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
}

/// Bytes per channel element of a `CUarray_format`.
fn element_size(format: c_uint) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // (UN)SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // (UN)SIGNED_INT32, FLOAT
        0xc0 | 0xc6 => 1,        // UNORM_INT8X1, SNORM_INT8X1
        0xc1 | 0xc7 => 2,        // ..INT8X2
        0xc2 | 0xc8 => 4,        // ..INT8X4
        0xc3 | 0xc9 => 2,        // ..INT16X1
        0xc4 | 0xca => 4,        // ..INT16X2
        0xc5 | 0xcb => 8,        // ..INT16X4
        _ => return None,
    })
}

/// Bytes of one level.
fn level_bytes(w: u64, h: u64, d: u64, format: c_uint, channels: c_uint) -> Result<u64, CuErr> {
    let e = element_size(format).ok_or(CuErr::InvalidValue)?;
    if w == 0 || ![1, 2, 4].contains(&channels) {
        return Err(CuErr::InvalidValue);
    }
    w.checked_mul(h.max(1))
        .and_then(|v| v.checked_mul(d.max(1)))
        .and_then(|v| v.checked_mul(u64::from(channels) * e))
        .ok_or(CuErr::OutOfMemory)
}

/// Bytes of a mipmapped array with `levels` levels.
fn mip_bytes(desc: &Array3dDescriptor, levels: u32) -> Result<u64, CuErr> {
    if levels == 0 {
        return Err(CuErr::InvalidValue);
    }
    let (w, h, d) = (desc.width as u64, desc.height as u64, desc.depth as u64);
    let shrink = |x: u64, i: u32| if x == 0 { 0 } else { (x >> i.min(63)).max(1) };
    (0..levels).try_fold(0u64, |acc, i| {
        let b = level_bytes(
            shrink(w, i),
            shrink(h, i),
            shrink(d, i),
            desc.format,
            desc.channels,
        )?;
        acc.checked_add(b).ok_or(CuErr::OutOfMemory)
    })
}

fn create(out: *mut Handle, bytes: u64) -> Result<(), CuErr> {
    if out.is_null() {
        return Err(CuErr::InvalidValue);
    }
    let h = with(|d| {
        let (_, dev) = d.current_ctx()?;
        d.charge(dev, bytes)?;
        let h = d.new_handle();
        d.arrays.insert(h, (dev, bytes));
        Ok(h)
    })?;
    put!(out, h);
    Ok(())
}

fn destroy(h: Handle) -> Result<(), CuErr> {
    with(|d| {
        let (dev, bytes) = d.arrays.remove(&h).ok_or(CuErr::InvalidHandle)?;
        d.uncharge(dev, bytes);
        Ok(())
    })
}

/// `cuArrayCreate_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    array: *mut Handle,
    desc: *const ArrayDescriptor,
) -> CUresult {
    guard(|| {
        let d = get!(desc);
        create(
            array,
            level_bytes(d.width as u64, d.height as u64, 1, d.format, d.channels)?,
        )
    })
}

/// `cuArray3DCreate_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut Handle,
    desc: *const Array3dDescriptor,
) -> CUresult {
    guard(|| {
        let d = get!(desc);
        create(array, mip_bytes(&d, 1)?)
    })
}

/// `cuArrayDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(array: Handle) -> CUresult {
    guard(|| destroy(array))
}

/// `cuMipmappedArrayCreate`.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    array: *mut Handle,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CUresult {
    guard(|| {
        let d = get!(desc);
        create(array, mip_bytes(&d, levels)?)
    })
}

/// `cuMipmappedArrayDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(array: Handle) -> CUresult {
    guard(|| destroy(array))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let d = Array3dDescriptor {
            width: 64,
            height: 32,
            depth: 0,
            format: 0x20,
            channels: 4,
            flags: 0,
        };
        assert_eq!(mip_bytes(&d, 1), Ok(64 * 32 * 16));
        // 64x32, 32x16, 16x8, 8x4, 4x2, 2x1, 1x1
        let texels = 64 * 32 + 32 * 16 + 16 * 8 + 8 * 4 + 4 * 2 + 2 + 1;
        assert_eq!(mip_bytes(&d, 7), Ok(texels * 16));
        assert_eq!(level_bytes(10, 0, 0, 0x01, 1), Ok(10));
        assert_eq!(level_bytes(10, 0, 0, 0x99, 1), Err(CuErr::InvalidValue));
    }
}
