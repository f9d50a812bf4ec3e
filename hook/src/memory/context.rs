//! CUDA contexts: `cuInit` (fills the region's device list), primary
//! context retain/release, `cuCtxCreate_v2/v3/v4` / `cuCtxDestroy_v2`.
//!
//! A context's device memory is *measured* the first time this process
//! creates one on a device (see [`counted_context`] and docs/hook.md): from this
//! process's own line of NVML's process list when its host PID is known
//! (initial PID namespace, or `hostpid` filled by the daemon); else, under
//! the node-wide lock `/tmp/vgpulock/lock`, from the one PID that appeared
//! in the list (our host PID, unless it is our namespace PID: R580 lists a
//! container's processes to it with namespace PIDs); else from the size another
//! process of the container measured exactly (the sidecar); else from the
//! device-wide `used` delta when plausible. The size is cached per device
//! (per process, and exact sizes in the container's sidecar); a known size
//! is reserved *before* the context is created.

use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::region::MAX_DEVICES;

use super::limit;
use super::nvml_line::{own_listed, used_by, Snapshot};
use super::track::Entry;
use super::uncounted;
use crate::driver;
use crate::driver::Nvml;
use crate::driver::{Contexts, DeviceIds};
use crate::ffi::*;
use crate::region::Kind;
use crate::state::{process, Process, UNKNOWN};
use crate::world::{self, Identity, NodeFiles};

/// A device-wide `used` delta larger than this is not taken for one
/// context (another process allocated in the window).
const PLAUSIBLE_DELTA: u64 = 4 << 30;

/// How a context size was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measured {
    /// From this process's own NVML process-list entry (exact).
    Own(u64),
    /// From the one PID that appeared in the process list while the node
    /// lock was held: our host PID (exact).
    NewPid { pid: u32, bytes: u64 },
    /// Measured exactly by another process of the container.
    Shared(u64),
    /// The device-wide used-memory delta (plausible, not certain).
    Delta(u64),
    /// Nothing usable.
    Unknown,
}

impl Measured {
    pub fn bytes(self) -> Option<u64> {
        match self {
            Self::Own(b) | Self::NewPid { bytes: b, .. } | Self::Shared(b) | Self::Delta(b) => {
                Some(b)
            }
            Self::Unknown => None,
        }
    }

    fn exact(self) -> bool {
        matches!(self, Self::Own(_) | Self::NewPid { .. })
    }
}

/// Infers the context size from snapshots before and after the creation.
/// `own` is this process's host PID when known.
pub fn infer(
    own: Option<u32>,
    before: &Snapshot,
    after: &Snapshot,
    shared: Option<u64>,
) -> Measured {
    if let (Some(b), Some(a)) = (&before.procs, &after.procs) {
        match own {
            Some(pid) if a.iter().any(|(p, _)| *p == pid) => {
                return Measured::Own(used_by(a, pid).saturating_sub(used_by(b, pid)));
            }
            Some(_) => {}
            None => {
                let mut new: Vec<(u32, u64)> = a
                    .iter()
                    .filter(|(p, _)| !b.iter().any(|(q, _)| q == p))
                    .copied()
                    .collect();
                new.dedup_by_key(|(p, _)| *p);
                if let [(pid, _)] = new[..] {
                    return Measured::NewPid {
                        pid,
                        bytes: used_by(a, pid),
                    };
                }
            }
        }
    }
    if let Some(s) = shared {
        return Measured::Shared(s);
    }
    match (before.used, after.used) {
        (Some(b), Some(a)) if a > b && a - b <= PLAUSIBLE_DELTA => Measured::Delta(a - b),
        _ => Measured::Unknown,
    }
}

/// Reserves a known context size, then creates the context.
fn reserve_then_create(
    p: &Process,
    dev: usize,
    size: u64,
    create: impl FnOnce() -> CUresult,
) -> (CUresult, u64) {
    let Some(r) = limit::reserve(&p.att, dev, size, Kind::Context) else {
        return (CUDA_ERROR_OUT_OF_MEMORY, 0);
    };
    let rc = create();
    if rc != CUDA_SUCCESS {
        return (rc, 0);
    }
    r.commit();
    (rc, size)
}

/// Counts a context on `dev` around `create`; `destroy` undoes a created
/// context when the limit refuses it. Returns the driver's result or
/// `CUDA_ERROR_OUT_OF_MEMORY`, and the bytes counted.
///
/// A size known before the creation (this process's cache, else the
/// container's sidecar) is reserved first, so the device never holds more
/// than the limit. A first measurement is reserved right after the
/// creation: for that moment the device may hold one context more than the
/// limit (the context is destroyed again if it does not fit).
pub fn counted_context(
    p: &Process,
    d: &impl Nvml,
    host: &(impl Identity + NodeFiles),
    dev: usize,
    create: impl FnOnce() -> CUresult,
    destroy: impl FnOnce(),
) -> (CUresult, u64) {
    crate::suspend::ensure_running();
    let cached = p.ctx_size[dev].load(SeqCst);
    if cached != UNKNOWN {
        return reserve_then_create(p, dev, cached, create);
    }
    if let Some(s) = host.shared_ctx_size(dev) {
        p.ctx_size[dev].store(s, SeqCst);
        return reserve_then_create(p, dev, s, create);
    }
    let own = host.own_host_pid().or_else(|| p.att.host_pid());
    // Without our host PID, serialise node-wide so that the one PID that
    // appears in NVML's list is ours.
    let lock = if own.is_none() {
        host.node_lock()
    } else {
        None
    };
    if lock.is_some() {
        // Another process of the container may have measured meanwhile.
        if let Some(s) = host.shared_ctx_size(dev) {
            drop(lock);
            p.ctx_size[dev].store(s, SeqCst);
            return reserve_then_create(p, dev, s, create);
        }
    }
    let before = Snapshot::take(d, dev);
    let rc = create();
    let after = Snapshot::take(d, dev);
    drop(lock);
    let own = own_listed(own, host.own_ns_pid(), &after);
    let m = infer(own, &before, &after, host.shared_ctx_size(dev));
    if rc != CUDA_SUCCESS {
        return (rc, 0);
    }
    if let Measured::NewPid { pid, .. } = m {
        // A driver that lists a container's processes with their namespace
        // PIDs (R580) shows us under our own PID: exact size, no host PID.
        if Some(pid) != host.own_ns_pid() {
            p.att.set_host_pid(pid);
        }
    }
    let size = m.bytes().unwrap_or_else(|| {
        vlog_once!(
            crate::log::WARN,
            "cannot measure the CUDA context's memory (no NVML); contexts are not counted"
        );
        0
    });
    if m.exact() {
        host.set_shared_ctx_size(dev, size);
    }
    p.ctx_size[dev].store(size, SeqCst);
    vlog!(
        crate::log::INFO,
        "device {dev}: CUDA context uses {size} bytes ({m:?})"
    );
    let Some(r) = limit::reserve(&p.att, dev, size, Kind::Context) else {
        destroy();
        return (CUDA_ERROR_OUT_OF_MEMORY, 0);
    };
    r.commit();
    (rc, size)
}

pub fn init(forward: impl FnOnce() -> CUresult, _flags: std::ffi::c_uint) -> CUresult {
    let rc = forward();
    if rc == CUDA_SUCCESS {
        if let Some(p) = process() {
            fill_device_info(p);
        }
    }
    rc
}

/// Writes `device_num` and `uuids[]` (the container's devices, in its
/// index order: `crate::devices`) into the region.
pub fn fill_device_info(p: &Process) {
    let Some(count) = driver::live().cuda_count().filter(|n| *n > 0) else {
        return;
    };
    let single = if count == 1 {
        crate::devices::index_of(driver::live(), 0)
    } else {
        None
    };
    driver::see_single_device(single);
    let Some(devices) = crate::devices::get(driver::live()) else {
        return;
    };
    let uuids = devices.container();
    let n = uuids.len().min(MAX_DEVICES);
    let r = p.att.region();
    for (dev, u) in uuids.iter().take(n).enumerate() {
        r.set_uuid(dev, u.as_bytes());
    }
    if n > 0 {
        r.device_num.store(n as u64, SeqCst);
    }
}

fn dev_index(dev: CUdevice) -> Option<usize> {
    crate::devices::index_of(driver::live(), dev)
}

pub fn primary_retain(
    forward: impl Fn() -> CUresult,
    _ctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    let (Some(p), Some(d)) = (process(), dev_index(dev)) else {
        return forward();
    };
    let mut counts = p.primary.lock().unwrap_or_else(|e| e.into_inner());
    if counts[d] > 0 {
        let rc = forward();
        if rc == CUDA_SUCCESS {
            counts[d] += 1;
        }
        return rc;
    }
    let (rc, _) = counted_context(p, driver::live(), world::live(), d, forward, || {
        let _ = driver::live().release_primary(dev);
    });
    if rc == CUDA_SUCCESS {
        counts[d] = 1;
        super::modules::watch();
    }
    rc
}

/// `cuDevicePrimaryCtxRelease(_v2)`: the last release of the primary context
/// of `dev` gives back its count.
pub fn primary_release(forward: impl FnOnce() -> CUresult, dev: CUdevice) -> CUresult {
    let (Some(p), Some(d)) = (process(), dev_index(dev)) else {
        return forward();
    };
    let mut counts = p.primary.lock().unwrap_or_else(|e| e.into_inner());
    let rc = forward();
    if rc == CUDA_SUCCESS && counts[d] > 0 {
        counts[d] -= 1;
        if counts[d] == 0 {
            let size = p.ctx_size[d].load(SeqCst);
            if size != UNKNOWN {
                limit::release_counted(&p.att, d, size, Kind::Context);
            }
            super::modules::released_with_context(p, d);
        }
    }
    rc
}

/// `cuDevicePrimaryCtxReset(_v2)` destroys the primary context of `dev`
/// with every allocation made in it: on success their accounting is
/// released (pointers, VMM handles, arrays, graph memory of that device),
/// and the context's own size with its retain count, as the driver drops
/// it. Allocations on that device could also belong to a context this
/// process made with `cuCtxCreate` (the tables do not record the context):
/// when such a context is alive, they are left counted (warned once).
pub fn primary_reset(forward: impl FnOnce() -> CUresult, dev: CUdevice) -> CUresult {
    let (Some(p), Some(d)) = (process(), dev_index(dev)) else {
        return forward();
    };
    let mut counts = p.primary.lock().unwrap_or_else(|e| e.into_inner());
    let rc = forward();
    if rc != CUDA_SUCCESS {
        return rc;
    }
    released_by_reset(p, d, &mut counts[d]);
    rc
}

/// The accounting side of a successful primary-context reset of `d`.
pub fn released_by_reset(p: &Process, d: usize, retained: &mut u32) {
    if *retained > 0 {
        *retained = 0;
        let size = p.ctx_size[d].load(SeqCst);
        if size != UNKNOWN {
            limit::release_counted(&p.att, d, size, Kind::Context);
        }
        super::modules::released_with_context(p, d);
    }
    if p.contexts.any(|e| e.dev == d) {
        vlog_once!(
            crate::log::WARN,
            "cuDevicePrimaryCtxReset with other contexts alive on device {d}: \
             its allocations stay counted until freed"
        );
        return;
    }
    let on_dev = |e: &Entry| e.dev == d;
    super::oversubscribe::released_where(p, on_dev);
    let mut freed: Vec<Entry> = Vec::new();
    for t in [&p.ptrs, &p.handles, &p.arrays] {
        freed.extend(t.drain_where(on_dev));
    }
    {
        let mut graphs = p.graphs.lock().unwrap_or_else(|e| e.into_inner());
        for entries in graphs.values_mut() {
            entries.retain(|e| {
                if on_dev(e) {
                    freed.push(*e);
                    false
                } else {
                    true
                }
            });
        }
        graphs.retain(|_, v| !v.is_empty());
    }
    let total = release_all(p, &freed);
    vlog!(
        crate::log::INFO,
        "device {d}: primary context reset released {} objects, {total} bytes",
        freed.len()
    );
}

/// Releases what `freed` counted; returns the bytes.
fn release_all(p: &Process, freed: &[Entry]) -> u64 {
    for e in freed {
        limit::release_counted(&p.att, e.dev, e.bytes, e.kind);
    }
    freed.iter().map(|e| e.bytes).sum()
}

fn ctx_create(ctx: *mut CUcontext, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let (Some(p), Some(d)) = (process(), dev_index(dev)) else {
        return call();
    };
    if ctx.is_null() {
        return call();
    }
    let (rc, bytes) = counted_context(p, driver::live(), world::live(), d, call, || {
        if let Some(c) = read(ctx) {
            let _ = driver::live().destroy_context(c);
        }
    });
    if rc == CUDA_SUCCESS {
        if let Some(c) = read(ctx) {
            p.contexts
                .insert(c as u64, Entry::unbound(d, bytes, Kind::Context));
        }
        super::modules::watch();
    }
    rc
}

pub fn ctx_create_v2(
    forward: impl FnOnce() -> CUresult,
    ctx: *mut CUcontext,
    _flags: std::ffi::c_uint,
    dev: CUdevice,
) -> CUresult {
    ctx_create(ctx, dev, forward)
}

pub fn ctx_create_v3(
    forward: impl FnOnce() -> CUresult,
    ctx: *mut CUcontext,
    _params: *mut std::ffi::c_void,
    _nparams: std::ffi::c_int,
    _flags: std::ffi::c_uint,
    dev: CUdevice,
) -> CUresult {
    ctx_create(ctx, dev, forward)
}

pub fn ctx_create_v4(
    forward: impl FnOnce() -> CUresult,
    ctx: *mut CUcontext,
    _params: *mut std::ffi::c_void,
    _flags: std::ffi::c_uint,
    dev: CUdevice,
) -> CUresult {
    ctx_create(ctx, dev, forward)
}

/// `cuCtxDestroy(_v2)` frees every allocation made in the context: on
/// success their accounting goes with the context's own size.
pub fn ctx_destroy(forward: impl FnOnce() -> CUresult, ctx: CUcontext) -> CUresult {
    let Some(p) = process() else {
        return forward();
    };
    let rc = uncounted(p, &p.contexts, ctx as u64, forward);
    if rc == CUDA_SUCCESS {
        released_by_destroy(p, ctx as u64);
    }
    rc
}

/// The accounting side of a successful `cuCtxDestroy` of `ctx`: device
/// pointers (plain, pitched, managed, IPC mappings) and arrays made in it.
/// VMM handles, pool and graph memory are not bound to a context.
pub fn released_by_destroy(p: &Process, ctx: u64) {
    if ctx == 0 {
        return;
    }
    super::oversubscribe::released_where(p, |e| e.ctx == ctx);
    let mut freed: Vec<Entry> = Vec::new();
    for t in [&p.ptrs, &p.arrays] {
        freed.extend(t.drain_where(|e| e.ctx == ctx));
    }
    if freed.is_empty() {
        return;
    }
    let total = release_all(p, &freed);
    vlog!(
        crate::log::INFO,
        "context destroyed with {} allocations alive: released {total} bytes",
        freed.len()
    );
}
