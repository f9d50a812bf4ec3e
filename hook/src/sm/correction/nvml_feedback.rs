//! The feedback loop: the NVML evidence for the correction factor
//! (docs/sm-limit.md, "Feedback"; the law is `correction::step`).
//!
//! Every `PERIOD_NS` at most, per device, the container's leader (a lease in
//! the sidecar, `DevBucket::lease`) measures the container's share with
//! NVML (`nvml_share`) against what it was charged over the same window, and
//! steps the correction. The loop is open (factor 1) while it cannot
//! measure: a host pid unknown, NVML missing, or NVML showing only this
//! PID namespace. A step is found due on the launch path and runs on the
//! process's background thread when there is one (`world::Background::offload`), since
//! its NVML calls take milliseconds.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Mutex;

use vgpu_common::region::rules::{self, SmLimit};
use vgpu_common::region::{SharedRegion, MAX_DEVICES};

use super::nvml_share;
use crate::driver::Nvml;
use crate::sm::correction::{self, Reading};
pub(crate) use crate::sm::tuning::PERIOD_NS;
use crate::sm::tuning::{LEASE_NS, MAX_GAP_NS, SHARED_PERIOD_NS};
use crate::world::{Clock, Identity, NodeFiles};

/// Low bits of a lease that carry the leader's pid.
const LEASE_PID_MASK: u64 = (1 << 20) - 1;

/// The loop's memory of one device (leader only).
#[derive(Debug, Default, Clone, Copy)]
struct Window {
    /// The lease value this process last wrote (see `DevBucket::lease`).
    lease: u64,
    /// CLOCK_MONOTONIC ns the current measurement window began (0 = none).
    at: u64,
    /// CLOCK_MONOTONIC ns of the previous call (a long gap re-baselines).
    seen: u64,
    /// Its Unix µs (NVML's `lastSeenTimeStamp` for the next one).
    at_us: u64,
    /// The container's `charged_ns` counter then.
    charged: u64,
    /// The limit then (`None`: no window yet).
    pct: Option<SmLimit>,
    /// Another container's process was on the device then.
    shared: bool,
    /// The window began at a baseline: it is discarded (NVML's samples lag
    /// a start or a limit change, so the first half second reads well below
    /// the ones after it).
    settling: bool,
}

impl Window {
    /// Drops the measurement history (the next call re-baselines) but keeps
    /// the lease: this process still leads.
    fn forget(&mut self) {
        *self = Window {
            lease: self.lease,
            ..Window::default()
        };
    }
}

/// The loop of one process, per device.
#[derive(Debug)]
pub(crate) struct Feedback {
    /// Next step due (CLOCK_MONOTONIC ns).
    next: [AtomicU64; MAX_DEVICES],
    /// A step is due at this limit (`rules::sm_limit_cell`: 0 for none),
    /// for the background thread.
    due: [AtomicU32; MAX_DEVICES],
    windows: Mutex<[Window; MAX_DEVICES]>,
}

impl Default for Feedback {
    fn default() -> Self {
        Self {
            next: std::array::from_fn(|_| AtomicU64::new(0)),
            due: std::array::from_fn(|_| AtomicU32::new(0)),
            windows: Mutex::new([Window::default(); MAX_DEVICES]),
        }
    }
}

impl Feedback {
    /// On a limited launch admitted by the bucket at `now`: runs the step
    /// that is due on `dev` at limit `pct`, or leaves it to the background
    /// thread when `offload` says one runs it. One relaxed load when none
    /// is due.
    pub(crate) fn on_launch(
        &self,
        nvml: &impl Nvml,
        world: &(impl Clock + Identity + NodeFiles),
        dev: usize,
        now: u64,
        pct: SmLimit,
        offload: impl FnOnce() -> bool,
    ) {
        if now < self.next[dev].load(Relaxed) {
            return;
        }
        if offload() {
            self.due[dev].store(rules::sm_limit_cell(Some(pct)), Relaxed);
        } else {
            self.step(nvml, world, dev, now, pct);
        }
    }

    /// The background thread's turn: runs the steps launches found due.
    pub(crate) fn background(&self, nvml: &impl Nvml, world: &(impl Clock + Identity + NodeFiles)) {
        for (dev, due) in self.due.iter().enumerate() {
            if let Some(pct) = rules::sm_limit(u64::from(due.swap(0, Relaxed))) {
                self.step(nvml, world, dev, world.now(), pct);
            }
        }
    }

    /// One step on `dev`. Only the container's leader measures and steers.
    fn step(
        &self,
        nvml: &impl Nvml,
        world: &(impl Clock + Identity + NodeFiles),
        dev: usize,
        now: u64,
        pct: SmLimit,
    ) {
        let Ok(mut all) = self.windows.try_lock() else {
            return;
        };
        if now < self.next[dev].load(Relaxed) {
            return;
        }
        self.next[dev].store(now.saturating_add(PERIOD_NS), Relaxed);
        let b = &world.buckets().devs[dev];
        let st = &mut all[dev];
        let cur = b.lease.load(Acquire);
        let new = (now.saturating_add(LEASE_NS) & !LEASE_PID_MASK)
            | (u64::from(world.pid()) & LEASE_PID_MASK);
        let mine = cur != 0 && cur == st.lease;
        let expired = (cur & !LEASE_PID_MASK) < now;
        if !(mine || expired) || b.lease.compare_exchange(cur, new, AcqRel, Acquire).is_err() {
            // Someone else leads: forget our history.
            *st = Window::default();
            return;
        }
        st.lease = new;
        let prev = *st;
        st.seen = now;
        let Some(pids) = container_pids(world) else {
            vlog_once!(
                crate::log::INFO,
                "sm feedback: a host pid is unknown, open loop"
            );
            correction::open(b);
            st.forget();
            return;
        };
        let asked = world.now();
        let Some(samples) = nvml.proc_util(dev, prev.at_us) else {
            vlog_once!(
                crate::log::INFO,
                "sm feedback: no NVML process utilization, open loop"
            );
            correction::open(b);
            st.forget();
            return;
        };
        let device = nvml.device_busy(dev, prev.at_us);
        let nvml_us = world.now().saturating_sub(asked) / 1_000;
        b.measured_at.store(now, Relaxed);
        let region = world.region();
        if nvml_share::namespace_view(device.as_ref(), &pids, world.pid()) {
            // NVML run inside a PID namespace lists and samples only the
            // namespace's own processes, under their namespace PIDs: it
            // cannot tell a device this container shares from one it has
            // alone. The loop stays open; the container's own samples still
            // give its `sm_util`.
            vlog_once!(
                crate::log::INFO,
                "sm feedback: NVML shows this PID namespace only, open loop"
            );
            if let Some((region, own)) = region {
                publish_namespace_util(region, own, dev, &samples);
            }
            correction::open(b);
            st.forget();
            return;
        }
        if let Some((region, _)) = region {
            for s in region.procs.iter().take(region.proc_count()) {
                let h = s.hostpid.load(Relaxed);
                if s.pid.load(Relaxed) != 0 && h > 0 {
                    let u = nvml_share::attributed(device.as_ref(), &samples, &[h as u32]);
                    s.device_util[dev].sm_util.store(u.round() as u64, Relaxed);
                }
            }
        }
        let charged = b.charged_ns.load(Relaxed);
        let rebase =
            prev.at == 0 || now.saturating_sub(prev.seen) > MAX_GAP_NS || prev.pct != Some(pct);
        let shared = nvml_share::shared(device.as_ref(), &pids);
        // Another container came or went during the window: it was neither
        // alone nor shared throughout, and neither reading fits it.
        let mixed = !rebase && prev.shared != shared;
        let widen = !rebase && !mixed && !prev.settling && shared;
        if widen && now.saturating_sub(prev.at) < SHARED_PERIOD_NS {
            // Sharing the device, the split comes from NVML's per-process
            // samples, about one per process per second: one period may
            // hold a sample of one process and none of the other's. Keep
            // widening the window (not the settling one: it is discarded
            // after one period).
            return;
        }
        st.at = now;
        st.at_us = world.unix_us();
        st.charged = charged;
        st.pct = Some(pct);
        st.shared = shared;
        st.settling = rebase;
        if rebase || mixed || prev.settling {
            // First measurement, no limited launch for a while, or the
            // limit changed (the measurement still shows the old one):
            // this one only sets the baseline, and the window after it
            // is discarded too. A mixed window is discarded.
            return;
        }
        let period = now.saturating_sub(prev.at).max(1) as f64;
        let r = Reading {
            measured: nvml_share::measure(device.as_ref(), &samples, &pids),
            charged: charged.wrapping_sub(prev.charged) as i64 as f64 * 100.0 / period,
            shared,
        };
        let (was, g) = correction::from_nvml(b, pct, r);
        vlog!(
            crate::log::DEBUG,
            "sm feedback dev {dev}: limit {pct}, {} {:.1} ({} samples), charged {:.1}, correction {was:.3} -> {g:.3} (NVML {nvml_us} us)",
            if shared { "attributed" } else { "device" },
            r.measured,
            samples.len(),
            r.charged,
        );
    }
}

/// Host pids of the container's processes that hold GPU memory (a process
/// without a context, such as `nvidia-smi` run in the container, runs no
/// kernels); `None` when any of them is unknown.
fn container_pids(files: &impl NodeFiles) -> Option<Vec<u32>> {
    let (region, _) = files.region()?;
    let mut v = Vec::new();
    for s in region.procs.iter().take(region.proc_count()) {
        if s.pid.load(Relaxed) == 0 || s.used.iter().all(|u| u.total.load(Relaxed) == 0) {
            continue;
        }
        let h = s.hostpid.load(Relaxed);
        if h <= 0 {
            return None;
        }
        v.push(h as u32);
    }
    (!v.is_empty()).then_some(v)
}

/// Each slot of the PID namespace of slot `own` gets its own samples as its
/// `sm_util` (NVML names them by namespace PID there).
fn publish_namespace_util(region: &SharedRegion, own: usize, dev: usize, samples: &[(u32, u32)]) {
    let Some(ns) = region.procs.get(own).map(|s| s.pidns.load(Relaxed)) else {
        return;
    };
    for s in region.procs.iter().take(region.proc_count()) {
        let pid = s.pid.load(Relaxed);
        if pid > 0 && s.pidns.load(Relaxed) == ns {
            let u = nvml_share::container_share(samples, &[pid as u32]);
            s.device_util[dev].sm_util.store(u.round() as u64, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::SeqCst;

    use super::*;
    use crate::driver::fake::FakeDriver;
    use crate::sm::tuning::LEASE_NS;
    use crate::world::fake::FakeWorld;

    const THIRTY: SmLimit = rules::sm_limit(30).unwrap();

    /// One process of a container, as the loop sees it: its loop, its
    /// world (a clock, the container's region and buckets, its pid) and an
    /// NVML that says the container used 45 % of the device alone.
    struct Proc {
        feedback: Feedback,
        world: FakeWorld,
        nvml: FakeDriver,
    }

    impl Proc {
        fn new(world: FakeWorld) -> Self {
            let nvml = FakeDriver::default();
            *nvml.samples.lock().unwrap() = Some(vec![(4242, 45)]);
            *nvml.busy.lock().unwrap() = Some((45.0, vec![4242]));
            Self {
                feedback: Feedback::default(),
                world,
                nvml,
            }
        }

        /// NVML calls made.
        fn asked(&self) -> usize {
            self.nvml.sampled.load(SeqCst)
        }

        fn on_launch(&self, now: u64) {
            self.feedback
                .on_launch(&self.nvml, &self.world, 0, now, THIRTY, || false);
        }
    }

    /// Two processes of one container (host pid 4242 holds memory), both
    /// charged 30 % of the time while NVML measures 45 %.
    fn container() -> (Proc, Proc) {
        let a = FakeWorld::at(10_000_000_000);
        a.pid.store(100, Relaxed);
        let r = a.shm();
        r.proc_num.store(1, Relaxed);
        r.procs[0].pid.store(77, Relaxed);
        r.procs[0].hostpid.store(4242, Relaxed);
        r.procs[0].used[0].total.store(1 << 20, Relaxed);
        let b = a.sibling(200);
        (Proc::new(a), Proc::new(b))
    }

    /// Both processes step every period for `periods`, each charging 30 %
    /// of the time to the container first.
    fn run(a: &Proc, b: &Proc, periods: u64) {
        for _ in 0..periods {
            for p in [a, b] {
                p.world.clock.advance(PERIOD_NS);
                p.world.buckets.devs[0]
                    .charged_ns
                    .fetch_add(PERIOD_NS * 3 / 10 / 2, Relaxed);
                p.on_launch(p.world.now());
            }
        }
    }

    #[test]
    fn one_leader_measures_and_another_takes_over_when_its_lease_runs_out() {
        let (a, b) = container();
        run(&a, &b, 6);
        assert!(a.asked() >= 5, "the first process leads");
        assert_eq!(b.asked(), 0, "the other never measures");
        let g = correction::factor(&a.world.buckets.devs[0]);
        assert!(g > 1.1, "charged 30 against 45 measured: factor {g:.3}");
        // The leader stops (it exited): once its lease has run out, the
        // other leads, and only it measures.
        let t = a.world.now() + LEASE_NS + PERIOD_NS;
        b.world.clock.set(t);
        let before = b.asked();
        for i in 1..6 {
            b.on_launch(t + i * PERIOD_NS);
        }
        assert!(b.asked() > before, "the lease passed on");
    }
}
