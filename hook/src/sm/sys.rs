//! What the limiter needs from the outside world, behind narrow traits so
//! the controller can be tested with a fake clock and a fake GPU, and each
//! part asks only for what it uses: `Clock` (clocks and sleeping),
//! `Events` (the current context's device and timing events, always the
//! real driver's, never the hooked exports; all that `turns` and `prio`
//! need), `Container` (the region, policy and buckets), `Nvml` (the
//! feedback loop's measurements) and `NodeTable` (the node's table and how
//! this process uses it). `Sys` is all of them, for the controller.

use std::cell::Cell;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::OnceLock;

use vgpu_common::clock::clock_ns;
use vgpu_common::region::{SharedRegion, MAX_DEVICES};

use super::node::{self, NodeFile};
use super::sidecar::{self, SmShared};
use crate::ffi::*;

/// An event's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll {
    Ready,
    NotReady,
    /// Destroyed context, driver error: drop the sample.
    Failed,
}

/// Clocks and sleeping.
pub trait Clock: Sync {
    /// CLOCK_MONOTONIC, ns.
    fn now(&self) -> u64;
    /// A cheaper clock of a few ms resolution (same epoch as `now`).
    fn coarse(&self) -> u64;
    fn unix_secs(&self) -> u64;
    /// Sleeps until `now() >= t` (or a little past it).
    fn sleep_until(&self, t: u64);
    /// CLOCK_REALTIME, µs (NVML's sample time base).
    fn unix_us(&self) -> u64 {
        self.unix_secs().saturating_mul(1_000_000)
    }
}

/// The current context and the real driver's timing events.
pub trait Events: Sync {
    /// The current context (as an opaque key) and its device's container
    /// index (`crate::devices`).
    fn current(&self) -> Option<(usize, usize)>;
    /// A timing event in the current context.
    fn create_event(&self) -> Option<usize>;
    fn destroy_event(&self, ev: usize);
    /// Two timing events (start, end) in the current context, or none.
    fn create_pair(&self) -> Option<(usize, usize)> {
        let a = self.create_event()?;
        match self.create_event() {
            Some(b) => Some((a, b)),
            None => {
                self.destroy_event(a);
                None
            }
        }
    }
    fn record(&self, ev: usize, stream: usize) -> bool;
    fn query(&self, ev: usize) -> Poll;
    fn elapsed_ns(&self, start: usize, end: usize) -> Option<u64>;
    /// `stream` is being captured into a graph (or the driver cannot say):
    /// its launches do not run now, and an event recorded into it would
    /// become part of the graph.
    fn capturing(&self, _stream: usize) -> bool {
        false
    }
}

/// The container's shared state: its region, policy and buckets.
pub trait Container: Sync {
    /// The region and this process's slot.
    fn region(&self) -> Option<(&SharedRegion, usize)>;
    /// `GPU_CORE_UTILIZATION_POLICY`.
    fn policy(&self) -> i32;
    /// The container's buckets.
    fn buckets(&self) -> &'static SmShared;
    /// This process's pid (as seen here; it only tells leaders apart).
    fn pid(&self) -> u32 {
        std::process::id()
    }
    /// Fills this process's slot `hostpid` when its host pid is known
    /// without a guess (it runs in the initial PID namespace).
    fn note_host_pid(&self) {}
}

/// What NVML measures (the feedback loop).
pub trait Nvml: Sync {
    /// NVML's per-process SM samples `(host pid, sm %)` of CUDA device
    /// `dev` since `since_us` (Unix µs; 0 = all it has); `None` when NVML
    /// cannot say (the loop then stays open).
    fn proc_util(&self, _dev: usize, _since_us: u64) -> Option<Vec<(u32, u32)>> {
        None
    }
    /// The device's own utilization since `since_us` (percent of the time
    /// a kernel ran, what `nvidia-smi` shows) and the host pids of every
    /// compute process on it; `None` when NVML cannot say.
    fn device_busy(&self, _dev: usize, _since_us: u64) -> Option<(f64, Vec<u32>)> {
        None
    }
}

/// The node's table of containers on a GPU, and how this process uses it.
pub trait NodeTable: Sync {
    /// The node's table of limited containers on CUDA device `dev`, shared
    /// with the other containers of the node; `None` when there is none.
    fn node(&self, _dev: usize) -> Option<&'static NodeFile> {
        None
    }
    /// Whether limited containers take turns in the node's table (else it
    /// only ranks them by priority).
    fn turns(&self) -> bool {
        true
    }
    /// Whether the process takes part in the node's priorities even
    /// without a limit (`CUDA_TASK_PRIORITY` set and a node directory).
    fn ranked(&self) -> bool {
        false
    }
    /// Whether a background thread runs the feedback steps
    /// (`Controller::background`), so that its NVML calls (milliseconds
    /// each) never delay a launch; else they run on the launch path.
    fn offload(&self) -> bool {
        false
    }
}

/// Everything the controller needs from the outside world.
pub trait Sys: Clock + Events + Container + Nvml + NodeTable {}

impl<T: Clock + Events + Container + Nvml + NodeTable> Sys for T {}

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
pub struct Real {
    buckets: OnceLock<&'static SmShared>,
    /// NVML handles by container device index (0: not looked up yet).
    nvml: [AtomicUsize; MAX_DEVICES],
    /// The node's tables by container device index, opened once.
    nodes: [OnceLock<Option<&'static NodeFile>>; MAX_DEVICES],
}

impl Real {
    /// The NVML handle of CUDA device `dev`, looked up once.
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

/// The calling thread's current context and its device (the device cached
/// per thread while the context stays the same: one driver query, no
/// syscall, in the common case).
pub fn current_context_device() -> Option<(usize, usize)> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    if real_cuda!(cuCtxGetCurrent(&mut ctx)) != CUDA_SUCCESS || ctx.is_null() {
        return None;
    }
    let key = ctx as usize;
    let (c, d) = CTX_DEV.try_with(Cell::get).unwrap_or((0, 0));
    if c == key {
        return Some((c, d));
    }
    let mut dev: CUdevice = -1;
    if real_cuda!(cuCtxGetDevice(&mut dev)) != CUDA_SUCCESS {
        return None;
    }
    let dev = crate::devices::index_of(dev)?;
    let _ = CTX_DEV.try_with(|x| x.set((key, dev)));
    Some((key, dev))
}

impl Events for Real {
    fn current(&self) -> Option<(usize, usize)> {
        current_context_device()
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
                    "the SM limit holds per process, not per container (the sidecar above cannot be used)"
                );
                sidecar::private()
            })
        })
    }

    fn note_host_pid(&self) {
        if crate::memory::driver::in_initial_pid_ns() {
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
        let pids = crate::memory::driver::compute_processes(h)?;
        Some((util, pids.iter().map(|p| p.pid).collect()))
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
            let path = node::path_for(dir, &crate::devices::uuid(dev)?);
            match node::open(&path) {
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

    fn offload(&self) -> bool {
        super::background_started()
    }
}
