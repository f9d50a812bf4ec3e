//! Stream-ordered allocation with memory pools.
//!
//! A pool holds *reserved* device memory (charged to the process) and hands
//! out *used* memory from it. An allocation that does not fit grows the
//! reservation by the shortfall rounded up to 2 MiB. `cuMemFreeAsync` only
//! returns memory to the pool; at the next stream / event / context
//! synchronization every pool releases reserved memory down to
//! `max(used rounded up to 2 MiB, RELEASE_THRESHOLD)` (default threshold 0,
//! as in the real driver). `cuMemPoolTrimTo` releases down to
//! `max(used rounded up, minBytesToKeep)` at once. Pools located on the host
//! cost no device memory.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};

use crate::state::{with, Alloc, AllocKind, Driver, GRANULARITY};
use crate::{get, guard, put, CUdevice, CUdeviceptr, CUresult, CuErr, Handle};

/// A memory pool.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pool {
    /// Device it reserves on; None for host pools.
    pub dev: Option<u32>,
    /// The device's default pool (cannot be destroyed).
    pub is_default: bool,
    pub reserved: u64,
    pub reserved_high: u64,
    pub used: u64,
    pub used_high: u64,
    pub threshold: u64,
    pub destroyed: bool,
    pub attrs: [i32; 4],
}

/// All pools of the process.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    pub pools: HashMap<Handle, Pool>,
    pub default: HashMap<u32, Handle>,
    pub current: HashMap<u32, Handle>,
}

impl Driver {
    fn default_pool(&mut self, dev: u32) -> Handle {
        if let Some(&h) = self.pools.default.get(&dev) {
            return h;
        }
        let h = self.new_handle();
        self.pools.pools.insert(
            h,
            Pool {
                dev: Some(dev),
                is_default: true,
                attrs: [1, 1, 1, 0],
                ..Default::default()
            },
        );
        self.pools.default.insert(dev, h);
        h
    }

    fn current_pool(&mut self, dev: u32) -> Handle {
        match self.pools.current.get(&dev) {
            Some(&h) => h,
            None => self.default_pool(dev),
        }
    }

    fn pool_alloc(&mut self, pool: Handle, size: u64) -> Result<u64, CuErr> {
        if size == 0 {
            return Err(CuErr::InvalidValue);
        }
        let p = self.pools.pools.get(&pool).ok_or(CuErr::InvalidValue)?;
        if p.destroyed {
            return Err(CuErr::InvalidValue);
        }
        let (dev, reserved, used) = (p.dev, p.reserved, p.used);
        let need = used.saturating_add(size);
        let grow = if need > reserved {
            (need - reserved).div_ceil(GRANULARITY) * GRANULARITY
        } else {
            0
        };
        if let Some(dev) = dev {
            self.charge(dev, grow)?;
        }
        if let Some(p) = self.pools.pools.get_mut(&pool) {
            p.reserved += grow;
            p.reserved_high = p.reserved_high.max(p.reserved);
            p.used = need;
            p.used_high = p.used_high.max(need);
        }
        Ok(self.add_alloc(Alloc {
            size,
            dev: dev.unwrap_or(0),
            charged: 0,
            kind: AllocKind::Pool(pool),
            ctx: 0,
        }))
    }

    /// Returns `size` bytes to `pool` (called when an allocation is freed).
    pub(crate) fn pool_free(&mut self, pool: Handle, size: u64) {
        let destroyed = match self.pools.pools.get_mut(&pool) {
            Some(p) => {
                p.used = p.used.saturating_sub(size);
                p.destroyed
            }
            None => return,
        };
        if destroyed {
            self.trim_pool(pool, 0);
        }
    }

    /// Releases reserved memory of `pool` down to `max(used rounded up,
    /// keep)`; a destroyed pool with nothing used disappears.
    fn trim_pool(&mut self, pool: Handle, keep: u64) {
        let Some(p) = self.pools.pools.get_mut(&pool) else {
            return;
        };
        let floor = (p.used.div_ceil(GRANULARITY) * GRANULARITY).max(keep);
        let release = p.reserved.saturating_sub(floor);
        p.reserved -= release;
        let (dev, gone) = (p.dev, p.destroyed && p.used == 0);
        if gone {
            self.pools.pools.remove(&pool);
        }
        if let Some(dev) = dev {
            self.uncharge(dev, release);
        }
    }

    /// Post-synchronization: pools give back memory above their threshold.
    pub(crate) fn settle_pools(&mut self) {
        let all: Vec<(Handle, u64)> = self
            .pools
            .pools
            .iter()
            .map(|(&h, p)| (h, p.threshold))
            .collect();
        for (h, threshold) in all {
            self.trim_pool(h, threshold);
        }
    }
}

fn alloc_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<Handle>,
    stream: Handle,
    per_thread: bool,
) -> Result<(), CuErr> {
    if dptr.is_null() {
        return Err(CuErr::InvalidValue);
    }
    let p = with(|d| {
        let r = d.resolve_stream(stream, per_thread)?;
        let pool = match pool {
            Some(p) => p,
            None => d.current_pool(r.dev),
        };
        d.pool_alloc(pool, size as u64)
    })?;
    put!(dptr, p);
    Ok(())
}

/// `cuMemAllocAsync`: from the current pool of the stream's device.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: Handle,
) -> CUresult {
    guard(|| alloc_async(dptr, size, None, stream, false))
}

/// `cuMemAllocAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: Handle,
) -> CUresult {
    guard(|| alloc_async(dptr, size, None, stream, true))
}

/// `cuMemAllocFromPoolAsync`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Handle,
    stream: Handle,
) -> CUresult {
    guard(|| alloc_async(dptr, size, Some(pool), stream, false))
}

/// `cuMemAllocFromPoolAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Handle,
    stream: Handle,
) -> CUresult {
    guard(|| alloc_async(dptr, size, Some(pool), stream, true))
}

fn free_async(dptr: CUdeviceptr, stream: Handle, per_thread: bool) -> Result<(), CuErr> {
    with(|d| {
        d.resolve_stream(stream, per_thread)?;
        d.free_alloc(dptr).map(|_| ())
    })
}

/// `cuMemFreeAsync`: the memory returns to its pool; the pool releases it
/// at the next synchronization (above its release threshold).
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    guard(|| free_async(dptr, stream, false))
}

/// `cuMemFreeAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    guard(|| free_async(dptr, stream, true))
}

/// The part of `CUmemPoolProps` / `CUmemAllocationProp` read here.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PropsHead {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub(crate) const LOCATION_DEVICE: c_int = 1;

/// `cuMemPoolCreate`: device pools reserve on `location.id`; host pools
/// cost no device memory.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut Handle, props: *const PropsHead) -> CUresult {
    guard(|| {
        let pr = get!(props);
        if pool.is_null() {
            return Err(CuErr::InvalidValue);
        }
        let h = with(|d| {
            let dev = match pr.location_type {
                LOCATION_DEVICE => Some(d.dev(pr.location_id)?),
                2..=4 => None,
                _ => return Err(CuErr::InvalidValue),
            };
            let h = d.new_handle();
            d.pools.pools.insert(
                h,
                Pool {
                    dev,
                    attrs: [1, 1, 1, 0],
                    ..Default::default()
                },
            );
            Ok(h)
        })?;
        put!(pool, h);
        Ok(())
    })
}

/// `cuMemPoolDestroy`: releases what is not in use now, the rest as it is
/// freed. Default pools cannot be destroyed.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            let p = d.pools.pools.get_mut(&pool).ok_or(CuErr::InvalidValue)?;
            if p.is_default || p.destroyed {
                return Err(CuErr::InvalidValue);
            }
            p.destroyed = true;
            d.pools.current.retain(|_, &mut h| h != pool);
            d.trim_pool(pool, 0);
            Ok(())
        })
    })
}

/// `cuMemPoolTrimTo`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: Handle, min_bytes_to_keep: usize) -> CUresult {
    guard(|| {
        with(|d| {
            if !d.pools.pools.contains_key(&pool) {
                return Err(CuErr::InvalidValue);
            }
            d.trim_pool(pool, min_bytes_to_keep as u64);
            Ok(())
        })
    })
}

/// `cuMemPoolSetAttribute`: REUSE_* (1-3, int), RELEASE_THRESHOLD (4),
/// RESERVED_MEM_HIGH (6) and USED_MEM_HIGH (8) (u64; the highs can only be
/// reset to 0, which sets them to the current value).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: Handle,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        if value.is_null() {
            return Err(CuErr::InvalidValue);
        }
        let int = get!(value as *const i32);
        let long = if (4..=8).contains(&attr) {
            get!(value as *const u64)
        } else {
            0
        };
        with(|d| {
            let p = d.pools.pools.get_mut(&pool).ok_or(CuErr::InvalidValue)?;
            match attr {
                1..=3 => p.attrs[attr as usize - 1] = int,
                4 => p.threshold = long,
                6 if long == 0 => p.reserved_high = p.reserved,
                8 if long == 0 => p.used_high = p.used,
                _ => return Err(CuErr::InvalidValue),
            }
            Ok(())
        })
    })
}

/// `cuMemPoolGetAttribute`: RESERVED_MEM_CURRENT (5) / HIGH (6),
/// USED_MEM_CURRENT (7) / HIGH (8), RELEASE_THRESHOLD (4), REUSE_* (1-3).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: Handle,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let p = with(|d| d.pools.pools.get(&pool).cloned().ok_or(CuErr::InvalidValue))?;
        let v = match attr {
            1..=3 => {
                put!(value as *mut i32, p.attrs[attr as usize - 1]);
                return Ok(());
            }
            4 => p.threshold,
            5 => p.reserved,
            6 => p.reserved_high,
            7 => p.used,
            8 => p.used_high,
            _ => return Err(CuErr::InvalidValue),
        };
        put!(value as *mut u64, v);
        Ok(())
    })
}

/// `cuMemPoolSetAccess`: accepted.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: Handle,
    _map: *const c_void,
    _count: usize,
) -> CUresult {
    guard(|| {
        with(|d| {
            d.pools
                .pools
                .get(&pool)
                .map(|_| ())
                .ok_or(CuErr::InvalidValue)
        })
    })
}

/// `cuDeviceGetDefaultMemPool`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: CUdevice) -> CUresult {
    guard(|| {
        let h = with(|d| {
            let dv = d.dev(dev)?;
            Ok(d.default_pool(dv))
        })?;
        put!(pool, h);
        Ok(())
    })
}

/// `cuDeviceGetMemPool`: the current pool (the default one unless set).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut Handle, dev: CUdevice) -> CUresult {
    guard(|| {
        let h = with(|d| {
            let dv = d.dev(dev)?;
            Ok(d.current_pool(dv))
        })?;
        put!(pool, h);
        Ok(())
    })
}

/// `cuDeviceSetMemPool`: the pool must be on that device.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            let dv = d.dev(dev)?;
            let p = d.pools.pools.get(&pool).ok_or(CuErr::InvalidValue)?;
            if p.dev != Some(dv) || p.destroyed {
                return Err(CuErr::InvalidValue);
            }
            d.pools.current.insert(dv, pool);
            Ok(())
        })
    })
}
