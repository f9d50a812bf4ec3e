//! `vgpu_container_launches_total`: the launches each container's hooks
//! counted in their slots, kept monotonic.
//!
//! A slot's count is its process's; when the process exits and the slot is
//! freed (or taken by another process) the count leaves the region. The
//! ledger remembers each slot's last count and, when the slot is freed,
//! reused or its count falls, keeps that count as retired: the container's
//! total is retired + live, and never goes down while the region is open.
//! Launches a process made after the last scan before its slot was freed
//! are not seen. The counts are the tenant's to write: a forged one only
//! inflates its own container's counter.

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::region::{SharedRegion, MAX_DEVICES};

/// A process: namespace PID, PID-namespace inode, start time.
type SlotId = (i32, u64, u64);

#[derive(Debug)]
struct Seen {
    id: SlotId,
    last: [u64; MAX_DEVICES],
}

#[derive(Debug, Default)]
struct RegionLedger {
    slots: HashMap<usize, Seen>,
    retired: [u64; MAX_DEVICES],
    /// Scan generation that last saw this region.
    seen: u64,
}

impl RegionLedger {
    fn retire(&mut self, last: &[u64; MAX_DEVICES]) {
        for (r, l) in self.retired.iter_mut().zip(last) {
            *r = r.saturating_add(*l);
        }
    }

    /// Takes one scan's slots in use (`(index, process, counts)`) and
    /// returns the totals per device.
    fn observe(
        &mut self,
        slots: impl Iterator<Item = (usize, SlotId, [u64; MAX_DEVICES])>,
    ) -> [u64; MAX_DEVICES] {
        let mut now: HashMap<usize, Seen> = HashMap::new();
        for (index, id, counts) in slots {
            match self.slots.remove(&index) {
                Some(old) if old.id == id => {
                    for (d, (&l, &c)) in old.last.iter().zip(&counts).enumerate() {
                        if c < l {
                            // Zeroed or rewritten: keep what was counted.
                            self.retired[d] = self.retired[d].saturating_add(l);
                        }
                    }
                    now.insert(index, Seen { id, last: counts });
                }
                Some(old) => {
                    self.retire(&old.last);
                    now.insert(index, Seen { id, last: counts });
                }
                None => {
                    now.insert(index, Seen { id, last: counts });
                }
            }
        }
        let gone: Vec<Seen> = self.slots.drain().map(|(_, s)| s).collect();
        for s in &gone {
            self.retire(&s.last);
        }
        self.slots = now;
        let mut total = self.retired;
        for s in self.slots.values() {
            for (t, l) in total.iter_mut().zip(&s.last) {
                *t = t.saturating_add(*l);
            }
        }
        total
    }
}

/// Every open region's ledger, keyed by the region file's (device, inode).
#[derive(Debug, Default)]
pub struct Ledger {
    regions: HashMap<(u64, u64), RegionLedger>,
    scan: u64,
}

impl Ledger {
    /// Starts a scan: regions not observed during it are forgotten by
    /// [`Ledger::end_scan`].
    pub fn begin_scan(&mut self) {
        self.scan = self.scan.wrapping_add(1);
    }

    /// The container's launch totals per device, from this scan of
    /// `region`'s slots in use (a copy holds no others: reading the rest
    /// would only fault in zero pages).
    pub fn observe(&mut self, key: (u64, u64), region: &SharedRegion) -> [u64; MAX_DEVICES] {
        let r = self.regions.entry(key).or_default();
        r.seen = self.scan;
        let slots = region
            .active_slots()
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let pid = s.pid.load(SeqCst);
                (pid != 0).then(|| {
                    let id = (pid, s.pidns.load(SeqCst), s.start.load(SeqCst));
                    (
                        i,
                        id,
                        std::array::from_fn(|d| s.used[d].launches.load(SeqCst)),
                    )
                })
            });
        r.observe(slots)
    }

    /// Forgets the regions this scan did not observe (closed files).
    pub fn end_scan(&mut self) {
        let scan = self.scan;
        self.regions.retain(|_, r| r.seen == scan);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(d0: u64, d1: u64) -> [u64; MAX_DEVICES] {
        let mut c = [0; MAX_DEVICES];
        c[0] = d0;
        c[1] = d1;
        c
    }

    #[test]
    fn the_total_never_falls_when_slots_are_freed_reused_or_zeroed() {
        let mut r = RegionLedger::default();
        let a = (1, 7, 100);
        let b = (2, 7, 200);
        let t = r.observe([(0, a, counts(10, 1)), (1, b, counts(5, 0))].into_iter());
        assert_eq!((t[0], t[1]), (15, 1));
        let t = r.observe([(0, a, counts(30, 1)), (1, b, counts(6, 0))].into_iter());
        assert_eq!((t[0], t[1]), (36, 1));
        // b exits (slot freed); a new process c takes slot 0 after a exited.
        let c = (1, 7, 900);
        let t = r.observe([(0, c, counts(4, 0))].into_iter());
        assert_eq!((t[0], t[1]), (30 + 6 + 4, 1));
        // c's count is zeroed in place: what it had counted stays.
        let t = r.observe([(0, c, counts(0, 0))].into_iter());
        assert_eq!(t[0], 40);
        let t = r.observe([(0, c, counts(2, 0))].into_iter());
        assert_eq!(t[0], 42);
        let t = r.observe(std::iter::empty());
        assert_eq!((t[0], t[1]), (42, 1));
    }

    #[test]
    fn regions_not_seen_in_a_scan_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let f = vgpu_common::view::RegionFile::create_or_open(&dir.path().join("r")).unwrap();
        let region = f.region();
        region.procs[5].pid.store(3, SeqCst);
        region.procs[5].used[1].launches.store(9, SeqCst);
        region.proc_num.store(6, SeqCst);
        let mut l = Ledger::default();
        l.begin_scan();
        assert_eq!(l.observe((1, 2), region)[1], 9);
        l.end_scan();
        assert_eq!(l.regions.len(), 1);
        l.begin_scan();
        l.end_scan();
        assert!(l.regions.is_empty());
    }
}
