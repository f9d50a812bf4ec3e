//! The node's table of limited containers on one GPU, and the plan of turns
//! every member derives from it (docs/sm-limit.md, "Time division between
//! containers"; docs/region.md lists the file).
//!
//! The table is a small file, `<dir>/vgpu-sm-<GPU UUID>`, in a directory
//! every container of the node shares (`VGPU_SM_NODE_DIR`; HAMi's
//! `/tmp/vgpulock`), mapped `MAP_SHARED` by every limited process that uses
//! that GPU: per physical GPU, whatever ordinal each container sees it as.
//! Each member is a container (its sidecar's `container` id) with its limit,
//! the CLOCK_MONOTONIC instant it last launched, and the last instant it
//! was using most of its share (`wants`). Only the members that want their
//! share take turns; each process derives the same [`plan`] from the same
//! words, with no messages and no lock. Version 2 adds each member's HAMi
//! priority (`rank`) and when its queued work drains (`inflight_until`):
//! a container keeps its queued work short while one of higher priority
//! is active, and queues nothing while that one has work in flight
//! (docs/sm-limit.md, "Priority").
//!
//! The hook creates, joins and writes the table (`hook/src/sm/node_sharing/node_mapping.rs`);
//! `vgpu turns` reads it.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

mod plan;
mod view;

pub use plan::{plan, Phase, ACTIVE_NS, FRAME_NS};
pub use view::{NodeView, ReadError};

/// `"vgpusn01"` little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"vgpusn01");
pub const VERSION: u32 = 2;
/// The oldest version still read (its `rank` reads 0: no priority).
pub const MIN_VERSION: u32 = 1;
/// Containers one GPU's table holds.
pub const MEMBERS: usize = 32;
/// A member not seen for this long may be taken over by another container.
pub const STALE_NS: u64 = 10_000_000_000;
/// How far ahead of a reader's clock a member's `seen` and `wants` may be.
/// Writers stamp them with their own reading of the node's CLOCK_MONOTONIC,
/// at most a re-plan (10 ms) after a reader took its `now`; an instant
/// further ahead was written by no honest process, and the member does not
/// count (`Member::valid`). Any container can write the table, so this is
/// what bounds a forged member in time: a one-off write counts for at most
/// this plus the rule's own horizon (40 ms to hold, 200 ms to take turns).
pub const FUTURE_SLACK_NS: u64 = 100_000_000;

/// One container on the GPU: 64 bytes, its own cache line.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Member {
    /// The container's id (drawn at random by its first process, kept in
    /// its sidecar); 0 = free.
    pub owner: AtomicU64,
    /// CLOCK_MONOTONIC ns of the container's last limited launch here.
    pub seen: AtomicU64,
    /// Its SM limit on this GPU, percent.
    pub limit: AtomicU32,
    /// HAMi's task priority + 1 (`CUDA_TASK_PRIORITY`, the region's
    /// `priority`: 0 high, 1 low); 0 = none stated (a version-1 file).
    pub rank: AtomicU32,
    /// CLOCK_MONOTONIC ns when the container last used most of its share
    /// (`hook/src/sm/node_sharing/demand.rs`); 0 = never.
    pub wants: AtomicU64,
    /// CLOCK_MONOTONIC ns when the work the container has queued on the GPU
    /// drains, by its learnt costs (written on each of its launches).
    pub inflight_until: AtomicU64,
    pub reserved: [AtomicU64; 3],
}

/// The whole file.
#[repr(C)]
#[derive(Debug, Default)]
pub struct NodeFile {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    /// `size_of::<NodeFile>()` as written by the creator.
    pub size: AtomicU32,
    pub reserved: [AtomicU64; 6],
    pub members: [Member; MEMBERS],
}

pub const SIZE: usize = std::mem::size_of::<NodeFile>();

const _: () = {
    assert!(std::mem::size_of::<Member>() == 64);
    assert!(std::mem::offset_of!(Member, seen) == 8);
    assert!(std::mem::offset_of!(Member, limit) == 16);
    assert!(std::mem::offset_of!(Member, rank) == 20);
    assert!(std::mem::offset_of!(Member, wants) == 24);
    assert!(std::mem::offset_of!(Member, inflight_until) == 32);
    assert!(std::mem::offset_of!(NodeFile, members) == 64);
    assert!(SIZE == 64 + 64 * MEMBERS);
};

/// The table's path for the GPU `uuid` in `dir`.
pub fn path_for(dir: &Path, uuid: &str) -> PathBuf {
    let name: String = uuid
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("vgpu-sm-{name}"))
}

impl NodeFile {
    /// Stamps a zeroed table, or checks an existing one's magic and version
    /// (the found ones otherwise).
    pub fn init_or_check(&self) -> Result<(), (u64, u32)> {
        let h = crate::shared_file::Header {
            magic: &self.magic,
            version: &self.version,
            size: &self.size,
        };
        h.stamp_or_check(MAGIC, VERSION, SIZE, MIN_VERSION..=VERSION)
    }

    /// The member of container `id`, claiming a free or stale one when it
    /// has none; `None` when the table is full of live containers.
    pub fn join(&self, id: u64, now: u64) -> Option<&Member> {
        if id == 0 {
            return None;
        }
        if let Some(m) = self.members.iter().find(|m| m.owner.load(Acquire) == id) {
            return Some(m);
        }
        for m in &self.members {
            let owner = m.owner.load(Acquire);
            // A member whose instants are far ahead (no honest writer's,
            // and further than a late reader's clock could lag) is free.
            let free = owner == 0 || m.is_stale(now) || m.is_forged(now);
            if !free {
                continue;
            }
            // Stamp `seen` first so that a racing claimer sees it live.
            m.seen.store(now, Relaxed);
            if m.owner.compare_exchange(owner, id, AcqRel, Acquire).is_ok() {
                // The previous owner's demand and priority are not the
                // new one's.
                m.wants.store(0, Relaxed);
                m.inflight_until.store(0, Relaxed);
                m.rank.store(0, Relaxed);
                m.seen.store(now, Release);
                return Some(m);
            }
        }
        // Another process of the container may have claimed one meanwhile.
        self.members.iter().find(|m| m.owner.load(Acquire) == id)
    }

    /// `(container, limit)` of every member that wanted its share within
    /// `active_ns` before `now`.
    pub fn wanting(&self, now: u64, active_ns: u64) -> Vec<(u64, u32)> {
        self.members
            .iter()
            .filter_map(|m| {
                let owner = m.owner.load(Acquire);
                (owner != 0 && m.valid(now) && m.wanted_within(now, active_ns))
                    .then(|| (owner, m.limit.load(Relaxed)))
            })
            .collect()
    }
}

impl NodeFile {
    /// Bit `i` set for each member `i` other than container `me` whose
    /// priority is higher than `rank` (a smaller rank, stated) and that
    /// launched within `active_ns` before `now`.
    pub fn higher(&self, me: u64, rank: u32, now: u64, active_ns: u64) -> u32 {
        if rank == 0 {
            return 0;
        }
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| {
                let owner = m.owner.load(Acquire);
                let r = m.rank.load(Relaxed);
                owner != 0
                    && owner != me
                    && m.valid(now)
                    && r != 0
                    && r < rank
                    && now.saturating_sub(m.seen.load(Relaxed)) <= active_ns
            })
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }

    /// The latest `inflight_until` among the members of `mask`.
    pub fn inflight_until(&self, mask: u32) -> u64 {
        self.members
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, m)| m.inflight_until.load(Relaxed))
            .max()
            .unwrap_or(0)
    }
}

impl Member {
    /// Marks the container active at `now` with `limit`: `seen` is written
    /// at each re-plan (every 10 ms), the limit only when it changed.
    pub fn touch(&self, now: u64, limit: u32) {
        if self.limit.load(Relaxed) != limit {
            self.limit.store(limit, Relaxed);
        }
        advance(&self.seen, now);
    }

    /// Marks the container as using most of its share at `now`.
    pub fn want(&self, now: u64) {
        advance(&self.wants, now);
    }

    /// Whether the member's instants are ones an honest writer could have
    /// stamped by `now` (none more than `FUTURE_SLACK_NS` ahead): a member
    /// that is not counts for nobody, and may be taken over.
    pub fn valid(&self, now: u64) -> bool {
        let horizon = now.saturating_add(FUTURE_SLACK_NS);
        self.seen.load(Relaxed) <= horizon && self.wants.load(Relaxed) <= horizon
    }

    /// Whether the container wanted its share within `ns` before `now`.
    pub fn wanted_within(&self, now: u64, ns: u64) -> bool {
        let wants = self.wants.load(Relaxed);
        wants != 0 && now.saturating_sub(wants) <= ns
    }

    /// States the container's priority (`None`: none stated). A stated
    /// rank is only ever lowered, never raised: the daemon lowers a rank
    /// above the container's runtime spec (`vgpu daemon`'s node-table
    /// check), and the container's own processes must not undo that at
    /// their next re-plan. A member taken over starts unstated (`join`).
    pub fn set_priority(&self, priority: Option<i32>) {
        let r = priority.map_or(0, rank_of);
        let _ = self.rank.fetch_update(Relaxed, Relaxed, |cur| {
            (cur != r && (cur == 0 || r > cur)).then_some(r)
        });
    }

    /// Notes `cost_ns` of work queued at `now`: it drains at
    /// `max(inflight_until, now) + cost`. A drain instant more than
    /// `STALE_NS` ahead is not what this container's own launches left
    /// (someone else wrote it): it starts again from `now`.
    pub fn queued(&self, now: u64, cost_ns: u64) {
        let _ = self.inflight_until.fetch_update(Relaxed, Relaxed, |t| {
            let t = if t > now.saturating_add(STALE_NS) {
                now
            } else {
                t.max(now)
            };
            Some(t.saturating_add(cost_ns))
        });
    }

    /// Whether the container has not launched for `STALE_NS`: another may
    /// take its member.
    pub fn is_stale(&self, now: u64) -> bool {
        now.saturating_sub(self.seen.load(Relaxed)) > STALE_NS
    }

    /// Whether the member's `seen` is more than `STALE_NS` ahead of `now`:
    /// written by no hook, even as seen by a reader whose `now` is late,
    /// so another container may take the member over.
    pub fn is_forged(&self, now: u64) -> bool {
        self.seen.load(Relaxed) > now.saturating_add(STALE_NS)
    }
}

/// The member `rank` of HAMi priority `priority` (0 high): priority + 1,
/// so that 0 stays "none stated".
pub fn rank_of(priority: i32) -> u32 {
    priority.clamp(0, 1_000) as u32 + 1
}

/// Moves the instant `w` forward to `now`; an instant ahead of `now` by
/// more than `FUTURE_SLACK_NS` (written by someone else: the table is
/// writable by every container) is replaced, so that the member's owner
/// makes it valid again at its next write.
fn advance(w: &AtomicU64, now: u64) {
    let horizon = now.saturating_add(FUTURE_SLACK_NS);
    let _ = w.fetch_update(Relaxed, Relaxed, |t| {
        Some(if t > horizon { now } else { t.max(now) })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_join_once_and_stale_members_are_taken_over() {
        let t = NodeFile::default();
        let now = 100 * STALE_NS;
        let a = t.join(7, now).unwrap();
        a.touch(now, 30);
        a.want(now);
        assert!(std::ptr::eq(a, t.join(7, now + 1).unwrap()));
        let b = t.join(9, now).unwrap();
        b.touch(now, 70);
        assert!(!std::ptr::eq(a, b));
        // 9 launches but uses little of its share: not in the plan.
        assert_eq!(t.wanting(now, 1_000), vec![(7, 30)]);
        b.want(now);
        assert_eq!(t.wanting(now, 1_000), vec![(7, 30), (9, 70)]);
        // 9 stops wanting: it drops out at once, and its member is reused
        // only once stale.
        let later = now + 2_000;
        a.touch(later, 30);
        a.want(later);
        assert_eq!(t.wanting(later, 1_000), vec![(7, 30)]);
        let full = t.members.iter().skip(2).all(|m| {
            m.owner.store(99, Relaxed);
            m.seen.store(later, Relaxed);
            true
        });
        assert!(full);
        assert!(t.join(11, later).is_none(), "9 is not stale yet");
        let c = t.join(11, now + STALE_NS + 1).unwrap();
        assert!(std::ptr::eq(b, c), "9's member taken over");
        assert_eq!(c.wants.load(Relaxed), 0, "9's demand is not 11's");
        assert!(t.join(0, now).is_none());
    }

    /// Instants no honest writer stamps (ahead of the reader's clock) void
    /// a member: it is neither yielded to nor in the plan, and its slot can
    /// be taken; an honest member whose words were forged so is valid again
    /// at its owner's next write.
    #[test]
    fn a_member_with_instants_ahead_of_the_clock_counts_for_nobody() {
        let t = NodeFile::default();
        let now = 100 * STALE_NS;
        let me = t.join(2, now).unwrap();
        me.touch(now, 50);
        me.set_priority(Some(1));
        let far = i64::MAX as u64;
        for (i, m) in t.members.iter().enumerate().skip(1) {
            m.owner.store(0x1000 + i as u64, Relaxed);
            m.limit.store(90, Relaxed);
            m.rank.store(1, Relaxed);
            m.seen.store(far, Relaxed);
            m.wants.store(far, Relaxed);
            m.inflight_until.store(far, Relaxed);
        }
        me.want(now);
        assert!(t.members.iter().skip(1).all(|m| !m.valid(now)));
        assert_eq!(t.higher(2, 2, now, 40_000_000), 0);
        assert_eq!(t.wanting(now, ACTIVE_NS), vec![(2, 50)]);
        // A full table of forgeries does not keep a container out.
        assert!(t.join(3, now).is_some());
        // Just within the slack (a writer a re-plan ahead) still counts;
        // written once, it expires with the hold's horizon.
        let m = &t.members[5];
        m.seen.store(now + FUTURE_SLACK_NS, Relaxed);
        m.wants.store(0, Relaxed);
        assert_eq!(t.higher(2, 2, now, 40_000_000), 1 << 5);
        let later = now + FUTURE_SLACK_NS + 40_000_001;
        assert_eq!(t.higher(2, 2, later, 40_000_000), 0);
        // The forged words of our own member are replaced by our next write.
        me.seen.store(far, Relaxed);
        me.wants.store(far, Relaxed);
        me.inflight_until.store(far, Relaxed);
        assert!(!me.valid(now));
        me.touch(now, 50);
        me.want(now);
        me.queued(now, 500);
        assert!(me.valid(now));
        assert_eq!(me.inflight_until.load(Relaxed), now + 500);
    }

    #[test]
    fn higher_priority_members_are_found_while_active() {
        let t = NodeFile::default();
        let now = 100 * STALE_NS;
        let service = t.join(1, now).unwrap();
        service.touch(now, 0);
        service.set_priority(Some(0));
        let trainer = t.join(2, now).unwrap();
        trainer.touch(now, 0);
        trainer.set_priority(Some(1));
        let old = t.join(3, now).unwrap();
        old.touch(now, 0);
        let (rs, rt) = (service.rank.load(Relaxed), trainer.rank.load(Relaxed));
        assert_eq!((rs, rt), (1, 2));
        // A stated priority is never raised again (a demotion by the daemon
        // stays), only lowered.
        trainer.set_priority(Some(0));
        assert_eq!(trainer.rank.load(Relaxed), 2);
        trainer.set_priority(Some(3));
        assert_eq!(trainer.rank.load(Relaxed), 4);
        trainer.rank.store(2, Relaxed);
        assert_eq!(t.higher(2, rt, now, 1_000), 0b1);
        // Nothing is above the service; a member without a stated priority
        // (a version-1 file) neither yields nor is yielded to.
        assert_eq!(t.higher(1, rs, now, 1_000), 0);
        assert_eq!(t.higher(3, 0, now, 1_000), 0);
        // The service quiet for longer than `active_ns`: nothing to yield to.
        assert_eq!(t.higher(2, rt, now + 1_001, 1_000), 0);
        service.queued(now, 500);
        service.queued(now + 100, 500);
        assert_eq!(t.inflight_until(0b1), now + 1_000);
        service.queued(now + 5_000, 500);
        assert_eq!(t.inflight_until(0b1), now + 5_500);
        assert_eq!(t.inflight_until(0), 0);
    }
}
