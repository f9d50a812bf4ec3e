//! Freeing the slot of a dead process: the one decision ("is the process
//! this slot records dead?") and the one sequence of writes that frees it,
//! shared by the hook (on its mapping, under the region lock), the daemon's
//! reclaimer and `vgpu cleanup` (by `pwrite` through [`RegionIo`], which
//! never maps a tenant's file).
//!
//! Freeing never moves a slot (other processes keep pointers to their own)
//! and clears the slot before its `pid`: a reader that sees `pid == 0` sees
//! no leftover usage, and a claimant (a CAS of `pid` from 0) finds a clean
//! slot.

use core::convert::Infallible;
use core::mem::{offset_of, size_of};
use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::SeqCst;

use crate::proc_identity::ProcIdentity;
use crate::region::{status, ProcSlot, SharedRegion, MAX_DEVICES};
use crate::region_io::{slot_offset, IoError, RegionIo};

/// Whether the process a slot records (`recorded`) is dead, given what a
/// look-up of its PID found now: `None` when no live (non-zombie) process
/// has the PID, else that process's identity (0 = part unknown). A live
/// process is another one when a part both sides know differs: another PID
/// namespace, or another start time (the PID was reused).
///
/// The caller makes sure the look-up names the slot's process by its PID:
/// `/proc/<hostpid>` on the host, or `/proc/<pid>` of the slot's own PID
/// namespace. Anything it cannot read is not a death.
pub fn is_dead(recorded: &ProcIdentity, now: Option<&ProcIdentity>) -> bool {
    now.is_none_or(|now| !now.matches(recorded.pidns, recorded.start))
}

/// Whether a slot is free and clean: `pid` 0, status "exited", and none of
/// the counters a process writes (usage, launches, NVML samples) left over.
/// A free slot that is not clean (a HAMi-core exit leaves its counters and
/// status behind) is [`clear`]ed.
pub fn is_clean(slot: &ProcSlot) -> bool {
    slot.pid.load(SeqCst) == 0
        && slot.status.load(SeqCst) == status::EXITED
        && (0..MAX_DEVICES).all(|d| {
            let m = &slot.used[d];
            [
                &m.context_size,
                &m.module_size,
                &m.data_size,
                &m.total,
                &m.launches,
                &slot.monitorused[d],
                &slot.device_util[d].sm_util,
            ]
            .iter()
            .all(|c| c.load(SeqCst) == 0)
        })
}

/// Every counter word of `slot` on device `dev`: its usage (the words
/// HAMi-core leaves unused too), `monitorused` and the utilization words.
fn counters(slot: &ProcSlot, dev: usize) -> impl Iterator<Item = &AtomicU64> {
    let m = &slot.used[dev];
    let u = &slot.device_util[dev];
    [
        &m.context_size,
        &m.module_size,
        &m.data_size,
        &m.offset,
        &m.total,
        &m.launches,
        &m.host_bytes,
    ]
    .into_iter()
    .chain(&m.unused)
    .chain([&slot.monitorused[dev], &u.dec_util, &u.enc_util, &u.sm_util])
    .chain(&u.unused)
}

/// A word of a slot that freeing zeroes, after the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Word {
    Seqlock,
    Hostpid,
    Pidns,
    Start,
    /// Zero is [`status::EXITED`].
    Status,
}

const _: () = assert!(status::EXITED == 0);

impl Word {
    /// The order [`clear`] writes them in: `status` last, so a slot that
    /// reads "exited" has no identity or host PID left.
    pub const ORDER: [Word; 5] = [
        Word::Seqlock,
        Word::Hostpid,
        Word::Pidns,
        Word::Start,
        Word::Status,
    ];

    /// Offset in the slot, and width in bytes.
    pub const fn place(self) -> (usize, usize) {
        match self {
            Word::Seqlock => (offset_of!(ProcSlot, seqlock), 8),
            Word::Hostpid => (offset_of!(ProcSlot, hostpid), 4),
            Word::Pidns => (offset_of!(ProcSlot, pidns), 8),
            Word::Start => (offset_of!(ProcSlot, start), 8),
            Word::Status => (offset_of!(ProcSlot, status), 4),
        }
    }
}

/// The per-device counters (`used`, `monitorused`, `device_util`) are one
/// span of the slot, ending where `status` starts.
const COUNTERS: (usize, usize) = (
    offset_of!(ProcSlot, used),
    offset_of!(ProcSlot, status) - offset_of!(ProcSlot, used),
);
const _: () = {
    assert!(offset_of!(ProcSlot, monitorused) == COUNTERS.0 + MAX_DEVICES * 64);
    assert!(
        offset_of!(ProcSlot, device_util) == offset_of!(ProcSlot, monitorused) + MAX_DEVICES * 8
    );
    assert!(COUNTERS.1 == MAX_DEVICES * (64 + 8 + 48));
};

/// Where a region's slots are written: the mapping ([`SharedRegion`],
/// atomic stores) or the file ([`RegionIo`], `pwrite`).
pub trait SlotStore {
    type Error;
    /// Zeroes slot `i`'s per-device counters.
    fn zero_counters(&self, i: usize) -> Result<(), Self::Error>;
    /// Zeroes one word of slot `i`.
    fn zero(&self, i: usize, word: Word) -> Result<(), Self::Error>;
    /// Sets slot `i`'s `pid` to 0 if it still holds `pid`; false, nothing
    /// written, if it holds another (re-claimed meanwhile).
    fn vacate(&self, i: usize, pid: i32) -> Result<bool, Self::Error>;
}

/// Clears slot `i` but its `pid`: counters, seqlock, host PID, identity,
/// then status "exited".
pub fn clear<S: SlotStore + ?Sized>(store: &S, i: usize) -> Result<(), S::Error> {
    store.zero_counters(i)?;
    Word::ORDER.iter().try_for_each(|&w| store.zero(i, w))
}

/// Frees slot `i` of (dead) namespace PID `pid`: [`clear`], then `pid` set
/// to 0 if the slot still holds it. Returns whether it was freed. The
/// caller holds the region lock.
pub fn free<S: SlotStore + ?Sized>(store: &S, i: usize, pid: i32) -> Result<bool, S::Error> {
    clear(store, i)?;
    store.vacate(i, pid)
}

/// The mapping: atomic stores. A slot index past the region is a no-op.
impl SlotStore for SharedRegion {
    type Error = Infallible;

    fn zero_counters(&self, i: usize) -> Result<(), Infallible> {
        let Some(slot) = self.procs.get(i) else {
            return Ok(());
        };
        for dev in 0..MAX_DEVICES {
            for c in counters(slot, dev) {
                c.store(0, SeqCst);
            }
        }
        Ok(())
    }

    fn zero(&self, i: usize, word: Word) -> Result<(), Infallible> {
        if let Some(s) = self.procs.get(i) {
            match word {
                Word::Seqlock => s.seqlock.store(0, SeqCst),
                Word::Hostpid => s.hostpid.store(0, SeqCst),
                Word::Pidns => s.pidns.store(0, SeqCst),
                Word::Start => s.start.store(0, SeqCst),
                Word::Status => s.status.store(status::EXITED, SeqCst),
            }
        }
        Ok(())
    }

    fn vacate(&self, i: usize, pid: i32) -> Result<bool, Infallible> {
        Ok(self
            .procs
            .get(i)
            .is_some_and(|s| s.pid.compare_exchange(pid, 0, SeqCst, SeqCst).is_ok()))
    }
}

/// The file, by `pwrite`: each span in one write.
impl SlotStore for RegionIo {
    type Error = IoError;

    fn zero_counters(&self, i: usize) -> Result<(), IoError> {
        let (off, len) = COUNTERS;
        self.write_at(slot_offset(i) + off as u64, &[0u8; COUNTERS.1][..len])
    }

    fn zero(&self, i: usize, word: Word) -> Result<(), IoError> {
        let (off, len) = word.place();
        self.write_at(slot_offset(i) + off as u64, &[0u8; 8][..len])
    }

    fn vacate(&self, i: usize, pid: i32) -> Result<bool, IoError> {
        // A read then a write, not a compare-and-swap: the window is the two
        // syscalls, under the region lock (a hook re-claiming a slot without
        // the lock is the only writer that can slip in).
        if self.slot_head(i)?.0 != pid {
            return Ok(false);
        }
        self.write_i32(slot_offset(i), 0)?;
        Ok(true)
    }
}

const _: () = assert!(size_of::<ProcSlot>() > COUNTERS.0 + COUNTERS.1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::{MAGIC, MAJOR_VERSION};
    use crate::view::RegionFile;
    use std::sync::atomic::Ordering::Relaxed;

    fn id(pid: i32, pidns: u64, start: u64) -> ProcIdentity {
        ProcIdentity { pid, pidns, start }
    }

    #[test]
    fn dead_means_gone_or_another_process_by_a_known_part() {
        let rec = id(7, 100, 5000);
        assert!(is_dead(&rec, None), "no process has the PID");
        assert!(!is_dead(&rec, Some(&rec)), "the same process");
        assert!(is_dead(&rec, Some(&id(7, 101, 5000))), "another namespace");
        assert!(is_dead(&rec, Some(&id(7, 100, 5001))), "a reused PID");
        // What either side does not know is no proof.
        assert!(!is_dead(&rec, Some(&id(7, 0, 0))));
        assert!(!is_dead(&id(7, 0, 0), Some(&id(7, 101, 5001))));
        assert!(!is_dead(&id(7, 100, 0), Some(&id(7, 100, 5001))));
    }

    /// A slot of pid 9 in use on two devices, with its identity.
    fn fill(s: &ProcSlot) {
        s.pid.store(9, Relaxed);
        s.hostpid.store(4009, Relaxed);
        s.status.store(status::SUSPENDED, Relaxed);
        s.seqlock.store(4, Relaxed);
        s.pidns.store(0xabc, Relaxed);
        s.start.store(77, Relaxed);
        for d in [0, MAX_DEVICES - 1] {
            let m = &s.used[d];
            for c in [&m.context_size, &m.module_size, &m.data_size, &m.total] {
                c.store(1 << 20, Relaxed);
            }
            m.launches.store(3, Relaxed);
            s.monitorused[d].store(5, Relaxed);
            s.device_util[d].sm_util.store(40, Relaxed);
            s.device_util[d].enc_util.store(1, Relaxed);
        }
    }

    /// Every word of the slot but `pid` is zero.
    fn all_zero_but_pid(s: &ProcSlot) -> bool {
        let words = [
            s.hostpid.load(Relaxed) as u64,
            s.status.load(Relaxed) as u64,
            s.seqlock.load(Relaxed),
            s.pidns.load(Relaxed),
            s.start.load(Relaxed),
        ];
        let zero = (0..MAX_DEVICES).all(|d| counters(s, d).all(|c| c.load(Relaxed) == 0));
        words.iter().all(|&w| w == 0) && zero
    }

    #[test]
    fn freeing_on_the_mapping_clears_then_vacates_only_the_recorded_pid() {
        let dir = tempfile::tempdir().unwrap();
        let f = RegionFile::create_or_open(&dir.path().join("r.cache")).unwrap();
        let r = f.region();
        fill(&r.procs[3]);
        fill(&r.procs[4]);
        assert!(!is_clean(&r.procs[3]));
        assert_eq!(free(r, 3, 9), Ok(true));
        assert!(all_zero_but_pid(&r.procs[3]));
        assert_eq!(r.procs[3].pid.load(Relaxed), 0);
        assert!(is_clean(&r.procs[3]));
        assert!(!is_clean(&r.procs[4]), "a neighbour is untouched");
        assert_eq!(r.procs[4].used[0].total.load(Relaxed), 1 << 20);
        // Re-claimed by pid 10 meanwhile: cleared, but its pid stays.
        fill(&r.procs[5]);
        r.procs[5].pid.store(10, Relaxed);
        assert_eq!(free(r, 5, 9), Ok(false));
        assert_eq!(r.procs[5].pid.load(Relaxed), 10);
        // A free slot with leftovers is cleared, not vacated.
        fill(&r.procs[6]);
        r.procs[6].pid.store(0, Relaxed);
        assert!(!is_clean(&r.procs[6]));
        assert_eq!(clear(r, 6), Ok(()));
        assert!(is_clean(&r.procs[6]));
        assert_eq!(free(r, usize::MAX, 9), Ok(false), "past the region");
    }

    #[test]
    fn freeing_through_the_file_writes_the_same_bytes_as_on_the_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        let f = RegionFile::create_or_open(&path).unwrap();
        let r = f.region();
        r.initialized_flag.store(MAGIC, Relaxed);
        r.major_version.store(MAJOR_VERSION, Relaxed);
        for i in [1, 2, 3] {
            fill(&r.procs[i]);
        }
        r.procs[3].pid.store(10, Relaxed);
        let open = || {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            RegionIo::new(file, &path, true).unwrap()
        };
        let io = open();
        assert!(free(&io, 1, 9).unwrap());
        assert!(!free(&io, 3, 9).unwrap(), "slot 3 holds pid 10");
        // The mapping sees the writes: slot 1 freed, slot 2 untouched,
        // slot 3 cleared with its pid kept.
        assert!(is_clean(&r.procs[1]) && all_zero_but_pid(&r.procs[1]));
        assert_eq!(
            r.procs[2].used[MAX_DEVICES - 1].total.load(Relaxed),
            1 << 20
        );
        assert_eq!(r.procs[2].start.load(Relaxed), 77);
        assert!(all_zero_but_pid(&r.procs[3]));
        assert_eq!(r.procs[3].pid.load(Relaxed), 10);
        // Slot 2 freed on the mapping is byte for byte slot 1.
        assert_eq!(free(r, 2, 9), Ok(true));
        let bytes = std::fs::read(&path).unwrap();
        let slot = |i: usize| {
            let at = slot_offset(i) as usize;
            bytes[at..at + size_of::<ProcSlot>()].to_vec()
        };
        assert_eq!(slot(1), slot(2));
        assert!(slot(1).iter().all(|&b| b == 0));
        // A read-only descriptor frees nothing.
        let ro = RegionIo::new(std::fs::File::open(&path).unwrap(), &path, false).unwrap();
        fill(&r.procs[1]);
        assert!(matches!(free(&ro, 1, 9), Err(IoError::ReadOnly { .. })));
        assert_eq!(r.procs[1].pid.load(Relaxed), 9);
    }
}
