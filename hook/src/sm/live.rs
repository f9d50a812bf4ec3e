//! The process's real world behind the traits of `sys`: the clocks, the
//! region, the container's sidecar (with the daemon's plan) and the
//! background thread; the driver's part is `crate::driver::native`.

use std::sync::OnceLock;

use vgpu_common::clock::clock_ns;
use vgpu_common::region::SharedRegion;

use crate::driver::native::Native;
use crate::driver::{Context, Events, Nvml, Poll};
use crate::sidecar::{self, SmShared};
use crate::sm::sys::{Background, Clock, Container};

/// The process's real world.
#[derive(Debug, Default)]
pub(crate) struct Real {
    buckets: OnceLock<&'static SmShared>,
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

/// The driver's part, as the rest of the hook sees it.
impl Context for Real {
    fn current_device(&self) -> Option<usize> {
        Native.current_device()
    }

    #[inline]
    fn current(&self) -> Option<(usize, usize)> {
        Native.current()
    }

    #[inline]
    fn only_device(&self) -> Option<usize> {
        Native.only_device()
    }
}

impl Events for Real {
    fn create_event(&self) -> Option<usize> {
        Native.create_event()
    }

    fn destroy_event(&self, ev: usize) {
        Native.destroy_event(ev);
    }

    fn record(&self, ev: usize, stream: usize) -> bool {
        Native.record(ev, stream)
    }

    fn query(&self, ev: usize) -> Poll {
        Native.query(ev)
    }

    fn elapsed_ns(&self, start: usize, end: usize) -> Option<u64> {
        Native.elapsed_ns(start, end)
    }

    #[inline]
    fn capturing(&self, stream: usize) -> bool {
        Native.capturing(stream)
    }
}

impl Nvml for Real {
    fn proc_util(&self, dev: usize, since_us: u64) -> Option<Vec<(u32, u32)>> {
        Native.proc_util(dev, since_us)
    }

    fn device_busy(&self, dev: usize, since_us: u64) -> Option<(f64, Vec<u32>)> {
        Native.device_busy(dev, since_us)
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

    fn priority_stated(&self) -> bool {
        crate::state::config().priority_stated
    }

    fn note_host_pid(&self) {
        if crate::pid_namespace::in_initial_pid_ns() {
            if let Some(p) = crate::state::process() {
                p.att.set_host_pid(std::process::id());
            }
        }
    }
}

impl Background for Real {
    fn offload(&self) -> bool {
        self.background
            .is_some_and(|run| crate::background::ensure(crate::background::Job::SmFeedback, run))
    }
}
