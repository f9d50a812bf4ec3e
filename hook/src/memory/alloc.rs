//! `cuMemAlloc_v2`, `cuMemAllocPitch_v2`, `cuMemAllocManaged`, `cuMemFree_v2`.

use super::limit;
use super::oversubscribe;
use super::{counted, target, target_in, uncounted};
use crate::driver;
use crate::driver::{Context, Memory, Nvml};
use crate::ffi::*;
use crate::region::Kind;
use crate::state::{process, Process};

pub fn mem_alloc(
    forward: impl Fn() -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
) -> CUresult {
    mem_alloc_in(driver::live(), process(), forward, dptr, bytesize)
}

/// `cuMemAlloc_v2` over the driver `d` for the process state `p`;
/// `forward` makes the application's call.
#[inline]
pub(crate) fn mem_alloc_in(
    d: &(impl Context + Memory + Nvml),
    p: Option<&Process>,
    forward: impl Fn() -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
) -> CUresult {
    let Some((p, dev)) = target_in(d, p).filter(|_| !dptr.is_null()) else {
        return forward();
    };
    counted(d, p, &p.ptrs, dev, bytesize as u64, Kind::Data, || {
        let rc = oversubscribe::on_device(d, bytesize as u64, &forward);
        let rc = oversubscribe::or_host(d, p, rc, dev, bytesize as u64, dptr);
        (rc, read(dptr).unwrap_or(0))
    })
}

pub fn mem_alloc_managed(
    forward: impl Fn() -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    _flags: std::ffi::c_uint,
) -> CUresult {
    let Some((p, dev)) = target(driver::live()).filter(|_| !dptr.is_null()) else {
        return forward();
    };
    counted(
        driver::live(),
        p,
        &p.ptrs,
        dev,
        bytesize as u64,
        Kind::Data,
        || {
            let rc = forward();
            (rc, read(dptr).unwrap_or(0))
        },
    )
}

/// The driver's pitch alignment is at most this on current GPUs; the
/// reservation uses it as an upper bound and is corrected to the pitch the
/// driver returns.
const PITCH_BOUND: u64 = 512;

pub fn pitch_upper_bound(width: usize, height: usize) -> Option<u64> {
    (width as u64)
        .checked_next_multiple_of(PITCH_BOUND)?
        .checked_mul(height as u64)
}

pub fn mem_alloc_pitch(
    forward: impl Fn() -> CUresult,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _elem: std::ffi::c_uint,
) -> CUresult {
    let Some((p, dev)) = target(driver::live()).filter(|_| !dptr.is_null() && !pitch.is_null())
    else {
        return forward();
    };
    let Some(bound) = pitch_upper_bound(width, height) else {
        return forward();
    };
    let rc = counted(driver::live(), p, &p.ptrs, dev, bound, Kind::Data, || {
        let rc = oversubscribe::on_device(driver::live(), bound, forward);
        let shape = (width, height, PITCH_BOUND);
        let rc = oversubscribe::or_host_pitched(driver::live(), p, rc, dev, shape, dptr, pitch);
        (rc, read(dptr).unwrap_or(0))
    });
    if rc != CUDA_SUCCESS {
        return rc;
    }
    // Correct the reservation to pitch * height as returned.
    let ptr = read(dptr).unwrap_or(0);
    let actual = (read(pitch).unwrap_or(0) as u64).saturating_mul(height as u64);
    if actual < bound {
        limit::release_counted(&p.att, dev, bound - actual, Kind::Data);
    } else if actual > bound {
        let Some(more) = limit::reserve(&p.att, dev, actual - bound, Kind::Data) else {
            let _ = uncounted(p, &p.ptrs, ptr, || free_any(p, ptr));
            return CUDA_ERROR_OUT_OF_MEMORY;
        };
        more.commit();
    }
    p.ptrs.insert(
        ptr,
        super::track::Entry::here(driver::live(), dev, actual, Kind::Data),
    );
    rc
}

pub fn mem_free(forward: impl FnOnce() -> CUresult, dptr: CUdeviceptr) -> CUresult {
    mem_free_in(process(), forward, dptr)
}

/// `cuMemFree_v2` for the process state `p`; `forward` makes the
/// application's call.
#[inline]
pub(crate) fn mem_free_in(
    p: Option<&Process>,
    forward: impl FnOnce() -> CUresult,
    dptr: CUdeviceptr,
) -> CUresult {
    let Some(p) = p.filter(|_| dptr != 0) else {
        return forward();
    };
    uncounted(p, &p.ptrs, dptr, || {
        oversubscribe::free(p, dptr).unwrap_or_else(forward)
    })
}

/// Frees device memory, or host memory that served a device allocation.
fn free_any(p: &Process, dptr: CUdeviceptr) -> CUresult {
    oversubscribe::free(p, dptr).unwrap_or_else(|| driver::live().mem_free(dptr))
}
