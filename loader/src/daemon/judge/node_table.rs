//! The node tables (`vgpu_common::node`), validated by the one party that
//! knows each container from the kernel: every container can write them
//! (HAMi mounts `/tmp/vgpulock` read-write into all of them), so a member
//! counts here only while a live container the daemon tracks vouches for
//! it, and claims no higher priority than its runtime spec gives it.
//!
//! - A member's `owner` is a container's id, drawn by its first process and
//!   kept in the container's `.sm` sidecar (`vgpu_common::sidecar`). The
//!   daemon reads the sidecar of each region a live tracked process holds
//!   a slot in (inside that process's root): those ids, and only those, are
//!   vouched for. A member whose owner no scan vouches for twice in a row
//!   (one scan of grace for a process not tracked yet) is removed.
//! - A vouched member's `rank` (HAMi priority + 1, smaller is higher) is
//!   raised to what the container's OCI spec states (`CUDA_TASK_PRIORITY`;
//!   HAMi's default, 1, when it states none). A container with no spec the
//!   daemon finds (a host process) is not re-ranked.
//!
//! The tables are written with `pwrite` of single words, never mapped (a
//! tenant truncating one would SIGBUS a mapping). The hooks treat an owner
//! of 0 as free (they claim it with a compare-and-swap, and re-join every
//! re-plan, so a live member wrongly freed is back within 10 ms), and never
//! raise a member's stated priority (`Member::set_priority`), so a demotion
//! stays while the member lives. Each action is a finding
//! (`node_table_forged`, action `removed` or `demoted`), counted in
//! `vgpu_violations_total`. See docs/daemon.md, "Threat model".

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vgpu_common::env::TASK_PRIORITY;
use vgpu_common::node::{NodeView, MEMBERS};
use vgpu_common::sidecar;

use crate::daemon::apply::{
    self, open_table, ApplyError, Expect, Field, MemberWord, Outcome, Target, Write,
};
use crate::daemon::collect::container_identity::ContainerIdentity;
use crate::daemon::collect::procfs::Procfs;
use crate::daemon::judge::integrity::expected::lookup;
use crate::daemon::judge::integrity::spec::{self, SpecPattern};
use crate::daemon::state::findings::{Finding, Kind};
use crate::regions::open::{open_file, open_file_in_process, Access};

/// Tables looked at in the directory, at most (one per GPU of the node).
const MAX_TABLES: usize = 64;
/// Directory entries read per scan, at most: any tenant can fill the
/// directory, and a scan's cost must not grow with what it puts there.
const MAX_ENTRIES: usize = 4096;
/// A member the daemon removes or demotes: the write, and the finding it
/// makes once written.
#[derive(Debug)]
pub struct Repair {
    pub write: Write,
    pub finding: Finding,
}

/// A container's spec priority is read again after this long.
const SPEC_TTL: Duration = Duration::from_secs(30);
/// HAMi's priority for a container whose spec states none (the lowest).
const DEFAULT_PRIORITY: i32 = 1;
/// The container id's offset in a sidecar (asserted in `sidecar`).
const SIDECAR_ID_AT: u64 = 16;

/// A live process the daemon tracks, with the region its slot is in.
#[derive(Clone, Debug)]
pub struct Holder<'a> {
    /// Host PID.
    pub pid: u32,
    pub identity: &'a ContainerIdentity,
    /// The region as the process names it, or its host path.
    pub region: &'a Path,
    /// `region` is a host path (found under HAMi's containers directory).
    pub on_host: bool,
}

/// Who vouches for a container id.
#[derive(Clone, Debug)]
struct Voucher {
    pid: u32,
    identity: ContainerIdentity,
    /// The rank the container's spec allows at most (`None`: no spec).
    rank: Option<u32>,
}

/// The validator's state.
pub struct NodeTables {
    dir: PathBuf,
    specs: Vec<SpecPattern>,
    procfs: Procfs,
    /// Spec priority by container id, and when it was read.
    priorities: HashMap<String, (Option<i32>, Instant)>,
    /// Members found unvouched at the last scan: (table, index, owner).
    suspects: HashSet<(PathBuf, usize, u64)>,
    /// Tables already warned about (unreadable, not ours).
    warned: HashSet<PathBuf>,
}

impl NodeTables {
    /// Validates the tables in `dir` (the host path of the node directory),
    /// ranks from the specs `specs` names.
    pub fn new(dir: PathBuf, specs: Vec<SpecPattern>, procfs: Procfs) -> Self {
        Self {
            dir,
            specs,
            procfs,
            priorities: HashMap::new(),
            suspects: HashSet::new(),
            warned: HashSet::new(),
        }
    }

    /// One pass over every table: removes the members no holder vouches
    /// for, demotes the ones claiming more than their spec; returns a
    /// finding per action.
    pub fn scan(&mut self, holders: &[Holder<'_>], now_ms: u64) -> Vec<Finding> {
        let repairs = self.judge(holders, now_ms);
        let writes: Vec<Write> = repairs.iter().map(|r| r.write.clone()).collect();
        apply::apply_tables(&writes)
            .into_iter()
            .zip(repairs)
            .filter_map(|(o, r)| match o {
                Outcome::Written => Some(r.finding),
                // Taken over, truncated or gone since judged: nothing done
                // (an open that failed was logged by `apply`).
                Outcome::Stale
                | Outcome::Unchanged
                | Outcome::Failed(ApplyError::ShortTable { .. } | ApplyError::Unopened { .. }) => {
                    None
                }
                Outcome::Failed(e) => {
                    tracing::warn!("{e}");
                    None
                }
            })
            .collect()
    }

    /// The repairs one pass over every table decides: each a write for
    /// `daemon::apply` and the finding it makes once written.
    pub fn judge(&mut self, holders: &[Holder<'_>], now_ms: u64) -> Vec<Repair> {
        let tables = self.tables();
        if tables.is_empty() {
            self.suspects.clear();
            return Vec::new();
        }
        let vouched = self.vouched(holders);
        let mut out = Vec::new();
        let mut suspects = HashSet::new();
        for path in tables {
            self.check_table(&path, &vouched, &mut suspects, &mut out, now_ms);
        }
        self.suspects = suspects;
        let now = Instant::now();
        self.priorities
            .retain(|_, (_, at)| now.duration_since(*at) < SPEC_TTL * 4);
        out
    }

    /// The node tables in the directory (none if it does not exist).
    fn tables(&mut self) -> Vec<PathBuf> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut read = 0;
        let mut v: Vec<PathBuf> = dir
            .flatten()
            .take(MAX_ENTRIES)
            .inspect(|_| read += 1)
            .filter(|e| e.file_name().as_encoded_bytes().starts_with(b"vgpu-sm-"))
            .take(MAX_TABLES)
            .map(|e| e.path())
            .collect();
        if read == MAX_ENTRIES && !self.warned.contains(&self.dir) {
            tracing::warn!(
                "node directory {}: more than {MAX_ENTRIES} entries; tables past them are not \
                 checked",
                self.dir.display()
            );
            self.warned.insert(self.dir.clone());
        }
        v.sort();
        v
    }

    /// Container ids the holders' sidecars name, with who vouches.
    fn vouched(&mut self, holders: &[Holder<'_>]) -> HashMap<u64, Voucher> {
        let mut out = HashMap::new();
        let mut read: HashSet<(&Path, Option<&str>)> = HashSet::new();
        for h in holders {
            let ctr = h.identity.container_id.as_deref();
            if !read.insert((h.region, ctr)) {
                continue;
            }
            let Some(id) = self.sidecar_id(h) else {
                continue;
            };
            let rank = ctr.and_then(|c| self.spec_rank(c));
            out.entry(id).or_insert_with(|| Voucher {
                pid: h.pid,
                identity: h.identity.clone(),
                rank,
            });
        }
        out
    }

    /// The container id in the sidecar of `h`'s region, read inside `h`'s
    /// root; `None` when unreadable or not drawn yet.
    fn sidecar_id(&self, h: &Holder<'_>) -> Option<u64> {
        let path = sidecar::path_for(h.region);
        let file = if h.on_host {
            open_file(&path, Access::ReadOnly).ok()?
        } else {
            open_file_in_process(&self.procfs.dir(h.pid), &path, Access::ReadOnly).ok()?
        };
        let mut head = [0u8; 24];
        file.read_exact_at(&mut head, 0).ok()?;
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let id = word(SIDECAR_ID_AT as usize);
        (word(0) == sidecar::MAGIC && id != 0).then_some(id)
    }

    /// The highest rank (lowest priority number + 1) container `id`'s spec
    /// allows; `None` without a spec.
    fn spec_rank(&mut self, id: &str) -> Option<u32> {
        let now = Instant::now();
        let fresh = self
            .priorities
            .get(id)
            .is_some_and(|(_, at)| now.duration_since(*at) < SPEC_TTL);
        if !fresh {
            let prio = match spec::find(&self.specs, id) {
                Ok(Some((_, env))) => Some(spec_priority(&env)),
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!("container {id}: {e}");
                    None
                }
            };
            self.priorities.insert(id.to_owned(), (prio, now));
        }
        self.priorities
            .get(id)
            .and_then(|(p, _)| *p)
            .map(vgpu_common::node::rank_of)
    }

    fn check_table(
        &mut self,
        path: &Path,
        vouched: &HashMap<u64, Voucher>,
        suspects: &mut HashSet<(PathBuf, usize, u64)>,
        out: &mut Vec<Repair>,
        now_ms: u64,
    ) {
        let file = match open_table(path) {
            Ok(f) => f,
            Err(e) => {
                if self.warned.insert(path.to_owned()) {
                    tracing::warn!("node table {}: {e}", path.display());
                }
                return;
            }
        };
        let view = match NodeView::from_file(&file, path) {
            Ok(v) => v,
            Err(e) => {
                if self.warned.insert(path.to_owned()) {
                    tracing::warn!("{e}");
                }
                return;
            }
        };
        self.warned.remove(path);
        for (i, m) in view.table().members.iter().enumerate().take(MEMBERS) {
            let owner = m.owner.load(std::sync::atomic::Ordering::Relaxed);
            if owner == 0 {
                continue;
            }
            let write = |word, value| Write {
                target: Target::NodeTable(path.to_owned()),
                field: Field::Member { index: i, word },
                value,
                expect: Expect::MemberOwner(owner),
            };
            match vouched.get(&owner) {
                None => {
                    let key = (path.to_owned(), i, owner);
                    if !self.suspects.contains(&key) {
                        suspects.insert(key);
                        continue;
                    }
                    out.push(Repair {
                        write: write(MemberWord::Owner, 0),
                        finding: removed(path, i, owner, now_ms),
                    });
                }
                Some(v) => {
                    let rank = m.rank.load(std::sync::atomic::Ordering::Relaxed);
                    let Some(allowed) = v.rank.filter(|&a| rank != 0 && rank < a) else {
                        continue;
                    };
                    out.push(Repair {
                        write: write(MemberWord::Rank, u64::from(allowed)),
                        finding: demoted(path, i, owner, rank, allowed, v, now_ms),
                    });
                }
            }
        }
    }
}

/// HAMi's priority of a container whose spec environment is `env`.
fn spec_priority(env: &[String]) -> i32 {
    lookup(env.iter().map(String::as_str), TASK_PRIORITY)
        .and_then(|v| v.trim().parse::<i32>().ok())
        .unwrap_or(DEFAULT_PRIORITY)
}

fn finding(
    path: &Path,
    identity: Option<&ContainerIdentity>,
    pid: u32,
    message: String,
    action: &str,
    now_ms: u64,
) -> Finding {
    let id = identity.cloned().unwrap_or_default();
    Finding {
        pid,
        region: Some(path.to_owned()),
        action: Some(action.to_owned()),
        ..Finding::new(Kind::NodeTableForged, &id, now_ms, message)
    }
}

fn removed(path: &Path, i: usize, owner: u64, now_ms: u64) -> Finding {
    let message = format!(
        "node table {}: member {i} (container {owner:016x}) belongs to no live container; removed",
        path.display()
    );
    finding(path, None, 0, message, "removed", now_ms)
}

fn demoted(
    path: &Path,
    i: usize,
    owner: u64,
    rank: u32,
    allowed: u32,
    v: &Voucher,
    now_ms: u64,
) -> Finding {
    let message = format!(
        "node table {}: member {i} (container {owner:016x}) claimed priority {} where its runtime spec gives {}; demoted",
        path.display(),
        rank - 1,
        allowed - 1
    );
    finding(path, Some(&v.identity), v.pid, message, "demoted", now_ms)
}

/// The member word at `word` of the member at `at`, written if its owner
/// is still `owner`, through `daemon::apply` (the tests' view of a repair,
/// by offsets). `Ok(false)`: not written.
#[cfg(test)]
use crate::daemon::apply::{MEMBERS_AT, MEMBER_SIZE, OWNER_AT, RANK_AT};

#[cfg(test)]
fn write_if_owner(
    file: &std::fs::File,
    at: u64,
    owner: u64,
    word: u64,
    bytes: &[u8],
) -> Result<bool, ApplyError> {
    let index = ((at - MEMBERS_AT) / MEMBER_SIZE) as usize;
    let (word, value) = match (word, bytes.len()) {
        (OWNER_AT, 8) => (
            MemberWord::Owner,
            u64::from_le_bytes(bytes.try_into().unwrap()),
        ),
        (RANK_AT, 4) => (
            MemberWord::Rank,
            u64::from(u32::from_le_bytes(bytes.try_into().unwrap())),
        ),
        _ => panic!("no member word {word} of {} bytes", bytes.len()),
    };
    let w = Write {
        target: Target::NodeTable(PathBuf::new()),
        field: Field::Member { index, word },
        value,
        expect: Expect::MemberOwner(owner),
    };
    match apply::to_table(file, Path::new("-"), &w) {
        Outcome::Written => Ok(true),
        Outcome::Failed(ApplyError::ShortTable { .. }) | Outcome::Stale | Outcome::Unchanged => {
            Ok(false)
        }
        Outcome::Failed(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regions::open::OpenError;
    use vgpu_common::node::SIZE as TABLE_SIZE;

    #[test]
    fn a_spec_states_the_priority_or_gets_hamis_default() {
        let env = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(spec_priority(&env(&["CUDA_TASK_PRIORITY=0"])), 0);
        assert_eq!(spec_priority(&env(&["A=1", "CUDA_TASK_PRIORITY= 3"])), 3);
        assert_eq!(spec_priority(&env(&["A=1"])), DEFAULT_PRIORITY);
        assert_eq!(
            spec_priority(&env(&["CUDA_TASK_PRIORITY=high"])),
            DEFAULT_PRIORITY
        );
    }

    #[test]
    fn offsets_match_the_layouts() {
        use std::mem::offset_of;
        use vgpu_common::node::{Member, NodeFile};
        assert_eq!(offset_of!(NodeFile, members) as u64, MEMBERS_AT);
        assert_eq!(std::mem::size_of::<Member>() as u64, MEMBER_SIZE);
        assert_eq!(offset_of!(Member, owner) as u64, OWNER_AT);
        assert_eq!(offset_of!(Member, rank) as u64, RANK_AT);
        assert_eq!(
            offset_of!(vgpu_common::sidecar::SmShared, container) as u64,
            SIDECAR_ID_AT
        );
    }

    /// A table whose member 2 is container `owner` at `rank`.
    fn table_bytes(owner: u64, rank: u32) -> Vec<u8> {
        use std::sync::atomic::Ordering::Relaxed;
        let t = vgpu_common::node::NodeFile::default();
        t.init_or_check().unwrap();
        t.members[2].owner.store(owner, Relaxed);
        t.members[2].rank.store(rank, Relaxed);
        // SAFETY: `NodeFile` is `TABLE_SIZE` bytes of plain atomics, no
        // padding (its layout asserts), so every byte is initialised.
        let b = unsafe {
            std::slice::from_raw_parts(
                &t as *const vgpu_common::node::NodeFile as *const u8,
                TABLE_SIZE,
            )
        };
        b.to_vec()
    }

    /// A member nobody vouches for survives one scan (the grace for a
    /// process not tracked yet) and is removed at the next, with a
    /// finding; a file that is not a table is left alone.
    #[test]
    fn an_unvouched_member_is_removed_at_the_second_scan() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vgpu-sm-GPU-1");
        std::fs::write(&p, table_bytes(0x5eed, 1)).unwrap();
        std::fs::write(dir.path().join("vgpu-sm-GPU-2"), b"junk").unwrap();
        let mut t = NodeTables::new(dir.path().to_owned(), Vec::new(), Procfs::default());
        let at = (MEMBERS_AT + MEMBER_SIZE * 2) as usize;
        assert!(t.scan(&[], 1).is_empty());
        assert_eq!(
            &std::fs::read(&p).unwrap()[at..at + 8],
            &0x5eedu64.to_le_bytes()
        );
        let out = t.scan(&[], 2);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].kind, Kind::NodeTableForged);
        assert_eq!(out[0].action.as_deref(), Some("removed"));
        assert!(
            out[0].message.contains("0000000000005eed"),
            "{}",
            out[0].message
        );
        assert_eq!(&std::fs::read(&p).unwrap()[at..at + 8], &[0u8; 8]);
        assert!(t.scan(&[], 3).is_empty());
        // A member that left between the scans is not removed later.
        std::fs::write(&p, table_bytes(0x77, 1)).unwrap();
        assert!(t.scan(&[], 4).is_empty());
        std::fs::write(&p, table_bytes(0x78, 1)).unwrap();
        assert!(t.scan(&[], 5).is_empty());
        assert_eq!(
            &std::fs::read(&p).unwrap()[at..at + 8],
            &0x78u64.to_le_bytes()
        );
    }

    /// What a tenant names like a table in the shared directory: a FIFO or
    /// a device is refused on its type (never opened: a device's driver is
    /// not called), a symlink is not followed.
    #[test]
    fn a_table_that_is_not_a_plain_file_is_never_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("vgpu-sm-GPU-fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert!(matches!(
            open_table(&fifo),
            Err(OpenError::NotRegular { .. })
        ));
        let dev = dir.path().join("vgpu-sm-GPU-dev");
        std::os::unix::fs::symlink("/dev/null", &dev).unwrap();
        assert!(matches!(open_table(&dev), Err(OpenError::Symlink(_))));
        assert!(matches!(
            open_table(Path::new("/dev/null")),
            Err(OpenError::NotRegular { .. })
        ));
    }

    /// A directory a tenant filled costs a bounded read per scan.
    #[test]
    fn a_crowded_directory_is_read_to_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..MAX_ENTRIES + 100 {
            std::fs::write(dir.path().join(format!("junk-{i}")), b"").unwrap();
        }
        let mut t = NodeTables::new(dir.path().to_owned(), Vec::new(), Procfs::default());
        assert!(t.tables().is_empty());
        assert!(t.warned.contains(dir.path()), "the crowding is told once");
    }

    /// A write lands only while the member is still the one judged.
    #[test]
    fn a_member_taken_over_meanwhile_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vgpu-sm-GPU-1");
        let mut bytes = vec![0u8; TABLE_SIZE];
        let at = (MEMBERS_AT + MEMBER_SIZE * 3) as usize;
        bytes[at..at + 8].copy_from_slice(&7u64.to_le_bytes());
        std::fs::write(&p, &bytes).unwrap();
        let f = open_table(&p).unwrap();
        assert!(!write_if_owner(&f, at as u64, 9, OWNER_AT, &0u64.to_le_bytes()).unwrap());
        assert!(write_if_owner(&f, at as u64, 7, RANK_AT, &2u32.to_le_bytes()).unwrap());
        let back = std::fs::read(&p).unwrap();
        assert_eq!(&back[at..at + 8], &7u64.to_le_bytes());
        assert_eq!(&back[at + 20..at + 24], &2u32.to_le_bytes());
        assert!(write_if_owner(&f, at as u64, 7, OWNER_AT, &0u64.to_le_bytes()).unwrap());
        assert_eq!(&std::fs::read(&p).unwrap()[at..at + 8], &[0u8; 8]);
    }
}
