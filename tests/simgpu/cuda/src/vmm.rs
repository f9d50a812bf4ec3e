//! Virtual memory management: `cuMemCreate` charges device memory (for a
//! device location; host locations cost none) until every reference to the
//! handle is released *and* every mapping of it is unmapped, as in the real
//! driver: `cuMemCreate` holds one reference, each
//! `cuMemRetainAllocationHandle` adds one, each `cuMemRelease` drops one.
//! Address reservations, mappings and access are bookkeeping.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};

use crate::pool::{PropsHead, LOCATION_DEVICE};
use crate::state::{with, Driver, GRANULARITY};
use crate::{get, guard, put, CUdeviceptr, CUresult, CuErr};

/// A physical allocation handle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Physical {
    pub size: u64,
    /// The device charged (`None`: a host location).
    pub dev: Option<u32>,
    /// The allocation's properties as created (`cuMemGetAllocationPropertiesFromHandle`).
    pub prop: PropsHead,
    /// Mappings of the handle.
    pub maps: u32,
    /// References to the handle not yet released.
    pub refs: u32,
}

impl Physical {
    /// Neither referenced nor mapped: the memory goes back.
    fn dead(&self) -> bool {
        self.refs == 0 && self.maps == 0
    }
}

/// `CUmemAllocationProp` as `cuMemGetAllocationPropertiesFromHandle` fills
/// it: the leading fields as created, the rest zero.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllocationProp {
    pub head: PropsHead,
    pub win32_metadata: *mut c_void,
    pub alloc_flags: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<AllocationProp>() == 32);

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

/// Drops a dead handle and returns its device memory.
fn forget(d: &mut Driver, h: u64, p: Physical) {
    d.vmm.handles.remove(&h);
    if let Some(dev) = p.dev {
        d.uncharge(dev, p.size);
    }
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
                    prop: pr,
                    maps: 0,
                    refs: 1,
                },
            );
            Ok(h)
        })?;
        put!(handle, h);
        Ok(())
    })
}

/// `cuMemRelease`: drops one reference; the memory is returned once no
/// reference is left and the handle is unmapped everywhere.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    guard(|| {
        with(|d| {
            let p = d.vmm.handles.get_mut(&handle).ok_or(CuErr::InvalidValue)?;
            if p.refs == 0 {
                return Err(CuErr::InvalidValue);
            }
            p.refs -= 1;
            let p = *p;
            if p.dead() {
                forget(d, handle, p);
            }
            Ok(())
        })
    })
}

/// `cuMemRetainAllocationHandle`: the handle mapped at `addr` (anywhere in
/// a mapping), with one more reference; an unmapped address is
/// `CUDA_ERROR_INVALID_VALUE`.
#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    addr: *mut c_void,
) -> CUresult {
    guard(|| {
        if handle.is_null() {
            return Err(CuErr::InvalidValue);
        }
        let h = with(|d| {
            let a = addr as u64;
            let h = d
                .vmm
                .mapped
                .range(..=a)
                .next_back()
                .filter(|(&b, &(s, _))| a < b + s)
                .map(|(_, &(_, h))| h)
                .ok_or(CuErr::InvalidValue)?;
            let p = d.vmm.handles.get_mut(&h).ok_or(CuErr::InvalidValue)?;
            p.refs += 1;
            Ok(h)
        })?;
        put!(handle, h);
        Ok(())
    })
}

/// `cuMemGetAllocationPropertiesFromHandle`: the properties the handle was
/// created with.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut AllocationProp,
    handle: u64,
) -> CUresult {
    guard(|| {
        let head = with(|d| {
            let p = d.vmm.handles.get(&handle).ok_or(CuErr::InvalidValue)?;
            if p.refs == 0 {
                return Err(CuErr::InvalidValue);
            }
            Ok(p.prop)
        })?;
        put!(
            prop,
            AllocationProp {
                head,
                win32_metadata: std::ptr::null_mut(),
                alloc_flags: [0; 8],
            }
        );
        Ok(())
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
            if p.refs == 0 || size > p.size {
                return Err(CuErr::InvalidValue);
            }
            p.maps += 1;
            d.vmm.mapped.insert(ptr, (size, handle));
            Ok(())
        })
    })
}

/// `cuMemUnmap`: unmaps every mapping in `[ptr, ptr + size)`, which must
/// start at a mapping and cut none; unmapping the last mapping of a
/// handle without references frees it.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        with(|d| {
            let end = ptr.checked_add(size as u64).ok_or(CuErr::InvalidValue)?;
            let cut_before = d
                .vmm
                .mapped
                .range(..ptr)
                .next_back()
                .is_some_and(|(&b, &(s, _))| b + s > ptr);
            let inside: Vec<(u64, u64, u64)> = d
                .vmm
                .mapped
                .range(ptr..end)
                .map(|(&b, &(s, h))| (b, s, h))
                .collect();
            let cut_after = inside.last().is_some_and(|&(b, s, _)| b + s > end);
            if size == 0 || !d.vmm.mapped.contains_key(&ptr) || cut_before || cut_after {
                return Err(CuErr::InvalidValue);
            }
            for (b, _, h) in inside {
                d.vmm.mapped.remove(&b);
                if let Some(p) = d.vmm.handles.get_mut(&h) {
                    p.maps = p.maps.saturating_sub(1);
                    let p = *p;
                    if p.dead() {
                        forget(d, h, p);
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
