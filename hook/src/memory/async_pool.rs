//! Stream-ordered allocation: `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`
//! (and their `_ptsz` variants) count each allocation's bytes on the
//! current context's device, keyed by pointer; `cuMemFreeAsync` releases
//! them when it is enqueued. Memory a pool keeps cached after frees is not
//! counted (see docs/hook.md).

use super::track::Entry;
use super::{counted_as, target, uncounted};
use crate::driver;
use crate::ffi::*;
use crate::region::Kind;
use crate::state::process;

fn alloc(dptr: *mut CUdeviceptr, bytes: usize, call: impl Fn() -> CUresult) -> CUresult {
    let Some((p, dev)) = target(driver::live()).filter(|_| !dptr.is_null()) else {
        return call();
    };
    // Pool memory belongs to the pool, not to the context.
    let e = Entry::unbound(dev, bytes as u64, Kind::Data);
    counted_as(p, &p.ptrs, e, || {
        let rc = call();
        (rc, read(dptr).unwrap_or(0))
    })
}

fn free(dptr: CUdeviceptr, call: impl FnOnce() -> CUresult) -> CUresult {
    match process().filter(|_| dptr != 0) {
        Some(p) => uncounted(p, &p.ptrs, dptr, call),
        None => call(),
    }
}

/// `cuMemAllocAsync` and its `_ptsz` twin.
pub fn alloc_async(
    forward: impl Fn() -> CUresult,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    _s: CUstream,
) -> CUresult {
    alloc(dptr, bytes, forward)
}

/// `cuMemAllocFromPoolAsync` and its `_ptsz` twin.
pub fn alloc_from_pool(
    forward: impl Fn() -> CUresult,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    _pool: CUmemoryPool,
    _s: CUstream,
) -> CUresult {
    alloc(dptr, bytes, forward)
}

/// `cuMemFreeAsync` and its `_ptsz` twin.
pub fn free_async(forward: impl FnOnce() -> CUresult, dptr: CUdeviceptr, _s: CUstream) -> CUresult {
    free(dptr, forward)
}
