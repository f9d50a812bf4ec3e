//! CUDA arrays and mipmapped arrays, counted from their descriptors.
//!
//! The size is `width × max(height,1) × max(depth,1) × bytes per element`
//! (summed over levels for mipmaps, each level halving every extent down to
//! 1). The element size comes from a bounded `match` on the format: a format
//! the hook does not know is forwarded uncounted with a warning, never read
//! out of a table by index.

use super::{counted, target, uncounted};
use crate::driver;
use crate::ffi::*;
use crate::region::Kind;
use crate::state::process;

/// Bytes per element (all channels) as a fraction `num / den`, for formats
/// whose element is a block (BC*: 4×4 texels per block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElemSize {
    pub num: u64,
    pub den: u64,
}

/// `CUarray_format` → element size, `None` for an unknown format.
pub fn element_size(format: u32, channels: u32) -> Option<ElemSize> {
    let ch = u64::from(channels.max(1));
    let per = |b: u64| {
        Some(ElemSize {
            num: b * ch,
            den: 1,
        })
    };
    let fixed = |num: u64, den: u64| Some(ElemSize { num, den });
    match format {
        0x01 | 0x08 => per(1),        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => per(2), // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => per(4), // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        0xb0 => fixed(3, 2),          // NV12: 1.5 bytes per pixel
        0xc0 | 0xc6 => fixed(1, 1),   // UNORM_INT8X1, SNORM_INT8X1
        0xc1 | 0xc7 | 0xc3 | 0xc9 => fixed(2, 1),
        0xc2 | 0xc8 | 0xc4 | 0xca => fixed(4, 1),
        0xc5 | 0xcb => fixed(8, 1), // UNORM_INT16X4, SNORM_INT16X4
        0x91 | 0x92 | 0x97 | 0x98 => fixed(1, 2), // BC1, BC4: 8 bytes per 16 texels
        0x93..=0x96 | 0x99..=0x9e => fixed(1, 1), // BC2, BC3, BC5, BC6H, BC7
        _ => None,
    }
}

/// Bytes of one level with these extents.
pub fn level_bytes(w: u64, h: u64, d: u64, e: ElemSize) -> Option<u64> {
    w.max(1)
        .checked_mul(h.max(1))?
        .checked_mul(d.max(1))?
        .checked_mul(e.num)
        .map(|b| b.div_ceil(e.den))
}

/// Bytes of a 3D descriptor with `levels` mipmap levels (1 = plain array).
pub fn array3d_bytes(desc: &CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> Option<u64> {
    let e = element_size(desc.format, desc.num_channels)?;
    let (mut w, mut h, mut d) = (desc.width as u64, desc.height as u64, desc.depth as u64);
    let mut total: u64 = 0;
    for _ in 0..levels.max(1) {
        total = total.checked_add(level_bytes(w, h, d, e)?)?;
        if w <= 1 && h <= 1 && d <= 1 {
            break;
        }
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        d = if d == 0 { 0 } else { (d / 2).max(1) };
    }
    Some(total)
}

fn unknown(format: u32) {
    vlog_once!(
        crate::log::WARN,
        "array format {format:#x} is unknown to the hook; such arrays are not counted"
    );
}

fn create(
    handle_out: impl Fn() -> u64,
    bytes: Option<u64>,
    format: u32,
    call: impl Fn() -> CUresult,
) -> CUresult {
    let Some((p, dev)) = target(driver::live()) else {
        return call();
    };
    let Some(bytes) = bytes else {
        unknown(format);
        return call();
    };
    counted(driver::live(), p, &p.arrays, dev, bytes, Kind::Data, || {
        (call(), handle_out())
    })
}

pub fn array_create(
    forward: impl Fn() -> CUresult,
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    let Some(d) = read(desc).filter(|_| !handle.is_null()) else {
        return forward();
    };
    let bytes = element_size(d.format, d.num_channels)
        .and_then(|e| level_bytes(d.width as u64, d.height as u64, 1, e));
    create(
        || read(handle).map_or(0, |h| h as u64),
        bytes,
        d.format,
        forward,
    )
}

pub fn array3d_create(
    forward: impl Fn() -> CUresult,
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    let Some(d) = read(desc).filter(|_| !handle.is_null()) else {
        return forward();
    };
    create(
        || read(handle).map_or(0, |h| h as u64),
        array3d_bytes(&d, 1),
        d.format,
        forward,
    )
}

pub fn mipmapped_create(
    forward: impl Fn() -> CUresult,
    handle: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: std::ffi::c_uint,
) -> CUresult {
    let Some(d) = read(desc).filter(|_| !handle.is_null()) else {
        return forward();
    };
    create(
        || read(handle).map_or(0, |h| h as u64),
        array3d_bytes(&d, levels),
        d.format,
        forward,
    )
}

pub fn array_destroy(forward: impl FnOnce() -> CUresult, a: CUarray) -> CUresult {
    match process() {
        Some(p) => uncounted(p, &p.arrays, a as u64, forward),
        None => forward(),
    }
}

pub fn mipmapped_destroy(forward: impl FnOnce() -> CUresult, a: CUmipmappedArray) -> CUresult {
    match process() {
        Some(p) => uncounted(p, &p.arrays, a as u64, forward),
        None => forward(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d3(w: usize, h: usize, d: usize, format: u32, ch: u32) -> CUDA_ARRAY3D_DESCRIPTOR {
        CUDA_ARRAY3D_DESCRIPTOR {
            width: w,
            height: h,
            depth: d,
            format,
            num_channels: ch,
            flags: 0,
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(
            array3d_bytes(&d3(1024, 1024, 0, 0x20, 4), 1),
            Some(16 << 20)
        );
        assert_eq!(array3d_bytes(&d3(256, 0, 0, 0x01, 1), 1), Some(256));
        assert_eq!(
            array3d_bytes(&d3(64, 64, 64, 0x02, 2), 1),
            Some(64 * 64 * 64 * 4)
        );
        // 4 levels of 8x8 float: 256 + 64 + 16 + 4
        assert_eq!(array3d_bytes(&d3(8, 8, 0, 0x20, 1), 4), Some(340));
        // Levels beyond 1x1 stop.
        assert_eq!(array3d_bytes(&d3(2, 2, 0, 0x01, 1), 10), Some(4 + 1));
        assert_eq!(array3d_bytes(&d3(16, 16, 0, 0x91, 1), 1), Some(128));
        assert_eq!(array3d_bytes(&d3(16, 16, 0, 0x77, 1), 1), None);
        assert_eq!(array3d_bytes(&d3(usize::MAX, 2, 0, 0x20, 4), 1), None);
    }
}
