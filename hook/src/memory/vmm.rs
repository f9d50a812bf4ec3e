//! The virtual memory API's allocation handles: `cuMemCreate` counts a
//! device-located allocation, keyed by handle; the device is
//! `prop->location.id` (the CUDA ordinal the allocation lives on,
//! translated to the container's index). When the memory is given back
//! follows the driver's rule, kept in [`vmm_lifetime`]: at the last of the
//! handle's releases and unmaps.

use super::{counted, vmm_lifetime};
use crate::driver;
use crate::ffi::*;
use crate::region::Kind;
use crate::state::process;

pub fn mem_create(
    forward: impl Fn() -> CUresult,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    _flags: u64,
) -> CUresult {
    let Some(loc) = alloc_prop_location(prop).filter(|_| !handle.is_null()) else {
        return forward();
    };
    if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE || loc.id < 0 {
        let rc = forward();
        vlog!(
            crate::log::DEBUG,
            "cuMemCreate({size}, location type {} id {}) -> {:#x} rc {rc}: not device memory",
            loc.type_,
            loc.id,
            read(handle).unwrap_or(0)
        );
        return rc;
    }
    let (Some(p), Some(dev)) = (process(), crate::devices::index_of(driver::live(), loc.id)) else {
        return forward();
    };
    let rc = counted(
        driver::live(),
        p,
        &p.handles,
        dev,
        size as u64,
        Kind::Data,
        || {
            let rc = forward();
            (rc, read(handle).unwrap_or(0))
        },
    );
    if let Some(h) = read(handle).filter(|&h| rc == CUDA_SUCCESS && h != 0) {
        p.vmm.created(h);
    }
    vlog!(
        crate::log::DEBUG,
        "cuMemCreate({size}, device {dev}) -> {:#x} rc {rc}",
        read(handle).unwrap_or(0)
    );
    rc
}

pub fn mem_release(
    forward: impl Fn() -> CUresult,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    let Some(p) = process() else {
        return forward();
    };
    let rc = vmm_lifetime::release(p, handle, forward);
    vlog!(crate::log::DEBUG, "cuMemRelease({handle:#x}) rc {rc}");
    rc
}

pub fn mem_retain(
    forward: impl Fn() -> CUresult,
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut std::ffi::c_void,
) -> CUresult {
    let Some(p) = process() else {
        return forward();
    };
    let rc = vmm_lifetime::retain(p, || {
        let rc = forward();
        (rc, read(handle).unwrap_or(0))
    });
    vlog!(
        crate::log::DEBUG,
        "cuMemRetainAllocationHandle({addr:?}) -> {:#x} rc {rc}",
        read(handle).unwrap_or(0)
    );
    rc
}

pub fn mem_map(
    forward: impl Fn() -> CUresult,
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    _flags: u64,
) -> CUresult {
    let Some(p) = process() else {
        return forward();
    };
    let rc = vmm_lifetime::map(p, ptr, handle, forward);
    vlog!(
        crate::log::DEBUG,
        "cuMemMap({ptr:#x}, {size}, {offset}, {handle:#x}) rc {rc}"
    );
    rc
}

pub fn mem_unmap(forward: impl Fn() -> CUresult, ptr: CUdeviceptr, size: usize) -> CUresult {
    let Some(p) = process() else {
        return forward();
    };
    let rc = vmm_lifetime::unmap(p, ptr, size as u64, forward);
    vlog!(crate::log::DEBUG, "cuMemUnmap({ptr:#x}, {size}) rc {rc}");
    rc
}
