//! Every write the daemon makes into a tenant's file. The stages decide
//! ([`Write`]: the file, the field, the value, and what the field or its
//! owner must still hold); this module carries the writes out under one set
//! of rules:
//!
//! - a region is written only through the descriptor `regions::open` gave
//!   the cache (never a path opened anew, never a mapping a tenant could
//!   truncate under the daemon); a container's sidecar, where its plan of
//!   turns and holds goes ([`plan`]), is opened through `regions::open`
//!   too, on its type, without following a symlink, by the planner;
//! - one `pwrite` of one field per write, at an offset inside the file's
//!   fixed size, checked against the file's size right before: a write
//!   never extends a file;
//! - compare, then write: what was judged is read again just before, and a
//!   write whose expectation no longer holds is skipped ([`Outcome::Stale`]),
//!   so a newer write (the tenant's, an admin's, a process that took the
//!   slot over) is never overwritten by a stale decision.
//!
//! Freeing a dead process's slot is several fields ([`free_slots`]): there
//! the compare-then-write runs under the region's lock. A plan is the
//! daemon's own line of the sidecar, written whole under its sequence word
//! ([`plan`]): nothing there is the tenant's to keep.
//!
//! Signals are not writes into files: the integrity policy's kills stay in
//! `judge::integrity::enforce`, next to the pidfd proof they depend on.

use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::unix::fs::FileExt as _;

use vgpu_common::region::rules::sm_limit_shown;
use vgpu_common::region::{DeviceUtil, ProcSlot, SharedRegion, MAX_DEVICES, MAX_PROCS};
use vgpu_common::region_io::{slot_offset, IoError, RegionIo};
use vgpu_common::sidecar::{plan_at, PlanWords, PLAN_BYTES, PLAN_WORDS_AT};
use vgpu_common::{lock, reclaim};

use crate::daemon::collect::procfs::ProcIdentity;
use crate::daemon::collect::region_cache::{RegionCache, RegionKey};
use crate::daemon::state::findings::LimitName;
use crate::regions::open::OpenError;

/// The file a write goes into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A region the cache holds open.
    Region(RegionKey),
}

/// The field a write stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// A region's limit cell of one device (`limit` or `sm_limit`), u64.
    Limit { limit: LimitName, device: usize },
    /// A slot's `hostpid`, i32.
    SlotHostPid { slot: usize },
    /// A slot's `sm_util` of one device, u64.
    SlotSmUtil { slot: usize, device: usize },
}

/// What must still hold, read just before the write, for it to land.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The field holds exactly this value.
    Holds(u64),
    /// The field, an `sm_limit` cell, shows this percentage
    /// (`rules::sm_limit_shown`: the value the judge compared).
    ShowsSmLimit(u64),
    /// The slot's `hostpid` is this one: the process measured still owns
    /// the slot.
    SlotHostPid(i32),
    /// The slot records this process (`ProcIdentity::is_recorded_in`), and
    /// the field does not hold the value yet (then nothing is written).
    SlotOf(ProcIdentity),
}

/// One decided write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub target: Target,
    pub field: Field,
    pub value: u64,
    pub expect: Expect,
}

/// What became of a write.
#[derive(Debug)]
pub enum Outcome {
    Written,
    /// The field already held the value ([`Expect::SlotOf`]): nothing
    /// written.
    Unchanged,
    /// The expectation no longer held: skipped.
    Stale,
    Failed(ApplyError),
}

impl Outcome {
    pub fn written(&self) -> bool {
        matches!(self, Outcome::Written)
    }
}

/// Why a write could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("region {0:?} is no longer open")]
    NotOpen(RegionKey),
    #[error("{field:?} is not a field of {target:?}")]
    Misplaced { target: Target, field: Field },
    #[error("{0:?} is outside the file's layout")]
    OutOfRange(Field),
    #[error("{value} does not fit {field:?}")]
    TooWide { field: Field, value: u64 },
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("sidecar too short for device {dev}'s plan (an older hook's): not extended")]
    ShortSidecar { dev: usize },
    #[error("writing device {dev}'s plan: {source}")]
    Plan {
        dev: usize,
        #[source]
        source: std::io::Error,
    },
}

/// Applies `writes` in order, each through the descriptor `cache` holds
/// for its region. One outcome per write, in the same order; skipped and
/// failed writes are logged here.
pub fn apply(cache: &RegionCache, writes: &[Write]) -> Vec<Outcome> {
    writes
        .iter()
        .map(|w| {
            let outcome = match &w.target {
                Target::Region(key) => match cache.get(key) {
                    Some(r) => to_region(&r.file, w),
                    None => Outcome::Failed(ApplyError::NotOpen(*key)),
                },
            };
            report(w, &outcome);
            outcome
        })
        .collect()
}

fn report(w: &Write, outcome: &Outcome) {
    match outcome {
        Outcome::Stale => tracing::debug!("{w:?}: changed since judged; not written"),
        Outcome::Failed(e) => tracing::debug!("{w:?}: {e}"),
        Outcome::Written | Outcome::Unchanged => {}
    }
}

/// Applies one write to the region open as `io` (its [`Target`] is taken
/// to be `io`'s).
pub fn to_region(io: &RegionIo, w: &Write) -> Outcome {
    match region_write(io, w) {
        Ok(o) => o,
        Err(e) => Outcome::Failed(e),
    }
}

/// A region field's offset and width (4 or 8 bytes).
fn region_field(field: Field) -> Result<(u64, usize), ApplyError> {
    let out = || Err(ApplyError::OutOfRange(field));
    match field {
        Field::Limit { limit, device } => {
            if device >= MAX_DEVICES {
                return out();
            }
            let base = match limit {
                LimitName::MemoryBytes => offset_of!(SharedRegion, limit),
                LimitName::SmPercent => offset_of!(SharedRegion, sm_limit),
            };
            Ok(((base + device * size_of::<u64>()) as u64, 8))
        }
        Field::SlotHostPid { slot } => {
            if slot >= MAX_PROCS {
                return out();
            }
            Ok((slot_offset(slot) + offset_of!(ProcSlot, hostpid) as u64, 4))
        }
        Field::SlotSmUtil { slot, device } => {
            if slot >= MAX_PROCS || device >= MAX_DEVICES {
                return out();
            }
            let at = offset_of!(ProcSlot, device_util)
                + device * size_of::<DeviceUtil>()
                + offset_of!(DeviceUtil, sm_util);
            Ok((slot_offset(slot) + at as u64, 8))
        }
    }
}

fn slot_of(field: Field) -> Option<usize> {
    match field {
        Field::SlotHostPid { slot } | Field::SlotSmUtil { slot, .. } => Some(slot),
        Field::Limit { .. } => None,
    }
}

fn region_write(io: &RegionIo, w: &Write) -> Result<Outcome, ApplyError> {
    let misplaced = || ApplyError::Misplaced {
        target: w.target.clone(),
        field: w.field,
    };
    let (at, width) = region_field(w.field)?;
    let now = if width == 8 {
        io.read_u64(at)?
    } else {
        // The only 4-byte region field is a slot's `hostpid`.
        let slot = slot_of(w.field).ok_or_else(misplaced)?;
        u64::from(io.slot_head(slot)?.1 as u32)
    };
    let holds = match w.expect {
        Expect::Holds(v) => now == v,
        Expect::ShowsSmLimit(v) => sm_limit_shown(now) == v,
        Expect::SlotHostPid(h) => {
            let slot = slot_of(w.field).ok_or_else(misplaced)?;
            io.slot_head(slot)?.1 == h
        }
        Expect::SlotOf(me) => {
            let slot = slot_of(w.field).ok_or_else(misplaced)?;
            me.is_recorded_in(&io.slot_identity(slot)?)
        }
    };
    if !holds {
        return Ok(Outcome::Stale);
    }
    if matches!(w.expect, Expect::SlotOf(_)) && now == w.value {
        return Ok(Outcome::Unchanged);
    }
    let too_wide = || ApplyError::TooWide {
        field: w.field,
        value: w.value,
    };
    if width == 8 {
        io.write_u64(at, w.value)?;
    } else {
        let v = i32::try_from(w.value).map_err(|_| too_wide())?;
        io.write_i32(at, v)?;
    }
    Ok(Outcome::Written)
}

/// Writes device `dev`'s plan into a container's sidecar open as `file`
/// (the planner opened it through `regions::open`): the daemon's line,
/// whole, between two writes of its sequence word (odd while writing, so a
/// hook reading meanwhile keeps its last plan). Checked against the file's
/// size right before: a short sidecar (an older hook's, not yet extended)
/// is never extended here.
pub fn plan(file: &File, dev: usize, words: PlanWords) -> Outcome {
    match plan_write(file, dev, words) {
        Ok(()) => Outcome::Written,
        Err(e) => Outcome::Failed(e),
    }
}

fn plan_write(file: &File, dev: usize, words: PlanWords) -> Result<(), ApplyError> {
    if dev >= MAX_DEVICES {
        return Err(ApplyError::ShortSidecar { dev });
    }
    let io = |source| ApplyError::Plan { dev, source };
    let at = plan_at(dev);
    if file.metadata().map_err(io)?.len() < at + PLAN_BYTES as u64 {
        return Err(ApplyError::ShortSidecar { dev });
    }
    let mut seq = [0u8; 8];
    file.read_exact_at(&mut seq, at).map_err(io)?;
    let odd = (u64::from_le_bytes(seq) | 1).wrapping_add(2);
    file.write_all_at(&odd.to_le_bytes(), at).map_err(io)?;
    file.write_all_at(&words.to_bytes(), at + PLAN_WORDS_AT as u64)
        .map_err(io)?;
    file.write_all_at(&odd.wrapping_add(1).to_le_bytes(), at)
        .map_err(io)?;
    Ok(())
}

/// A slot of a process proven dead, to free: its index and what it
/// recorded when judged.
#[derive(Debug, Clone, Copy)]
pub struct SlotFree {
    pub slot: usize,
    pub rec: ProcIdentity,
    pub hostpid: i32,
    /// Bytes the slot counted when judged (for the log).
    pub bytes: u64,
}

/// Frees the `dead` slots of the region open as `file` under its lock
/// (tried once, never waited for: a tenant can hold it forever), each only
/// if it still records what was judged and `still_dead` proves it again.
/// Freeing is several fields (`vgpu_common::reclaim::free`, the routine the
/// hook and `vgpu cleanup` use), so its compare-then-write is made under
/// the region lock rather than on one field. Returns how many it freed.
pub fn free_slots(
    file: &RegionIo,
    dead: &[SlotFree],
    still_dead: impl Fn(&SlotFree) -> bool,
) -> usize {
    let guard = match lock::try_lock(file.file()) {
        Ok(Some(g)) => g,
        Ok(None) => {
            tracing::debug!(
                "{}: region lock held; dead slots are freed at a later scan",
                file.path().display()
            );
            return 0;
        }
        Err(e) => {
            tracing::debug!("{}: region lock: {e}", file.path().display());
            return 0;
        }
    };
    let mut n = 0;
    for d in dead {
        let same = match (file.slot_identity(d.slot), file.slot_head(d.slot)) {
            (Ok(rec), Ok((_, hostpid, _))) => rec == d.rec && hostpid == d.hostpid,
            _ => false,
        };
        if !same || !still_dead(d) {
            continue;
        }
        match reclaim::free(file, d.slot, d.rec.pid) {
            Ok(true) => {
                n += 1;
                tracing::info!(
                    "freed slot {} of {}: pid {} (host pid {}) is dead; {} bytes no longer counted",
                    d.slot,
                    file.path().display(),
                    d.rec.pid,
                    d.hostpid,
                    d.bytes
                );
            }
            Ok(false) => {}
            Err(e) => tracing::debug!("{e}"),
        }
    }
    drop(guard);
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::Ordering::Relaxed;
    use vgpu_common::view::RegionFile;

    fn region(dir: &Path) -> (RegionFile, RegionIo, PathBuf) {
        let path = dir.join("r.cache");
        let (f, io) = crate::regions::admin::testutil::initialised_region(&path);
        (f, io, path)
    }

    fn limit(device: usize, value: u64, expect: Expect) -> Write {
        Write {
            target: Target::Region((0, 0)),
            field: Field::Limit {
                limit: LimitName::MemoryBytes,
                device,
            },
            value,
            expect,
        }
    }

    #[test]
    fn a_write_lands_only_where_the_field_holds_what_was_judged() {
        let dir = tempfile::tempdir().unwrap();
        let (f, io, _) = region(dir.path());
        let r = f.region();
        r.limit[0].store(64 << 30, Relaxed);
        r.limit[1].store(5, Relaxed);
        assert!(to_region(&io, &limit(0, 1 << 30, Expect::Holds(64 << 30))).written());
        assert_eq!(r.limit[0].load(Relaxed), 1 << 30);
        // Changed since it was judged: skipped, and said so.
        let o = to_region(&io, &limit(1, 1 << 30, Expect::Holds(4)));
        assert!(matches!(o, Outcome::Stale), "{o:?}");
        assert_eq!(r.limit[1].load(Relaxed), 5);
        let o = to_region(&io, &limit(MAX_DEVICES, 1, Expect::Holds(0)));
        assert!(
            matches!(o, Outcome::Failed(ApplyError::OutOfRange(_))),
            "{o:?}"
        );
    }

    #[test]
    fn a_slot_write_needs_the_slot_still_held() {
        let dir = tempfile::tempdir().unwrap();
        let (f, io, _) = region(dir.path());
        let s = &f.region().procs[3];
        s.hostpid.store(4242, Relaxed);
        let util = |host| Write {
            target: Target::Region((0, 0)),
            field: Field::SlotSmUtil { slot: 3, device: 1 },
            value: 37,
            expect: Expect::SlotHostPid(host),
        };
        assert!(matches!(to_region(&io, &util(7)), Outcome::Stale));
        assert_eq!(s.device_util[1].sm_util.load(Relaxed), 0);
        assert!(to_region(&io, &util(4242)).written());
        assert_eq!(s.device_util[1].sm_util.load(Relaxed), 37);
    }

    #[test]
    fn a_write_never_extends_a_truncated_file() {
        let dir = tempfile::tempdir().unwrap();
        let (_f, io, path) = region(dir.path());
        // The tenant truncates its region after the daemon opened it.
        let short = 4096;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(short)
            .unwrap();
        let o = to_region(&io, &limit(0, 1 << 30, Expect::Holds(0)));
        assert!(matches!(o, Outcome::Failed(_)), "{o:?}");
        let slot = Write {
            target: Target::Region((0, 0)),
            field: Field::SlotSmUtil {
                slot: MAX_PROCS - 1,
                device: 0,
            },
            value: 1,
            expect: Expect::SlotHostPid(0),
        };
        assert!(matches!(to_region(&io, &slot), Outcome::Failed(_)));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), short);
    }

    #[test]
    fn a_plan_is_written_whole_and_never_extends_a_sidecar() {
        use vgpu_common::sidecar::SIZE;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache.sm");
        std::fs::write(&path, vec![0u8; SIZE]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let w = PlanWords {
            planned_until: 11,
            turn: 22,
            hold_until: 33,
            high_inflight_until: 44,
            outranked_until: 55,
        };
        assert!(plan(&file, 3, w).written());
        assert!(plan(&file, 3, w).written());
        let bytes = std::fs::read(&path).unwrap();
        let at = plan_at(3) as usize;
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        assert_eq!(
            &bytes[at + PLAN_WORDS_AT..at + PLAN_WORDS_AT + 40],
            &w.to_bytes()
        );
        assert_eq!(word(at) % 2, 0, "the sequence word is even once written");
        assert_eq!(word(at), 8, "two writes: 3 then 4, 7 then 8");
        let other = plan_at(2) as usize;
        assert!(bytes[other..other + PLAN_BYTES].iter().all(|&b| b == 0));
        // A short (older) sidecar is left as it is.
        file.set_len(1000).unwrap();
        assert!(matches!(
            plan(&file, 3, w),
            Outcome::Failed(ApplyError::ShortSidecar { dev: 3 })
        ));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1000);
    }
}
