//! Stream-ordered allocation: `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`
//! (and their `_ptsz` variants) count each allocation's bytes on the
//! current context's device, keyed by pointer; `cuMemFreeAsync` releases
//! them when it is enqueued. Memory a pool keeps cached after frees is not
//! counted (see docs/hook.md).

use super::track::Entry;
use super::{counted_as, target, uncounted};
use crate::driver::native::Native;
use crate::ffi::*;
use crate::real::cuda::{mem, status};
use crate::region::Kind;
use crate::state::process;

fn alloc(dptr: *mut CUdeviceptr, bytes: usize, call: impl Fn() -> CUresult) -> CUresult {
    let Some((p, dev)) = target(&Native).filter(|_| !dptr.is_null()) else {
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

pub fn alloc_async(dptr: *mut CUdeviceptr, bytes: usize, s: CUstream) -> CUresult {
    alloc(dptr, bytes, || mem::alloc_async(dptr, bytes, s))
}

pub fn alloc_async_ptsz(dptr: *mut CUdeviceptr, bytes: usize, s: CUstream) -> CUresult {
    alloc(dptr, bytes, || mem::alloc_async_ptsz(dptr, bytes, s))
}

pub fn alloc_from_pool(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    alloc(dptr, bytes, || mem::alloc_from_pool(dptr, bytes, pool, s))
}

pub fn alloc_from_pool_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    alloc(dptr, bytes, || {
        mem::alloc_from_pool_ptsz(dptr, bytes, pool, s)
    })
}

pub fn free_async(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    free(dptr, || status(mem::free_async(dptr, s)))
}

pub fn free_async_ptsz(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    free(dptr, || status(mem::free_async_ptsz(dptr, s)))
}
