//! `cuMemCreate` / `cuMemRelease`: physical allocations of the virtual
//! memory API, counted when their location is a device, keyed by handle.
//! The device is `prop->location.id` (the CUDA ordinal the allocation lives
//! on, translated to the container's index).

use super::{counted, uncounted};
use crate::ffi::*;
use crate::region::Kind;
use crate::state::process;

pub fn mem_create(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let forward = || real_cuda!(cuMemCreate(handle, size, prop, flags));
    if handle.is_null() || prop.is_null() {
        return forward();
    }
    // SAFETY: `prop` is non-NULL and points to a CUmemAllocationProp (API
    // contract); only the `location` field is read, unaligned-tolerant.
    let loc = unsafe { std::ptr::addr_of!((*prop).location).read_unaligned() };
    if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE || loc.id < 0 {
        return forward();
    }
    let (Some(p), Some(dev)) = (process(), crate::devices::index_of(loc.id)) else {
        return forward();
    };
    counted(p, &p.handles, dev, size as u64, Kind::Data, || {
        let rc = forward();
        (rc, read(handle).unwrap_or(0))
    })
}

pub fn mem_release(handle: CUmemGenericAllocationHandle) -> CUresult {
    let Some(p) = process() else {
        return real_cuda!(cuMemRelease(handle));
    };
    uncounted(p, &p.handles, handle, || real_cuda!(cuMemRelease(handle)))
}
