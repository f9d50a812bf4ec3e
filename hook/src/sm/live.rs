//! The process's real world behind the traits of `sys`: the clocks, the
//! real driver's events (never the hooked exports), NVML, the region, the
//! container's sidecar and the node's tables.

use std::cell::Cell;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::OnceLock;

use vgpu_common::clock::clock_ns;
use vgpu_common::region::{SharedRegion, MAX_DEVICES};

use crate::ffi::*;
use crate::sidecar::{self, SmShared};
use crate::sm::node_sharing::node_table::{self, NodeFile};
use crate::sm::sys::{Clock, Container, Events, NodeTable, Nvml, Poll};

/// Runs `f` (the limiter's own event calls) in the relaxed capture mode, so
/// that they never invalidate a graph capture another thread runs in the
/// default global mode (where an event query from any thread is "unsafe").
fn relaxed<T>(f: impl FnOnce() -> T) -> T {
    let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    let swapped = real_cuda!(cuThreadExchangeStreamCaptureMode(&mut mode)) == CUDA_SUCCESS;
    let r = f();
    if swapped {
        let _ = real_cuda!(cuThreadExchangeStreamCaptureMode(&mut mode));
    }
    r
}

/// The mean of the device's utilization samples since `since_us` (every
/// internal sample period, 1/6 s to 1 s, not just the last one). `None`
/// when NVML has none, or they do not look like percentages.
fn util_samples_mean(h: nvmlDevice_t, since_us: u64) -> Option<f64> {
    let call = crate::real::nvml::fns()?.nvmlDeviceGetSamples?;
    let mut v = [nvmlSample_t::default(); 64];
    let mut count = v.len() as std::ffi::c_uint;
    let mut kind: std::ffi::c_uint = 0;
    // SAFETY: `v` holds `count` initialised entries of the C struct; `kind`
    // and `count` are live locals for the whole call.
    let rc = unsafe {
        call(
            h,
            NVML_GPU_UTILIZATION_SAMPLES,
            since_us,
            &mut kind,
            &mut count,
            v.as_mut_ptr(),
        )
    };
    let n = (count as usize).min(v.len());
    if rc != NVML_SUCCESS || n == 0 || kind != NVML_VALUE_TYPE_UNSIGNED_INT {
        return None;
    }
    // The union's `unsigned int` is its low 4 bytes (little-endian).
    let vals = v[..n].iter().map(|s| s.value as u32);
    if vals.clone().any(|u| u > 100) {
        return None;
    }
    Some(vals.map(f64::from).sum::<f64>() / n as f64)
}

/// The device's utilization over its last sample period.
fn util_now(h: nvmlDevice_t) -> Option<f64> {
    let call = crate::real::nvml::fns()?.nvmlDeviceGetUtilizationRates?;
    let mut u = nvmlUtilization_t::default();
    // SAFETY: `u` is a live local of the C struct's layout.
    (unsafe { call(h, &mut u) } == NVML_SUCCESS).then(|| f64::from(u.gpu.min(100)))
}

thread_local! {
    /// The last (context, device) this thread launched on.
    static CTX_DEV: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// The process's real world.
#[derive(Debug, Default)]
pub(crate) struct Real {
    buckets: OnceLock<&'static SmShared>,
    /// NVML handles by container device index (0: not looked up yet).
    nvml: [AtomicUsize; MAX_DEVICES],
    /// The node's tables by container device index, opened once.
    nodes: [OnceLock<Option<&'static NodeFile>>; MAX_DEVICES],
    /// What the background thread runs (the feedback steps); `None`: no
    /// thread, they run on the launch path.
    background: Option<fn()>,
}

impl Real {
    /// The real world, whose background thread runs `background`.
    pub(crate) fn new(background: fn()) -> Self {
        Self {
            background: Some(background),
            ..Self::default()
        }
    }
}

impl Real {
    /// The NVML handle of the container's device `dev`, looked up once.
    fn nvml_handle(&self, dev: usize) -> Option<nvmlDevice_t> {
        let slot = self.nvml.get(dev)?;
        let mut h = slot.load(Relaxed) as nvmlDevice_t;
        if h.is_null() {
            h = crate::devices::nvml_handle(dev)?;
            slot.store(h as usize, Relaxed);
        }
        Some(h)
    }
}

impl Clock for Real {
    fn now(&self) -> u64 {
        clock_ns(libc::CLOCK_MONOTONIC)
    }

    fn coarse(&self) -> u64 {
        clock_ns(libc::CLOCK_MONOTONIC_COARSE)
    }

    fn unix_secs(&self) -> u64 {
        clock_ns(libc::CLOCK_REALTIME) / 1_000_000_000
    }

    fn sleep_until(&self, t: u64) {
        let ts = libc::timespec {
            tv_sec: (t / 1_000_000_000) as libc::time_t,
            tv_nsec: (t % 1_000_000_000) as libc::c_long,
        };
        for _ in 0..16 {
            // SAFETY: `ts` is a valid absolute time; no remainder pointer is
            // needed with TIMER_ABSTIME.
            let rc = unsafe {
                libc::clock_nanosleep(
                    libc::CLOCK_MONOTONIC,
                    libc::TIMER_ABSTIME,
                    &ts,
                    std::ptr::null_mut(),
                )
            };
            if rc != libc::EINTR {
                return;
            }
        }
    }

    fn unix_us(&self) -> u64 {
        clock_ns(libc::CLOCK_REALTIME) / 1_000
    }
}

/// 1 + the container index of the process's only CUDA device (read at
/// `cuInit`); 0 = several devices, or not known yet.
static SINGLE: AtomicUsize = AtomicUsize::new(0);

/// Records the container index of the process's only device (at `cuInit`).
pub(crate) fn see_single_device(index: Option<usize>) {
    SINGLE.store(index.map_or(0, |i| i + 1), Relaxed);
}

/// The process's only device, when it sees one (a container is most often
/// given one GPU): the launch path's device without a driver query.
#[inline]
pub(crate) fn single_device() -> Option<usize> {
    SINGLE.load(Relaxed).checked_sub(1)
}

/// The calling thread's current context and its device (the device cached
/// per thread while the context stays the same: one driver query, no
/// syscall, in the common case).
pub(crate) fn current_context_device() -> Option<(usize, usize)> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    if real_cuda!(cuCtxGetCurrent(&mut ctx)) != CUDA_SUCCESS || ctx.is_null() {
        return None;
    }
    let key = ctx as usize;
    let (c, d) = CTX_DEV.try_with(Cell::get).unwrap_or((0, 0));
    if c == key {
        return Some((c, d));
    }
    let dev = crate::devices::index_of(crate::real::cuda::ctx::device().ok()?)?;
    let _ = CTX_DEV.try_with(|x| x.set((key, dev)));
    Some((key, dev))
}

impl Events for Real {
    fn current(&self) -> Option<(usize, usize)> {
        current_context_device()
    }

    fn only_device(&self) -> Option<usize> {
        single_device()
    }

    fn create_event(&self) -> Option<usize> {
        let mut ev: CUevent = std::ptr::null_mut();
        // CU_EVENT_DEFAULT: timing enabled, spin-wait (never waited on).
        relaxed(|| real_cuda!(cuEventCreate(&mut ev, 0)) == CUDA_SUCCESS && !ev.is_null())
            .then_some(ev as usize)
    }

    fn destroy_event(&self, ev: usize) {
        let _ = relaxed(|| real_cuda!(cuEventDestroy_v2(ev as CUevent)));
    }

    fn record(&self, ev: usize, stream: usize) -> bool {
        relaxed(|| real_cuda!(cuEventRecord(ev as CUevent, stream as CUstream))) == CUDA_SUCCESS
    }

    fn query(&self, ev: usize) -> Poll {
        match relaxed(|| real_cuda!(cuEventQuery(ev as CUevent))) {
            CUDA_SUCCESS => Poll::Ready,
            CUDA_ERROR_NOT_READY => Poll::NotReady,
            _ => Poll::Failed,
        }
    }

    fn elapsed_ns(&self, start: usize, end: usize) -> Option<u64> {
        let mut ms: f32 = 0.0;
        let (a, b) = (start as CUevent, end as CUevent);
        let v2 = crate::real::cuda::fns().and_then(|t| t.cuEventElapsedTime_v2);
        let rc = relaxed(|| {
            if v2.is_some() {
                real_cuda!(cuEventElapsedTime_v2(&mut ms, a, b))
            } else {
                real_cuda!(cuEventElapsedTime(&mut ms, a, b))
            }
        });
        (rc == CUDA_SUCCESS && ms.is_finite() && ms >= 0.0).then(|| (f64::from(ms) * 1e6) as u64)
    }

    fn capturing(&self, stream: usize) -> bool {
        if crate::real::cuda::fns()
            .and_then(|t| t.cuStreamIsCapturing)
            .is_none()
        {
            return false;
        }
        let mut status: std::ffi::c_int = CU_STREAM_CAPTURE_STATUS_NONE;
        let rc = real_cuda!(cuStreamIsCapturing(stream as CUstream, &mut status));
        // An error (the legacy stream while another thread captures) also
        // means: keep out of it.
        rc != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE
    }
}

impl Container for Real {
    fn region(&self) -> Option<(&SharedRegion, usize)> {
        let p = crate::state::process()?;
        Some((p.att.region(), p.att.slot_index()))
    }

    fn policy(&self) -> i32 {
        crate::state::config().policy
    }

    fn buckets(&self) -> &'static SmShared {
        self.buckets.get_or_init(|| {
            // The configuration names the sidecar (`sidecar::set_region_path`).
            let _ = crate::state::config();
            sidecar::shared().unwrap_or_else(|| {
                vlog!(
                    crate::log::ERROR,
                    "the sidecar above cannot be used: each process of the container takes its part of the SM limit (limit / live processes)"
                );
                sidecar::private()
            })
        })
    }

    fn follow_files(&self, now: u64) {
        crate::sigbus_guard::follow_replaced(now);
    }

    fn buckets_shared(&self) -> bool {
        let b = self.buckets();
        sidecar::shared().is_some_and(|s| std::ptr::eq(s, b))
            && !crate::sigbus_guard::is_lost(b as *const SmShared as *const u8)
    }

    fn note_host_pid(&self) {
        if crate::pid_namespace::in_initial_pid_ns() {
            if let Some(p) = crate::state::process() {
                p.att.set_host_pid(std::process::id());
            }
        }
    }
}

impl Nvml for Real {
    fn proc_util(&self, dev: usize, since_us: u64) -> Option<Vec<(u32, u32)>> {
        let h = self.nvml_handle(dev)?;
        match crate::real::nvml::process::process_utilization(h, since_us) {
            Ok(v) => Some(v.iter().map(|s| (s.pid, s.sm_util.min(100))).collect()),
            // No process ran since `since_us`.
            Err(e) if e.code() == NVML_ERROR_NOT_FOUND => Some(Vec::new()),
            Err(_) => None,
        }
    }

    fn device_busy(&self, dev: usize, since_us: u64) -> Option<(f64, Vec<u32>)> {
        let h = self.nvml_handle(dev)?;
        let util = util_samples_mean(h, since_us).or_else(|| util_now(h))?;
        let pids = crate::real::nvml::process::compute_processes(h).ok()?;
        Some((util, pids.iter().map(|p| p.pid).collect()))
    }

    fn offload(&self) -> bool {
        self.background.is_some_and(background_started)
    }
}

impl NodeTable for Real {
    fn node(&self, dev: usize) -> Option<&'static NodeFile> {
        *self.nodes.get(dev)?.get_or_init(|| {
            let dir = crate::state::config().node_dir.as_ref()?;
            // Only a directory the node's containers share (HAMi mounts it):
            // never created here, where no other container would see it.
            if !dir.is_dir() {
                return None;
            }
            let path = node_table::path_for(dir, &crate::devices::uuid(dev)?);
            match node_table::open(&path) {
                Ok(n) => Some(n),
                Err(e) => {
                    vlog!(
                        crate::log::WARN,
                        "{e}; containers on this GPU neither take turns nor rank by priority"
                    );
                    None
                }
            }
        })
    }

    fn turns(&self) -> bool {
        crate::state::config().turns
    }

    fn ranked(&self) -> bool {
        let c = crate::state::config();
        c.priority_stated && c.node_dir.as_ref().is_some_and(|d| d.is_dir())
    }
}

/// Starts, once per process, the thread that runs the feedback loop's
/// steps off the launch path (`run`: `Controller::background`); `false` when it
/// cannot be started (the steps then run on the launch path). Called only
/// when a step is due (every 500 ms at most); a forked child, which has no
/// copy of its parent's thread, starts its own.
fn background_started(run: fn()) -> bool {
    use std::sync::atomic::AtomicU32;
    use std::sync::atomic::Ordering::{Acquire, Release};
    use std::sync::Mutex;
    static OWNER: AtomicU32 = AtomicU32::new(0);
    static STARTING: Mutex<()> = Mutex::new(());
    let pid = std::process::id();
    if OWNER.load(Acquire) == pid {
        return true;
    }
    // Another thread is starting it (or a fork caught the lock held): this
    // step runs inline.
    let Ok(_g) = STARTING.try_lock() else {
        return false;
    };
    if OWNER.load(Acquire) == pid {
        return true;
    }
    let period = std::time::Duration::from_nanos(crate::sm::tuning::BACKGROUND_NS);
    match std::thread::Builder::new()
        .name("vgpu-sm".into())
        .spawn(move || loop {
            std::thread::sleep(period);
            run();
        }) {
        Ok(_) => {
            OWNER.store(pid, Release);
            true
        }
        Err(e) => {
            vlog_once!(
                crate::log::WARN,
                "cannot start the SM feedback thread ({e}); its steps run on the launch path"
            );
            false
        }
    }
}
