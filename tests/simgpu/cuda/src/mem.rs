//! Device allocations (`cuMemAlloc_v2`, pitch, managed), frees, memory
//! info, and host memory (real memory: programs write to it).

use std::ffi::{c_uint, c_void};

use crate::state::{map_host, unmap_host, with, Alloc, AllocKind};
use crate::{guard, put, CUdeviceptr, CUresult, CuErr};

/// `CU_MEM_ATTACH_GLOBAL` / `CU_MEM_ATTACH_HOST`.
const ATTACH_GLOBAL: u32 = 1;
const ATTACH_HOST: u32 = 2;

fn alloc_device(dptr: *mut CUdeviceptr, bytes: u64) -> Result<(), CuErr> {
    if dptr.is_null() || bytes == 0 {
        return Err(CuErr::InvalidValue);
    }
    let p = with(|d| {
        let (ctx, dev) = d.current_ctx()?;
        d.charge(dev, bytes)?;
        Ok(d.add_alloc(Alloc {
            size: bytes,
            dev,
            charged: bytes,
            kind: AllocKind::Device,
            ctx,
        }))
    })?;
    put!(dptr, p);
    Ok(())
}

/// `cuMemAlloc_v2`: charges `bytesize` to the current context's device.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    guard(|| alloc_device(dptr, bytesize as u64))
}

/// `cuMemAllocPitch_v2`: pitch = width rounded up to 512 bytes; charges
/// pitch × height.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    guard(|| {
        if pitch.is_null() || width == 0 || height == 0 || ![4, 8, 16].contains(&element_size) {
            return Err(CuErr::InvalidValue);
        }
        let p = (width as u64).div_ceil(512) * 512;
        let bytes = p.checked_mul(height as u64).ok_or(CuErr::OutOfMemory)?;
        alloc_device(dptr, bytes)?;
        put!(pitch, p as usize);
        Ok(())
    })
}

/// `cuMemAllocManaged`: real (lazily backed) host memory, charged to the
/// device like `cuMemAlloc`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        if dptr.is_null() || bytesize == 0 || (flags != ATTACH_GLOBAL && flags != ATTACH_HOST) {
            return Err(CuErr::InvalidValue);
        }
        let p = with(|d| {
            let (ctx, dev) = d.current_ctx()?;
            d.charge(dev, bytesize as u64)?;
            let host = match map_host(bytesize) {
                Ok(h) => h,
                Err(e) => {
                    d.uncharge(dev, bytesize as u64);
                    return Err(e);
                }
            };
            d.allocs.insert(
                host as u64,
                Alloc {
                    size: bytesize as u64,
                    dev,
                    charged: bytesize as u64,
                    kind: AllocKind::Managed,
                    ctx,
                },
            );
            Ok(host as u64)
        })?;
        put!(dptr, p);
        Ok(())
    })
}

/// `cuMemFree_v2`: unknown pointers are `CUDA_ERROR_INVALID_VALUE`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard(|| with(|d| d.free_alloc(dptr).map(|_| ())))
}

/// `cuMemGetInfo_v2`: free and total of the current context's device, all
/// processes counted.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(|| {
        let (f, t) = with(|d| {
            let (_, dev) = d.current_ctx()?;
            Ok(simgpu::memory::device_info(d.shm(), dev))
        })?;
        put!(free, f as usize);
        put!(total, t as usize);
        Ok(())
    })
}

/// `cuMemGetAddressRange_v2`: the allocation containing `dptr`.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        let (b, a) = with(|d| d.alloc_containing(dptr).ok_or(CuErr::NotFound))?;
        if !base.is_null() {
            put!(base, b);
        }
        if !size.is_null() {
            put!(size, a.size as usize);
        }
        Ok(())
    })
}

fn alloc_host(pp: *mut *mut c_void, bytes: usize) -> Result<(), CuErr> {
    if pp.is_null() || bytes == 0 {
        return Err(CuErr::InvalidValue);
    }
    let p = with(|d| {
        d.current_ctx()?;
        let p = map_host(bytes)?;
        d.host_blocks.insert(p, bytes);
        Ok(p)
    })?;
    put!(pp, p as *mut c_void);
    Ok(())
}

/// `cuMemAllocHost_v2`: real, zeroed host memory (no device cost).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    guard(|| alloc_host(pp, bytesize))
}

/// `cuMemHostAlloc`: as `cuMemAllocHost_v2`; flags ignored.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytesize: usize,
    _flags: c_uint,
) -> CUresult {
    guard(|| alloc_host(pp, bytesize))
}

/// `cuMemFreeHost`: unknown pointers are `CUDA_ERROR_INVALID_VALUE`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guard(|| {
        let len = with(|d| {
            d.host_blocks
                .remove(&(p as usize))
                .ok_or(CuErr::InvalidValue)
        })?;
        unmap_host(p as usize, len);
        Ok(())
    })
}

/// `cuMemHostGetDevicePointer_v2`: the same address (unified addressing).
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    dptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(CuErr::InvalidValue);
        }
        let a = p as usize;
        if !host_backed(a as u64, 1) {
            return Err(CuErr::InvalidValue);
        }
        put!(dptr, a as u64);
        Ok(())
    })
}

/// `cuMemHostRegister_v2`: bookkeeping only.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    bytesize: usize,
    _flags: c_uint,
) -> CUresult {
    guard(|| {
        if p.is_null() || bytesize == 0 {
            return Err(CuErr::InvalidValue);
        }
        let a = p as usize;
        with(|d| {
            d.current_ctx()?;
            let overlaps = d
                .registered
                .range(..a.saturating_add(bytesize))
                .next_back()
                .is_some_and(|(&b, &l)| b + l > a);
            if overlaps {
                return Err(CuErr::HostMemoryAlreadyRegistered);
            }
            d.registered.insert(a, bytesize);
            Ok(())
        })
    })
}

/// `cuMemHostUnregister`.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    guard(|| {
        with(|d| {
            d.registered
                .remove(&(p as usize))
                .map(|_| ())
                .ok_or(CuErr::HostMemoryNotRegistered)
        })
    })
}

/// Whether `[addr, addr + n)` lies in pinned host memory of this process
/// (`cuMemHostAlloc`, `cuMemAllocHost_v2`, `cuMemHostRegister`): its
/// device address is its host address (unified addressing), so copies and
/// memsets through it reach real memory.
pub(crate) fn host_backed(addr: u64, n: usize) -> bool {
    let (Ok(a), Some(end)) = (usize::try_from(addr), (addr as usize).checked_add(n)) else {
        return false;
    };
    with(|d| {
        let inside = |(&b, &l): (&usize, &usize)| a >= b && end <= b + l;
        Ok(d.host_blocks.iter().any(inside)
            || d.registered.range(..=a).next_back().is_some_and(inside))
    })
    .unwrap_or(false)
}
