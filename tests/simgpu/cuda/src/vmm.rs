//! Virtual memory management: `cuMemCreate` charges device memory (for a
//! device location; host locations cost none) until the handle is released
//! *and* every mapping of it is unmapped, as in the real driver. Address
//! reservations, mappings and access are bookkeeping.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};

use crate::pool::{PropsHead, LOCATION_DEVICE};
use crate::state::{with, GRANULARITY};
use crate::{get, guard, put, CUdeviceptr, CUresult, CuErr};

/// A physical allocation handle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Physical {
    pub size: u64,
    pub dev: Option<u32>,
    pub maps: u32,
    pub released: bool,
}

/// VMM state of the process.
#[derive(Debug, Default)]
pub(crate) struct Vmm {
    pub handles: HashMap<u64, Physical>,
    pub next: u64,
    /// Reserved VA ranges: start → size.
    pub reserved: BTreeMap<u64, u64>,
    /// Mappings: start → (size, handle).
    pub mapped: BTreeMap<u64, (u64, u64)>,
}

/// `cuMemGetAllocationGranularity`: 2 MiB (minimum and recommended).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const PropsHead,
    _option: c_int,
) -> CUresult {
    guard(|| {
        let _ = get!(prop);
        put!(granularity, GRANULARITY as usize);
        Ok(())
    })
}

/// `cuMemCreate`: `size` must be a multiple of the granularity.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const PropsHead,
    _flags: u64,
) -> CUresult {
    guard(|| {
        let pr = get!(prop);
        if handle.is_null() || size == 0 || !(size as u64).is_multiple_of(GRANULARITY) {
            return Err(CuErr::InvalidValue);
        }
        let h = with(|d| {
            let dev = match pr.location_type {
                LOCATION_DEVICE => Some(d.dev(pr.location_id)?),
                2..=4 => None,
                _ => return Err(CuErr::InvalidValue),
            };
            if let Some(dev) = dev {
                d.charge(dev, size as u64)?;
            }
            d.vmm.next += 1;
            let h = 0x7e00_0000 + d.vmm.next;
            d.vmm.handles.insert(
                h,
                Physical {
                    size: size as u64,
                    dev,
                    maps: 0,
                    released: false,
                },
            );
            Ok(h)
        })?;
        put!(handle, h);
        Ok(())
    })
}

/// `cuMemRelease`: memory is returned once the handle is also unmapped
/// everywhere.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    guard(|| {
        with(|d| {
            let p = d.vmm.handles.get_mut(&handle).ok_or(CuErr::InvalidValue)?;
            if p.released {
                return Err(CuErr::InvalidValue);
            }
            p.released = true;
            let p = *p;
            if p.maps == 0 {
                d.vmm.handles.remove(&handle);
                if let Some(dev) = p.dev {
                    d.uncharge(dev, p.size);
                }
            }
            Ok(())
        })
    })
}

/// `cuMemAddressReserve`: a fresh VA range (the `addr` hint is ignored).
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    _alignment: usize,
    _addr: CUdeviceptr,
    _flags: u64,
) -> CUresult {
    guard(|| {
        if ptr.is_null() || size == 0 {
            return Err(CuErr::InvalidValue);
        }
        let p = with(|d| {
            let p = d.new_addr(size as u64);
            d.vmm.reserved.insert(p, size as u64);
            Ok(p)
        })?;
        put!(ptr, p);
        Ok(())
    })
}

/// `cuMemAddressFree`: must match a reservation.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        with(|d| match d.vmm.reserved.get(&ptr) {
            Some(&s) if s == size as u64 => {
                d.vmm.reserved.remove(&ptr);
                Ok(())
            }
            _ => Err(CuErr::InvalidValue),
        })
    })
}

/// `cuMemMap`: the range must lie in a reservation and be unmapped.
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    _offset: usize,
    handle: u64,
    _flags: u64,
) -> CUresult {
    guard(|| {
        with(|d| {
            let size = size as u64;
            let in_reservation = d
                .vmm
                .reserved
                .range(..=ptr)
                .next_back()
                .is_some_and(|(&b, &s)| ptr + size <= b + s);
            let overlaps = d
                .vmm
                .mapped
                .range(..ptr + size)
                .next_back()
                .is_some_and(|(&b, &(s, _))| b + s > ptr);
            if size == 0 || !in_reservation || overlaps {
                return Err(CuErr::InvalidValue);
            }
            let p = d.vmm.handles.get_mut(&handle).ok_or(CuErr::InvalidHandle)?;
            if p.released || size > p.size {
                return Err(CuErr::InvalidValue);
            }
            p.maps += 1;
            d.vmm.mapped.insert(ptr, (size, handle));
            Ok(())
        })
    })
}

/// `cuMemUnmap`: unmapping the last mapping of a released handle frees it.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        with(|d| {
            let &(s, h) = d.vmm.mapped.get(&ptr).ok_or(CuErr::InvalidValue)?;
            if s != size as u64 {
                return Err(CuErr::InvalidValue);
            }
            d.vmm.mapped.remove(&ptr);
            if let Some(p) = d.vmm.handles.get_mut(&h) {
                p.maps = p.maps.saturating_sub(1);
                let p = *p;
                if p.released && p.maps == 0 {
                    d.vmm.handles.remove(&h);
                    if let Some(dev) = p.dev {
                        d.uncharge(dev, p.size);
                    }
                }
            }
            Ok(())
        })
    })
}

/// `cuMemSetAccess`: the range must lie in one reservation.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const c_void,
    count: usize,
) -> CUresult {
    guard(|| {
        if count == 0 || desc.is_null() {
            return Err(CuErr::InvalidValue);
        }
        with(|d| {
            let mapped = d
                .vmm
                .reserved
                .range(..=ptr)
                .next_back()
                .is_some_and(|(&b, &s)| ptr + size as u64 <= b + s);
            if mapped {
                Ok(())
            } else {
                Err(CuErr::InvalidValue)
            }
        })
    })
}
