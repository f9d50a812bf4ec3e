//! Contexts: primary and created. Each costs `SIMGPU_CONTEXT_BYTES` of
//! device memory from creation to destruction; the current context is per
//! thread (a stack, as in the real driver).

use std::ffi::{c_int, c_uint, c_void};

use crate::state::{self, with, Ctx, Driver};
use crate::{guard, put, CUdevice, CUresult, CuErr, Handle};

impl Driver {
    /// Creates a context on `dev`, charging its memory.
    pub(crate) fn create_ctx(
        &mut self,
        dev: u32,
        primary: bool,
        flags: u32,
    ) -> Result<Handle, CuErr> {
        let bytes = self.cfg.context_bytes;
        self.charge(dev, bytes)?;
        simgpu::memory::count_context(self.shm(), self.slot, dev, 1);
        let h = self.new_handle();
        self.ctxs.insert(
            h,
            Ctx {
                dev,
                primary,
                flags,
                last_end: 0,
            },
        );
        Ok(h)
    }

    /// Destroys a context: frees what was allocated in it and its memory.
    pub(crate) fn destroy_ctx(&mut self, h: Handle) -> Result<(), CuErr> {
        let c = self.ctxs.remove(&h).ok_or(CuErr::InvalidContext)?;
        let owned: Vec<u64> = self
            .allocs
            .iter()
            .filter(|(_, a)| a.ctx == h)
            .map(|(&p, _)| p)
            .collect();
        for p in owned {
            let _ = self.free_alloc(p);
        }
        self.streams.retain(|_, s| s.ctx != h);
        self.stream_end.retain(|k, _| match *k {
            state::StreamKey::Legacy(c) | state::StreamKey::PerThread(c, _) => c != h,
            state::StreamKey::Created(_) => true,
        });
        let modules: Vec<Handle> = self
            .module_mem
            .iter()
            .filter(|(_, (ctx, _, _))| *ctx == h)
            .map(|(&m, _)| m)
            .collect();
        for m in modules {
            if let Some((_, dev, bytes)) = self.module_mem.remove(&m) {
                self.uncharge(dev, bytes);
            }
        }
        self.uncharge(c.dev, self.cfg.context_bytes);
        simgpu::memory::count_context(self.shm(), self.slot, c.dev, -1);
        Ok(())
    }
}

/// `cuDevicePrimaryCtxRetain`: the first retain creates the primary context.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) -> CUresult {
    guard(|| {
        let h = with(|d| {
            let i = d.dev(dev)? as usize;
            if let Some(h) = d.primary[i].ctx {
                d.primary[i].refs += 1;
                return Ok(h);
            }
            let flags = d.primary[i].flags;
            let h = d.create_ctx(i as u32, true, flags)?;
            d.primary[i].ctx = Some(h);
            d.primary[i].refs = 1;
            Ok(h)
        })?;
        put!(pctx, h);
        Ok(())
    })
}

fn primary_release(dev: CUdevice) -> Result<(), CuErr> {
    with(|d| {
        let i = d.dev(dev)? as usize;
        let Some(h) = d.primary[i].ctx else {
            return Err(CuErr::InvalidContext);
        };
        d.primary[i].refs = d.primary[i].refs.saturating_sub(1);
        if d.primary[i].refs == 0 {
            d.primary[i].ctx = None;
            d.destroy_ctx(h)?;
        }
        Ok(())
    })
}

/// `cuDevicePrimaryCtxRelease_v2`: the last release destroys it.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard(|| primary_release(dev))
}

/// `cuDevicePrimaryCtxReset_v2`: destroys the primary context now.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    guard(|| {
        with(|d| {
            let i = d.dev(dev)? as usize;
            if let Some(h) = d.primary[i].ctx.take() {
                d.primary[i].refs = 0;
                d.destroy_ctx(h)?;
            }
            Ok(())
        })
    })
}

/// `cuDevicePrimaryCtxGetState`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    guard(|| {
        let (f, a) = with(|d| {
            let p = &d.primary[d.dev(dev)? as usize];
            Ok((p.flags, p.ctx.is_some()))
        })?;
        put!(flags, f);
        put!(active, c_int::from(a));
        Ok(())
    })
}

/// `cuDevicePrimaryCtxSetFlags_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    guard(|| {
        with(|d| {
            let i = d.dev(dev)? as usize;
            d.primary[i].flags = flags;
            if let Some(h) = d.primary[i].ctx {
                if let Some(c) = d.ctxs.get_mut(&h) {
                    c.flags = flags;
                }
            }
            Ok(())
        })
    })
}

fn ctx_create(pctx: *mut Handle, flags: c_uint, dev: CUdevice) -> Result<(), CuErr> {
    if pctx.is_null() {
        return Err(CuErr::InvalidValue);
    }
    let h = with(|d| {
        let dv = d.dev(dev)?;
        d.create_ctx(dv, false, flags)
    })?;
    put!(pctx, h);
    state::push_current(h);
    Ok(())
}

/// `cuCtxCreate_v2`: creates a context and makes it current.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut Handle,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| ctx_create(pctx, flags, dev))
}

/// `cuCtxCreate_v3` (execution-affinity parameters are ignored).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut Handle,
    _params: *const c_void,
    _num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| ctx_create(pctx, flags, dev))
}

/// `cuCtxCreate_v4` (`CUctxCreateParams` is ignored).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut Handle,
    _params: *const c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| ctx_create(pctx, flags, dev))
}

/// `cuCtxDestroy_v2`: a primary context cannot be destroyed this way.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            match d.ctxs.get(&ctx) {
                None => return Err(CuErr::InvalidContext),
                Some(c) if c.primary => return Err(CuErr::InvalidContext),
                Some(_) => {}
            }
            d.destroy_ctx(ctx)
        })?;
        if state::current() == ctx {
            state::pop_current();
        }
        Ok(())
    })
}

/// `cuCtxGetCurrent`: NULL when none.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut Handle) -> CUresult {
    guard(|| {
        with(|_| Ok(()))?;
        put!(pctx, state::current());
        Ok(())
    })
}

/// `cuCtxSetCurrent`: NULL unbinds.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            if ctx != 0 && !d.ctxs.contains_key(&ctx) {
                return Err(CuErr::InvalidContext);
            }
            Ok(())
        })?;
        state::set_current(ctx);
        Ok(())
    })
}

/// `cuCtxPushCurrent_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            if d.ctxs.contains_key(&ctx) {
                Ok(())
            } else {
                Err(CuErr::InvalidContext)
            }
        })?;
        state::push_current(ctx);
        Ok(())
    })
}

/// `cuCtxPopCurrent_v2`: `pctx` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut Handle) -> CUresult {
    guard(|| {
        with(|_| Ok(()))?;
        let h = state::pop_current().ok_or(CuErr::InvalidContext)?;
        if !pctx.is_null() {
            put!(pctx, h);
        }
        Ok(())
    })
}

/// `cuCtxGetDevice`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    guard(|| {
        let ordinal = with(|d| {
            let (_, dev) = d.current_ctx()?;
            d.ordinal(dev)
        })?;
        put!(device, ordinal as CUdevice);
        Ok(())
    })
}

/// `cuCtxGetFlags`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    guard(|| {
        let f = with(|d| {
            let (h, _) = d.current_ctx()?;
            Ok(d.ctxs.get(&h).map_or(0, |c| c.flags))
        })?;
        put!(flags, f);
        Ok(())
    })
}

/// `cuCtxGetApiVersion`: 13000.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: Handle, version: *mut c_uint) -> CUresult {
    guard(|| {
        with(|d| {
            let h = if ctx == 0 { state::current() } else { ctx };
            if d.ctxs.contains_key(&h) {
                Ok(())
            } else {
                Err(CuErr::InvalidContext)
            }
        })?;
        put!(version, crate::device::DRIVER_VERSION as c_uint);
        Ok(())
    })
}

/// `cuCtxGetId`: a unique id per context.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(ctx: Handle, id: *mut u64) -> CUresult {
    guard(|| {
        let h = if ctx == 0 { state::current() } else { ctx };
        with(|d| {
            if d.ctxs.contains_key(&h) {
                Ok(())
            } else {
                Err(CuErr::InvalidContext)
            }
        })?;
        put!(id, (h as u64) >> 6);
        Ok(())
    })
}

/// `cuCtxGetLimit`: fixed plausible values.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: c_int) -> CUresult {
    guard(|| {
        with(|d| d.current_ctx())?;
        let v = match limit {
            0 => 1024,    // STACK_SIZE
            1 => 1 << 20, // PRINTF_FIFO_SIZE
            2 => 8 << 20, // MALLOC_HEAP_SIZE
            3 => 2,       // DEV_RUNTIME_SYNC_DEPTH
            4 => 2048,    // DEV_RUNTIME_PENDING_LAUNCH_COUNT
            5 => 32,      // MAX_L2_FETCH_GRANULARITY
            6 => 0,       // PERSISTING_L2_CACHE_SIZE
            _ => return Err(CuErr::InvalidValue),
        };
        put!(value, v);
        Ok(())
    })
}

/// `cuCtxSetLimit`: accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_int, _value: usize) -> CUresult {
    guard(|| {
        with(|d| d.current_ctx())?;
        if (0..=6).contains(&limit) {
            Ok(())
        } else {
            Err(CuErr::InvalidValue)
        }
    })
}

/// `cuCtxGetStreamPriorityRange`: 0 (least) to -5 (greatest).
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    guard(|| {
        if !least.is_null() {
            put!(least, 0);
        }
        if !greatest.is_null() {
            put!(greatest, -5);
        }
        Ok(())
    })
}

/// `cuCtxEnablePeerAccess`: accepted.
#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: Handle, _flags: c_uint) -> CUresult {
    guard(|| {
        with(|d| {
            d.current_ctx()?;
            if d.ctxs.contains_key(&peer) {
                Ok(())
            } else {
                Err(CuErr::InvalidContext)
            }
        })
    })
}

/// `cuCtxDisablePeerAccess`: accepted.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDisablePeerAccess(peer: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            if d.ctxs.contains_key(&peer) {
                Ok(())
            } else {
                Err(CuErr::InvalidContext)
            }
        })
    })
}
