//! CUDA contexts: `cuInit` (fills the region's device list), primary
//! context retain/release, `cuCtxCreate_v2/v3/v4` / `cuCtxDestroy_v2`.
//!
//! A context's device memory is *measured* the first time this process
//! creates one on a device: NVML's device-wide `used` before and after the
//! creation, with the creation serialised node-wide by `flock` on
//! `/tmp/vgpulock/lock` (HAMi mounts that directory into every container)
//! so another process's context does not land in the window. The size is
//! cached per device; later contexts reserve it *before* they are created.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use vgpu_common::region::MAX_DEVICES;

use super::driver::{cuda_uuid, Driver, Real};
use super::track::Entry;
use super::uncounted;
use crate::ffi::*;
use crate::region::Kind;
use crate::state::{process, Process, UNKNOWN};

const NODE_LOCK: &str = "/tmp/vgpulock/lock";
const NODE_LOCK_WAIT: Duration = Duration::from_secs(3);

/// `flock` on the node-wide lock file, released on drop (and by the kernel
/// if the process dies).
struct NodeLock(File);

impl NodeLock {
    fn take() -> Option<Self> {
        if !std::path::Path::new("/tmp/vgpulock").is_dir() {
            return None;
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(NODE_LOCK)
            .ok()?;
        let deadline = Instant::now() + NODE_LOCK_WAIT;
        loop {
            // SAFETY: flock on an fd owned by `f`.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Some(Self(f));
            }
            if Instant::now() >= deadline {
                vlog!(
                    crate::log::WARN,
                    "{NODE_LOCK} busy; measuring the context without it"
                );
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for NodeLock {
    fn drop(&mut self) {
        // SAFETY: unlocking an fd owned by `self.0`.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Runs `create` (which makes a context on `dev`) and returns its result
/// with the measured footprint.
pub fn measure(
    d: &impl Driver,
    dev: usize,
    create: impl FnOnce() -> CUresult,
) -> (CUresult, Option<u64>) {
    let _lock = NodeLock::take();
    let before = d.device_used(dev);
    let rc = create();
    let after = d.device_used(dev);
    (rc, before.zip(after).map(|(b, a)| a.saturating_sub(b)))
}

/// Counts a context on `dev` around `create`; `destroy` undoes a created
/// context when the limit refuses it. Returns the driver's result or
/// `CUDA_ERROR_OUT_OF_MEMORY`, and the bytes counted.
pub fn counted_context(
    p: &Process,
    d: &impl Driver,
    dev: usize,
    create: impl FnOnce() -> CUresult,
    destroy: impl FnOnce(),
) -> (CUresult, u64) {
    let known = p.ctx_size[dev].load(SeqCst);
    if known != UNKNOWN {
        if !p.att.reserve(dev, known, Kind::Context) {
            return (CUDA_ERROR_OUT_OF_MEMORY, 0);
        }
        let rc = create();
        if rc != CUDA_SUCCESS {
            p.att.release(dev, known, Kind::Context);
            return (rc, 0);
        }
        return (rc, known);
    }
    let (rc, size) = measure(d, dev, create);
    if rc != CUDA_SUCCESS {
        return (rc, 0);
    }
    let size = size.unwrap_or_else(|| {
        vlog_once!(
            crate::log::WARN,
            "cannot measure the CUDA context's memory (no NVML); contexts are not counted"
        );
        0
    });
    p.ctx_size[dev].store(size, SeqCst);
    vlog!(
        crate::log::INFO,
        "device {dev}: CUDA context uses {size} bytes"
    );
    if !p.att.reserve(dev, size, Kind::Context) {
        destroy();
        return (CUDA_ERROR_OUT_OF_MEMORY, 0);
    }
    (rc, size)
}

pub fn init(flags: std::ffi::c_uint) -> CUresult {
    let rc = real_cuda!(cuInit(flags));
    if rc == CUDA_SUCCESS {
        if let Some(p) = process() {
            fill_device_info(p);
        }
    }
    rc
}

/// Writes `device_num` and `uuids[]` (CUDA ordinal order) into the region.
pub fn fill_device_info(p: &Process) {
    let mut count: std::ffi::c_int = 0;
    if real_cuda!(cuDeviceGetCount(&mut count)) != CUDA_SUCCESS || count <= 0 {
        return;
    }
    let n = (count as usize).min(MAX_DEVICES);
    let r = p.att.region();
    for dev in 0..n {
        if let Some(u) = cuda_uuid(dev) {
            r.set_uuid(dev, u.as_bytes());
        }
    }
    r.device_num.store(n as u64, SeqCst);
}

fn dev_index(dev: CUdevice) -> Option<usize> {
    usize::try_from(dev).ok().filter(|d| *d < MAX_DEVICES)
}

pub fn primary_retain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let call = || real_cuda!(cuDevicePrimaryCtxRetain(ctx, dev));
    let (Some(p), Some(d)) = (process(), dev_index(dev)) else {
        return call();
    };
    let mut counts = p.primary.lock().unwrap_or_else(|e| e.into_inner());
    if counts[d] > 0 {
        let rc = call();
        if rc == CUDA_SUCCESS {
            counts[d] += 1;
        }
        return rc;
    }
    let (rc, _) = counted_context(p, &Real, d, call, || {
        let _ = real_cuda!(cuDevicePrimaryCtxRelease_v2(dev));
    });
    if rc == CUDA_SUCCESS {
        counts[d] = 1;
    }
    rc
}

fn primary_release(dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let (Some(p), Some(d)) = (process(), dev_index(dev)) else {
        return call();
    };
    let mut counts = p.primary.lock().unwrap_or_else(|e| e.into_inner());
    let rc = call();
    if rc == CUDA_SUCCESS && counts[d] > 0 {
        counts[d] -= 1;
        if counts[d] == 0 {
            let size = p.ctx_size[d].load(SeqCst);
            if size != UNKNOWN {
                p.att.release(d, size, Kind::Context);
            }
        }
    }
    rc
}

pub fn primary_release_v1(dev: CUdevice) -> CUresult {
    primary_release(dev, || real_cuda!(cuDevicePrimaryCtxRelease(dev)))
}

pub fn primary_release_v2(dev: CUdevice) -> CUresult {
    primary_release(dev, || real_cuda!(cuDevicePrimaryCtxRelease_v2(dev)))
}

fn ctx_create(ctx: *mut CUcontext, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let (Some(p), Some(d)) = (process(), dev_index(dev)) else {
        return call();
    };
    if ctx.is_null() {
        return call();
    }
    let (rc, bytes) = counted_context(p, &Real, d, call, || {
        if let Some(c) = read(ctx) {
            let _ = real_cuda!(cuCtxDestroy_v2(c));
        }
    });
    if rc == CUDA_SUCCESS {
        if let Some(c) = read(ctx) {
            p.contexts.insert(
                c as u64,
                Entry {
                    dev: d,
                    bytes,
                    kind: Kind::Context,
                },
            );
        }
    }
    rc
}

pub fn ctx_create_v2(ctx: *mut CUcontext, flags: std::ffi::c_uint, dev: CUdevice) -> CUresult {
    ctx_create(ctx, dev, || real_cuda!(cuCtxCreate_v2(ctx, flags, dev)))
}

pub fn ctx_create_v3(
    ctx: *mut CUcontext,
    params: *mut std::ffi::c_void,
    nparams: std::ffi::c_int,
    flags: std::ffi::c_uint,
    dev: CUdevice,
) -> CUresult {
    ctx_create(ctx, dev, || {
        real_cuda!(cuCtxCreate_v3(ctx, params, nparams, flags, dev))
    })
}

pub fn ctx_create_v4(
    ctx: *mut CUcontext,
    params: *mut std::ffi::c_void,
    flags: std::ffi::c_uint,
    dev: CUdevice,
) -> CUresult {
    ctx_create(ctx, dev, || {
        real_cuda!(cuCtxCreate_v4(ctx, params, flags, dev))
    })
}

pub fn ctx_destroy(ctx: CUcontext) -> CUresult {
    match process() {
        Some(p) => uncounted(p, &p.contexts, ctx as u64, || {
            real_cuda!(cuCtxDestroy_v2(ctx))
        }),
        None => real_cuda!(cuCtxDestroy_v2(ctx)),
    }
}
