//! The real driver behind the traits of `crate::driver`: the safe wrappers
//! of `crate::real` (libcuda and NVML as loaded by the hook, never its own
//! exports), and the per-thread and per-process caches that keep the
//! launch path free of syscalls.

#![forbid(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use vgpu_common::region::MAX_DEVICES;

use super::{Context, Contexts, DeviceIds, Events, Memory, Nvml, Poll};
use crate::ffi::*;
pub(crate) use crate::real::cuda::CuError;
use crate::real::cuda::{self, events};
use crate::real::nvml;

/// The real driver.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Native;

/// 1 + the container index of the process's only CUDA device (read at
/// `cuInit`); 0 = several devices, or not known yet.
static SINGLE: AtomicUsize = AtomicUsize::new(0);

/// Records the container index of the process's only device (at `cuInit`).
pub(crate) fn see_single_device(index: Option<usize>) {
    SINGLE.store(index.map_or(0, |i| i + 1), Relaxed);
}

thread_local! {
    /// The last (context, device) this thread asked about.
    static CTX_DEV: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// NVML handles by container device index (0: not looked up yet).
static NVML_HANDLES: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];

/// The NVML handle of the container's device `dev`, looked up once.
fn nvml_handle(dev: usize) -> Option<nvmlDevice_t> {
    let slot = NVML_HANDLES.get(dev)?;
    let mut h = slot.load(Relaxed) as nvmlDevice_t;
    if h.is_null() {
        h = crate::devices::nvml_handle(&Native, dev)?;
        slot.store(h as usize, Relaxed);
    }
    Some(h)
}

impl Context for Native {
    fn current_device(&self) -> Option<usize> {
        crate::devices::index_of(self, cuda::ctx::device().ok()?)
    }

    /// One driver query, no syscall, in the common case: the device is
    /// remembered per thread while its context stays the same.
    fn current(&self) -> Option<(usize, usize)> {
        let ctx = cuda::ctx::current().ok()?;
        if ctx.is_null() {
            return None;
        }
        let key = ctx as usize;
        let (c, d) = CTX_DEV.try_with(Cell::get).unwrap_or((0, 0));
        if c == key {
            return Some((c, d));
        }
        let dev = self.current_device()?;
        let _ = CTX_DEV.try_with(|x| x.set((key, dev)));
        Some((key, dev))
    }

    /// One driver query, no device lookup.
    fn context(&self) -> Option<usize> {
        let ctx = cuda::ctx::current().ok()?;
        (!ctx.is_null()).then_some(ctx as usize)
    }

    #[inline]
    fn only_device(&self) -> Option<usize> {
        SINGLE.load(Relaxed).checked_sub(1)
    }
}

impl Events for Native {
    fn create_event(&self) -> Option<usize> {
        // CU_EVENT_DEFAULT: timing enabled, spin-wait (never waited on).
        events::with_relaxed_capture(|| events::create(0))
            .ok()
            .map(|ev| ev as usize)
    }

    fn destroy_event(&self, ev: usize) {
        let _ = events::with_relaxed_capture(|| events::destroy(ev as CUevent));
    }

    fn record(&self, ev: usize, stream: usize) -> bool {
        events::with_relaxed_capture(|| events::record(ev as CUevent, stream as CUstream)).is_ok()
    }

    fn query(&self, ev: usize) -> Poll {
        match events::with_relaxed_capture(|| events::query(ev as CUevent)) {
            Ok(()) => Poll::Ready,
            Err(e) if e.code() == CUDA_ERROR_NOT_READY => Poll::NotReady,
            Err(_) => Poll::Failed,
        }
    }

    fn elapsed_ns(&self, start: usize, end: usize) -> Option<u64> {
        let ms =
            events::with_relaxed_capture(|| events::elapsed_ms(start as CUevent, end as CUevent))
                .ok()?;
        (ms.is_finite() && ms >= 0.0).then(|| (f64::from(ms) * 1e6) as u64)
    }

    fn capturing(&self, stream: usize) -> bool {
        match events::capture_status(stream as CUstream) {
            Ok(status) => status != CU_STREAM_CAPTURE_STATUS_NONE,
            // A driver without the call captures nothing.
            Err(e) if e.code() == CUDA_ERROR_NOT_FOUND => false,
            // An error (the legacy stream while another thread captures)
            // also means: keep out of it.
            Err(_) => true,
        }
    }
}

impl Memory for Native {
    fn mem_free(&self, ptr: CUdeviceptr) -> CUresult {
        cuda::status(cuda::mem::free(ptr))
    }

    fn ipc_close(&self, ptr: CUdeviceptr) -> CUresult {
        cuda::status(cuda::mem::ipc_close(ptr))
    }

    fn mem_info(&self) -> Option<(usize, usize)> {
        cuda::mem::info().ok()
    }

    fn allocation_size(&self, ptr: CUdeviceptr) -> Option<u64> {
        cuda::mem::allocation_size(ptr).ok().map(|s| s as u64)
    }

    fn host_alloc_mapped(&self, bytes: usize) -> Result<usize, CuError> {
        cuda::mem::host_alloc_mapped(bytes)
    }

    fn host_device_pointer(&self, host: usize) -> Result<CUdeviceptr, CuError> {
        cuda::mem::host_device_pointer(host)
    }

    fn free_host(&self, host: usize) -> Result<(), CuError> {
        cuda::mem::free_host(host)
    }
}

impl DeviceIds for Native {
    fn cuda_count(&self) -> Option<std::ffi::c_int> {
        cuda::device::count().ok()
    }

    fn cuda_uuid(&self, ordinal: usize) -> Option<[u8; 16]> {
        let d = cuda::device::get(std::ffi::c_int::try_from(ordinal).ok()?).ok()?;
        cuda::device::uuid(d).ok()
    }

    fn nvml_uuids(&self) -> Vec<String> {
        if !nvml::ready() {
            return Vec::new();
        }
        let Ok(count) = nvml::device::count() else {
            return Vec::new();
        };
        (0..count)
            .filter_map(|i| nvml::device::uuid(nvml::device::by_index(i).ok()?).ok())
            .collect()
    }

    fn nvml_by_uuid(&self, uuid: &str) -> Option<nvmlDevice_t> {
        if !nvml::ready() {
            return None;
        }
        let uuid = std::ffi::CString::new(uuid).ok()?;
        nvml::device::by_uuid(&uuid).ok()
    }

    fn nvml_uuid(&self, dev: nvmlDevice_t) -> Option<String> {
        nvml::device::uuid(dev).ok()
    }

    fn nvml_index(&self, dev: nvmlDevice_t) -> Option<u32> {
        nvml::device::index(dev).ok()
    }
}

impl Contexts for Native {
    fn destroy_context(&self, ctx: CUcontext) -> CUresult {
        cuda::status(cuda::ctx::destroy(ctx))
    }

    fn release_primary(&self, dev: CUdevice) -> CUresult {
        cuda::status(cuda::ctx::primary_release(dev))
    }
}

impl Nvml for Native {
    fn device_used(&self, dev: usize) -> Option<u64> {
        nvml::device::memory(nvml_handle(dev)?).ok().map(|m| m.used)
    }

    fn processes(&self, dev: usize) -> Option<Vec<(u32, u64)>> {
        nvml::process::running_processes(nvml_handle(dev)?).ok()
    }

    fn proc_util(&self, dev: usize, since_us: u64) -> Option<Vec<(u32, u32)>> {
        let h = nvml_handle(dev)?;
        match nvml::process::process_utilization(h, since_us) {
            Ok(v) => Some(v.iter().map(|s| (s.pid, s.sm_util.min(100))).collect()),
            // No process ran since `since_us`.
            Err(e) if e.code() == NVML_ERROR_NOT_FOUND => Some(Vec::new()),
            Err(_) => None,
        }
    }

    fn device_busy(&self, dev: usize, since_us: u64) -> Option<(f64, Vec<u32>)> {
        let h = nvml_handle(dev)?;
        let util = util_samples_mean(h, since_us).or_else(|| {
            nvml::device::utilization_rates(h)
                .ok()
                .map(|u| f64::from(u.gpu.min(100)))
        })?;
        let pids = nvml::process::compute_processes(h).ok()?;
        Some((util, pids.iter().map(|p| p.pid).collect()))
    }
}

/// The mean of the device's utilization samples since `since_us`. `None`
/// when NVML has none, or they do not look like percentages.
fn util_samples_mean(h: nvmlDevice_t, since_us: u64) -> Option<f64> {
    let v = nvml::device::utilization_samples(h, since_us).ok()?;
    if v.is_empty() || v.iter().any(|&u| u > 100) {
        return None;
    }
    Some(v.iter().copied().map(f64::from).sum::<f64>() / v.len() as f64)
}
