//! `cuMemCreate` / `cuMemRelease`: physical allocations of the virtual
//! memory API, counted when their location is a device, keyed by handle.
//! The device is `prop->location.id` (the CUDA ordinal the allocation lives
//! on, translated to the container's index).

use super::{counted, uncounted};
use crate::ffi::*;
use crate::real::cuda::{mem, status};
use crate::region::Kind;
use crate::state::process;

pub fn mem_create(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let forward = || mem::create(handle, size, prop, flags);
    let Some(loc) = alloc_prop_location(prop).filter(|_| !handle.is_null()) else {
        return forward();
    };
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
        return status(mem::release(handle));
    };
    uncounted(p, &p.handles, handle, || status(mem::release(handle)))
}
