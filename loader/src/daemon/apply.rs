//! Every write the daemon makes into a tenant's file. The stages decide
//! ([`Write`]: the file, the field, the value, and what the field or its
//! owner must still hold); this module carries the writes out under one set
//! of rules:
//!
//! - a region is written only through the descriptor `regions::open` gave
//!   the cache (never a path opened anew, never a mapping a tenant could
//!   truncate under the daemon); a node table is opened through
//!   `regions::open` too, on its type, without following a symlink;
//! - one `pwrite` of one field per write, at an offset inside the file's
//!   fixed size, checked against the file's size right before: a write
//!   never extends a file;
//! - compare, then write: what was judged is read again just before, and a
//!   write whose expectation no longer holds is skipped ([`Outcome::Stale`]),
//!   so a newer write (the tenant's, an admin's, a process that took the
//!   slot over) is never overwritten by a stale decision.
//!
//! Freeing a dead process's slot is several fields ([`free_slots`]): there
//! the compare-then-write runs under the region's lock.
//!
//! Signals are not writes into files: the integrity policy's kills stay in
//! `judge::integrity::enforce`, next to the pidfd proof they depend on.

use std::collections::HashMap;
use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use vgpu_common::node::SIZE as TABLE_SIZE;
use vgpu_common::region::rules::sm_limit_shown;
use vgpu_common::region::{DeviceUtil, ProcSlot, SharedRegion, MAX_DEVICES, MAX_PROCS};
use vgpu_common::region_io::{slot_offset, IoError, RegionIo};
use vgpu_common::{lock, reclaim};

use crate::daemon::collect::procfs::ProcIdentity;
use crate::daemon::collect::region_cache::{RegionCache, RegionKey};
use crate::daemon::state::findings::LimitName;
use crate::regions::open::{open_file_in, Access, OpenError};

/// Where a node table's members start, and a member's size and words'
/// offsets (`vgpu_common::node::Member`; its layout is asserted there).
pub const MEMBERS_AT: u64 = 64;
pub const MEMBER_SIZE: u64 = 64;
pub const OWNER_AT: u64 = 0;
pub const RANK_AT: u64 = 20;

/// The file a write goes into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A region the cache holds open.
    Region(RegionKey),
    /// A node table (`vgpu_common::node`), by path.
    NodeTable(PathBuf),
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
    /// A node table member's `owner` (u64) or `rank` (u32).
    Member { index: usize, word: MemberWord },
}

/// A word of a node table's member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberWord {
    Owner,
    Rank,
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
    /// The member's `owner` is this container id.
    MemberOwner(u64),
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
    #[error("node table {path}: could not be opened")]
    Unopened { path: PathBuf },
    #[error("node table {path}: shorter than a table")]
    ShortTable { path: PathBuf },
    #[error("node table {path}: {source}")]
    Table {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Applies `writes` in order: regions through `cache`'s descriptors, node
/// tables each opened once. One outcome per write, in the same order;
/// skipped and failed writes are logged here.
pub fn apply(cache: &RegionCache, writes: &[Write]) -> Vec<Outcome> {
    apply_in(Some(cache), writes)
}

/// [`apply`] for writes into node tables alone (a region's fails).
pub fn apply_tables(writes: &[Write]) -> Vec<Outcome> {
    apply_in(None, writes)
}

fn apply_in(cache: Option<&RegionCache>, writes: &[Write]) -> Vec<Outcome> {
    let mut tables: HashMap<PathBuf, Result<File, ()>> = HashMap::new();
    writes
        .iter()
        .map(|w| {
            let outcome = match &w.target {
                Target::Region(key) => match cache.and_then(|c| c.get(key)) {
                    Some(r) => to_region(&r.file, w),
                    None => Outcome::Failed(ApplyError::NotOpen(*key)),
                },
                Target::NodeTable(path) => {
                    let file = tables
                        .entry(path.clone())
                        .or_insert_with(|| open_table(path).map_err(|e| tracing::warn!("{e}")));
                    match file {
                        Ok(f) => to_table(f, path, w),
                        // Its error was logged once, when it failed to open.
                        Err(()) => Outcome::Failed(ApplyError::Unopened { path: path.clone() }),
                    }
                }
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
        Field::Member { .. } => Err(ApplyError::Misplaced {
            target: Target::Region((0, 0)),
            field,
        }),
    }
}

fn slot_of(field: Field) -> Option<usize> {
    match field {
        Field::SlotHostPid { slot } | Field::SlotSmUtil { slot, .. } => Some(slot),
        Field::Limit { .. } | Field::Member { .. } => None,
    }
}

fn region_write(io: &RegionIo, w: &Write) -> Result<Outcome, ApplyError> {
    let misplaced = || ApplyError::Misplaced {
        target: w.target.clone(),
        field: w.field,
    };
    let (at, width) = region_field(w.field).map_err(|e| match e {
        ApplyError::Misplaced { .. } => misplaced(),
        e => e,
    })?;
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
        Expect::MemberOwner(_) => return Err(misplaced()),
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

/// Opens a table for reading and writing through an `O_PATH` lookup with no
/// symlink (`regions::open`): a FIFO or a device named like a table is
/// refused on its type, never opened.
pub fn open_table(path: &Path) -> Result<File, OpenError> {
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) => open_file_in(dir, name, Access::ReadWrite),
        _ => Err(OpenError::Open {
            path: path.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a table's name"),
        }),
    }
}

pub fn to_table(file: &File, path: &Path, w: &Write) -> Outcome {
    match table_write(file, path, w) {
        Ok(o) => o,
        Err(e) => Outcome::Failed(e),
    }
}

/// Writes a member's word if its owner is still the one judged (a member
/// taken over meanwhile by a container the hook let in is left alone).
fn table_write(file: &File, path: &Path, w: &Write) -> Result<Outcome, ApplyError> {
    let misplaced = || ApplyError::Misplaced {
        target: w.target.clone(),
        field: w.field,
    };
    let (Field::Member { index, word }, Expect::MemberOwner(owner)) = (w.field, w.expect) else {
        return Err(misplaced());
    };
    if index >= vgpu_common::node::MEMBERS {
        return Err(ApplyError::OutOfRange(w.field));
    }
    let io = |source| ApplyError::Table {
        path: path.to_owned(),
        source,
    };
    let at = MEMBERS_AT + MEMBER_SIZE * index as u64;
    // Checked right before the write: one past a truncated file's end
    // would extend it.
    if file.metadata().map_err(io)?.len() < TABLE_SIZE as u64 {
        return Err(ApplyError::ShortTable {
            path: path.to_owned(),
        });
    }
    let mut now = [0u8; 8];
    file.read_exact_at(&mut now, at + OWNER_AT).map_err(io)?;
    if u64::from_le_bytes(now) != owner {
        return Ok(Outcome::Stale);
    }
    let too_wide = || ApplyError::TooWide {
        field: w.field,
        value: w.value,
    };
    match word {
        MemberWord::Owner => file
            .write_all_at(&w.value.to_le_bytes(), at + OWNER_AT)
            .map_err(io)?,
        MemberWord::Rank => {
            let v = u32::try_from(w.value).map_err(|_| too_wide())?;
            file.write_all_at(&v.to_le_bytes(), at + RANK_AT)
                .map_err(io)?;
        }
    }
    Ok(Outcome::Written)
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

        // A node table likewise.
        let table = dir.path().join("t");
        std::fs::write(&table, vec![0u8; 128]).unwrap();
        let file = open_table(&table).unwrap();
        let w = Write {
            target: Target::NodeTable(table.clone()),
            field: Field::Member {
                index: 1,
                word: MemberWord::Owner,
            },
            value: 0,
            expect: Expect::MemberOwner(9),
        };
        let o = to_table(&file, &table, &w);
        assert!(
            matches!(o, Outcome::Failed(ApplyError::ShortTable { .. })),
            "{o:?}"
        );
        assert_eq!(std::fs::metadata(&table).unwrap().len(), 128);
    }

    #[test]
    fn a_member_is_written_only_while_its_owner_is_the_one_judged() {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("t");
        let mut bytes = vec![0u8; TABLE_SIZE];
        let at = (MEMBERS_AT + MEMBER_SIZE * 2) as usize;
        bytes[at..at + 8].copy_from_slice(&7u64.to_le_bytes());
        bytes[at + 20..at + 24].copy_from_slice(&1u32.to_le_bytes());
        std::fs::write(&table, &bytes).unwrap();
        let file = open_table(&table).unwrap();
        let demote = |owner| Write {
            target: Target::NodeTable(table.clone()),
            field: Field::Member {
                index: 2,
                word: MemberWord::Rank,
            },
            value: 2,
            expect: Expect::MemberOwner(owner),
        };
        assert!(matches!(
            to_table(&file, &table, &demote(8)),
            Outcome::Stale
        ));
        assert!(to_table(&file, &table, &demote(7)).written());
        let now = std::fs::read(&table).unwrap();
        assert_eq!(now[at + 20..at + 24], 2u32.to_le_bytes());
        assert_eq!(now.len(), TABLE_SIZE);
    }
}
