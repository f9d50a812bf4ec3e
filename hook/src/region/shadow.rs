//! What a process knows of the region without reading it: the limits it
//! last saw and its own usage. Kept beside the mapping so that, when the
//! file is truncated under the process and the mapping becomes a private
//! zeroed copy (`crate::sigbus_guard`), the copy is refilled with them: the
//! process keeps its limits and its own usage, counted alone (the siblings'
//! slots are gone with the file).

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize};

use vgpu_common::region::{
    status, SharedRegion, MAGIC, MAJOR_VERSION, MAX_DEVICES, MAX_PROCS, MINOR_VERSION, REGION_SIZE,
};

use vgpu_common::proc_identity::ProcIdentity;

use super::usage::Kind;

/// Per-process mirror of the slot and the limits; every word an atomic
/// (read by the SIGBUS handler).
#[derive(Debug)]
pub struct Shadow {
    slot: AtomicUsize,
    pid: AtomicI32,
    pidns: AtomicU64,
    start: AtomicU64,
    limit: [AtomicU64; MAX_DEVICES],
    sm_limit: [AtomicU64; MAX_DEVICES],
    /// Context, module and data bytes per device.
    used: [[AtomicU64; 3]; MAX_DEVICES],
}

impl Default for Shadow {
    fn default() -> Self {
        Self {
            slot: AtomicUsize::new(usize::MAX),
            pid: AtomicI32::new(0),
            pidns: AtomicU64::new(0),
            start: AtomicU64::new(0),
            limit: std::array::from_fn(|_| AtomicU64::new(0)),
            sm_limit: std::array::from_fn(|_| AtomicU64::new(0)),
            used: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }
}

fn index(kind: Kind) -> usize {
    match kind {
        Kind::Context => 0,
        Kind::Module => 1,
        Kind::Data => 2,
    }
}

impl Shadow {
    pub fn set_slot(&self, slot: usize, me: &ProcIdentity) {
        self.pid.store(me.pid, SeqCst);
        self.pidns.store(me.pidns, SeqCst);
        self.start.store(me.start, SeqCst);
        self.slot.store(slot, SeqCst);
    }

    /// Records the region's limits (at attach, and whenever a check reads one).
    pub fn see_limits(&self, r: &SharedRegion) {
        for dev in 0..MAX_DEVICES {
            self.see_limit(dev, r.limit[dev].load(Relaxed));
            self.sm_limit[dev].store(r.sm_limit[dev].load(Relaxed), Relaxed);
        }
    }

    /// Records one limit; a load and no store when unchanged.
    #[inline]
    pub fn see_limit(&self, dev: usize, limit: u64) {
        if let Some(l) = self.limit.get(dev) {
            if l.load(Relaxed) != limit {
                l.store(limit, Relaxed);
            }
        }
    }

    pub fn add(&self, dev: usize, bytes: u64, kind: Kind) {
        if let Some(u) = self.used.get(dev) {
            u[index(kind)].fetch_add(bytes, Relaxed);
        }
    }

    pub fn sub(&self, dev: usize, bytes: u64, kind: Kind) {
        if let Some(u) = self.used.get(dev) {
            let _ =
                u[index(kind)].fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(bytes)));
        }
    }

    /// Refills a zeroed region: header, limits, and this process's slot.
    /// Atomics only (runs in the SIGBUS handler).
    pub fn refill(&self, r: &SharedRegion) {
        self.refill_slot(r);
        self.refill_header(r);
    }

    /// The header and limits, as this process last saw them; the magic
    /// last, once the limits are in.
    pub fn refill_header(&self, r: &SharedRegion) {
        r.major_version.store(MAJOR_VERSION, SeqCst);
        r.minor_version.store(MINOR_VERSION, SeqCst);
        r.utilization_switch.store(1, SeqCst);
        for dev in 0..MAX_DEVICES {
            r.limit[dev].store(self.limit[dev].load(Relaxed), SeqCst);
            r.sm_limit[dev].store(self.sm_limit[dev].load(Relaxed), SeqCst);
        }
        r.initialized_flag.store(MAGIC, SeqCst);
    }

    /// This process's slot index (`usize::MAX` before registration).
    pub fn slot(&self) -> usize {
        self.slot.load(SeqCst)
    }

    /// This process's slot in `r`: the one it had if that is free or still
    /// its own, else the one it holds elsewhere, else the first free one
    /// claimed by CAS on `pid` as registration does (a process that
    /// registered after a truncation, or in a file renamed over the region,
    /// may hold the old index). `None` before registration or when every
    /// slot is taken. Atomics only.
    fn own_slot(&self, r: &SharedRegion) -> Option<usize> {
        let (pid, ns) = (self.pid.load(SeqCst), self.pidns.load(SeqCst));
        if pid == 0 {
            return None;
        }
        let mine = |s: &vgpu_common::region::ProcSlot| {
            let n = s.pidns.load(SeqCst);
            s.pid.load(SeqCst) == pid && (n == 0 || ns == 0 || n == ns)
        };
        let at = self.slot.load(SeqCst);
        if let Some(s) = r.procs.get(at) {
            if mine(s) || s.pid.compare_exchange(0, pid, SeqCst, SeqCst).is_ok() {
                return Some(at);
            }
        }
        let i = r.procs.iter().position(mine).or_else(|| {
            r.procs.iter().position(|s| {
                s.status.load(SeqCst) == status::EXITED
                    && s.pid.compare_exchange(0, pid, SeqCst, SeqCst).is_ok()
            })
        })?;
        self.slot.store(i, SeqCst);
        Some(i)
    }

    /// This process's slot: its identity and its own usage. `proc_num` is
    /// only raised, since siblings re-publish their slots too.
    pub fn refill_slot(&self, r: &SharedRegion) {
        let Some(slot) = self.own_slot(r) else {
            return;
        };
        if let Some(s) = r.procs.get(slot) {
            for dev in 0..MAX_DEVICES {
                let u = &self.used[dev];
                let (c, m, d) = (u[0].load(Relaxed), u[1].load(Relaxed), u[2].load(Relaxed));
                let m_ = &s.used[dev];
                m_.context_size.store(c, SeqCst);
                m_.module_size.store(m, SeqCst);
                m_.data_size.store(d, SeqCst);
                m_.total
                    .store(c.saturating_add(m).saturating_add(d), SeqCst);
            }
            s.pidns.store(self.pidns.load(SeqCst), SeqCst);
            s.start.store(self.start.load(SeqCst), SeqCst);
            s.status.store(status::RUNNING, SeqCst);
            s.pid.store(self.pid.load(SeqCst), SeqCst);
            r.proc_num
                .fetch_max(slot.min(MAX_PROCS - 1) as i32 + 1, SeqCst);
        }
    }
}

/// [`crate::sigbus_guard::Repair`] of a region mapping: `ctx` is the address of
/// the attachment's boxed [`Shadow`].
pub fn repair(base: usize, len: usize, ctx: usize) {
    if ctx == 0 || len < REGION_SIZE {
        return;
    }
    // SAFETY: `ctx` is the address of a `Shadow` boxed by the attachment,
    // which unguards the mapping before the box is dropped. `base` is the
    // page-aligned start of a writable mapping of `REGION_SIZE` bytes; any
    // bytes are a valid `SharedRegion` (all atomics).
    let (shadow, region) = unsafe { (&*(ctx as *const Shadow), &*(base as *const SharedRegion)) };
    shadow.refill(region);
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::region::{Attachment, Kind};
    use std::sync::atomic::Ordering::SeqCst;

    const M: u64 = 1 << 20;

    /// The region file truncated under an attached process: the next access
    /// re-attaches the file, refilled with the limit and this process's
    /// usage, so the limit still holds for what the process already has;
    /// a sibling attached to the same file, which did not fault, publishes
    /// its own usage again before it next allocates, so the two still share
    /// one limit.
    #[test]
    fn a_truncated_region_is_refilled_with_the_limit_and_own_usage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        let p = path.display().to_string();
        let cfg = Config::from_lookup(move |k| match k {
            "CUDA_DEVICE_MEMORY_SHARED_CACHE" => Some(p.clone()),
            "CUDA_DEVICE_MEMORY_LIMIT" => Some("1g".to_owned()),
            _ => None,
        });
        let att = Attachment::open(&cfg, std::process::id() as i32).unwrap();
        // The sibling: a live process of its own (a slot is per process).
        let mut other = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let sibling = Attachment::open(&cfg, other.id() as i32).unwrap();
        assert_ne!(sibling.slot_index(), att.slot_index());
        assert!(crate::memory::limit::reserve_committed(
            &att,
            0,
            600 * M,
            Kind::Data
        ));
        att.add_unchecked(0, 64 * M, Kind::Context);
        crate::memory::limit::release_counted(&att, 0, 100 * M, Kind::Data);
        assert!(crate::memory::limit::reserve_committed(
            &sibling,
            0,
            200 * M,
            Kind::Data
        ));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        let r = att.region();
        assert_eq!(r.limit[0].load(SeqCst), 1 << 30);
        let base = r as *const _ as *const u8;
        assert_eq!(crate::sigbus_guard::reattached(base), 1);
        assert!(!crate::sigbus_guard::is_lost(base));
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            vgpu_common::region::REGION_SIZE as u64
        );
        assert!(r.is_initialized());
        let s = &r.procs[att.slot_index()];
        assert_eq!(s.pid.load(SeqCst), att.pid());
        assert_eq!(s.used[0].data_size.load(SeqCst), 500 * M);
        assert_eq!(s.used[0].context_size.load(SeqCst), 64 * M);
        assert_eq!(s.used[0].total.load(SeqCst), 564 * M);
        // 564 + the sibling's 200 held: 300 more would pass 1 GiB.
        assert!(
            !crate::memory::limit::reserve_committed(&sibling, 0, 300 * M, Kind::Data),
            "the sibling's own 200 MiB count again"
        );
        assert!(crate::memory::limit::reserve_committed(
            &sibling,
            0,
            200 * M,
            Kind::Data
        ));
        assert!(
            !crate::memory::limit::reserve_committed(&att, 0, 100 * M, Kind::Data),
            "past the limit"
        );
        assert!(crate::memory::limit::reserve_committed(
            &att,
            0,
            50 * M,
            Kind::Data
        ));
        let _ = other.kill();
        let _ = other.wait();
    }
}
