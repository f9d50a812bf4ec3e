//! The integrity decisions, free of I/O: which limits differ, whether a
//! process escaped its container's limit, whether a container is past it,
//! and what the policy does about each.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use vgpu_common::region::MAX_DEVICES;

use super::expected::Limits;
use crate::daemon::state::findings::{Kind, LimitMismatch, LimitName};
use vgpu_common::region::rules::{memory_limit, SM_UNLIMITED};

/// What the daemon does about a violation (`--on-violation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    /// Findings only.
    Report,
    /// Findings, and a tampered limit is written back.
    Restore,
    /// As restore, and a process that runs without its container's limit,
    /// or holds memory past it, is killed.
    Kill,
}

/// What to do about one finding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub restore: bool,
    pub kill: bool,
}

/// The plan for a finding of `kind` under `policy`; `oom_killer` is the
/// container's own opt-in (`ACTIVE_OOM_KILLER`), which makes it `kill`.
pub fn plan(policy: Policy, oom_killer: bool, kind: Kind) -> Plan {
    let policy = if oom_killer { Policy::Kill } else { policy };
    let (restore, kill) = match policy {
        Policy::Report => (false, false),
        Policy::Restore => (true, false),
        Policy::Kill => (true, true),
    };
    match kind {
        // Writing the limit back is enough: the hook enforces it again, and
        // memory already held past it is `over_limit`.
        Kind::LimitTampered => Plan {
            restore,
            kill: false,
        },
        Kind::UnlimitedProcess | Kind::PrivateRegion | Kind::OverLimit => Plan {
            restore: false,
            kill,
        },
        Kind::UntrackedAllocation | Kind::NoRegion => Plan::default(),
    }
}

/// Every device whose `found` limit is not the `expected` one.
pub fn mismatches(expected: &Limits, found: &Limits) -> Vec<LimitMismatch> {
    differing(expected, found, Compare::Any)
}

/// Every device where a process's own limits (from its environment) are
/// looser than its container's: unset, or larger.
pub fn looser(expected: &Limits, own: &Limits) -> Vec<LimitMismatch> {
    differing(expected, own, Compare::Looser)
}

#[derive(Clone, Copy)]
enum Compare {
    Any,
    Looser,
}

fn differing(expected: &Limits, found: &Limits, cmp: Compare) -> Vec<LimitMismatch> {
    let mut out = Vec::new();
    let mut push = |limit, device, e, f| {
        out.push(LimitMismatch {
            device,
            limit,
            expected: e,
            found: f,
        })
    };
    for (d, (&e, &f)) in expected.mem.iter().zip(&found.mem).enumerate() {
        let differs = match cmp {
            Compare::Any => e != f,
            // 0 is no limit: looser than any.
            Compare::Looser => e != 0 && (f == 0 || f > e),
        };
        if differs {
            push(LimitName::MemoryBytes, d, e, f);
        }
    }
    // SM values are normalised: 100 is no limit, and larger is looser.
    for (d, (&e, &f)) in expected.sm.iter().zip(&found.sm).enumerate() {
        let differs = match cmp {
            Compare::Any => e != f,
            Compare::Looser => e != SM_UNLIMITED && f > e,
        };
        if differs {
            push(LimitName::SmPercent, d, e, f);
        }
    }
    out
}

/// The bytes a container may hold on its first `devices` GPUs, or `None`
/// when one of them has no memory limit.
pub fn allowance(expected: &Limits, devices: usize) -> Option<u64> {
    let n = devices.clamp(1, MAX_DEVICES);
    expected.mem[..n].iter().try_fold(0u64, |acc, &m| {
        memory_limit(m).map(|m| acc.saturating_add(m))
    })
}

/// How many GPUs a container's limits apply to, from facts the tenant
/// cannot write: the GPUs its runtime spec names, else the node's GPUs
/// (NVML; a container given `all` may use each), else one (fail closed).
/// Never the region's `device_num`, which the tenant writes.
pub fn devices(spec: Option<usize>, node_gpus: Option<usize>) -> usize {
    spec.or(node_gpus).unwrap_or(1).clamp(1, MAX_DEVICES)
}

/// What the driver's count may exceed a limit by before it is `over_limit`:
/// max(16 MiB, 2 %), as the cross-check allows (the hook sizes the context
/// it counts by a measurement; allocations are rounded to pages).
pub fn slack(limit: u64) -> u64 {
    (limit / 50).max(16 << 20)
}

/// One process's usage by the kernel's and the driver's count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// What the probes saw it allocate minus free (data only).
    pub probe_bytes: Option<u64>,
    /// What NVML says it uses (its contexts included; also what no probe
    /// sees: an unprobed copy of libcuda, arrays).
    pub nvml_bytes: Option<u64>,
}

/// A container's usage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Σ of the probes' counts.
    pub probes: u64,
    /// Σ of NVML's counts (`None`: NVML listed none of its processes).
    pub nvml: Option<u64>,
    /// Σ per process of the larger of the two.
    pub bytes: u64,
}

impl Held {
    pub fn of(procs: &[Usage]) -> Held {
        let mut h = Held::default();
        for p in procs {
            let probe = p.probe_bytes.unwrap_or(0);
            h.probes = h.probes.saturating_add(probe);
            if let Some(n) = p.nvml_bytes {
                h.nvml = Some(h.nvml.unwrap_or(0).saturating_add(n));
            }
            h.bytes = h.bytes.saturating_add(probe.max(p.nvml_bytes.unwrap_or(0)));
        }
        h
    }
}

/// Whether `bytes` by the driver's count (contexts included) are past a
/// memory `limit`: by more than [`slack`].
pub fn memory_past(limit: u64, bytes: u64) -> bool {
    bytes > limit.saturating_add(slack(limit))
}

/// The memory limit on a GPU the container knows as CUDA ordinal
/// `ordinal` (`None`: not a GPU its spec gave it, held to the strictest of
/// its first `devices`); `None` when there is none.
pub fn memory_on(expected: &Limits, ordinal: Option<usize>, devices: usize) -> Option<u64> {
    match ordinal {
        Some(d) => memory_limit(*expected.mem.get(d)?),
        None => expected.mem[..devices.clamp(1, MAX_DEVICES)]
            .iter()
            .filter_map(|&m| memory_limit(m))
            .min(),
    }
}

/// The SM limit (percent, [`SM_UNLIMITED`] for none) on a GPU, as
/// [`memory_on`] chooses.
pub fn sm_on(expected: &Limits, ordinal: Option<usize>, devices: usize) -> u64 {
    match ordinal {
        Some(d) => expected.sm.get(d).copied().unwrap_or(SM_UNLIMITED),
        None => expected.sm[..devices.clamp(1, MAX_DEVICES)]
            .iter()
            .copied()
            .min()
            .unwrap_or(SM_UNLIMITED),
    }
}

/// The looser of two limit sets, device by device (an admin's record may
/// raise a region's limits; the largest recorded counts).
pub fn loosest(a: &Limits, b: &Limits) -> Limits {
    let mut l = *a;
    for (m, &o) in l.mem.iter_mut().zip(&b.mem) {
        *m = match (memory_limit(*m), memory_limit(o)) {
            (Some(x), Some(y)) => x.max(y),
            _ => 0,
        };
    }
    for (s, &o) in l.sm.iter_mut().zip(&b.sm) {
        *s = (*s).max(o);
    }
    l
}

/// Percentage points a container's SM use of a GPU may exceed its limit by,
/// over [`SM_WINDOW`], before it is `over_limit`: the hook's bucket lets a
/// few milliseconds through at each refill, and NVML samples a few times a
/// second.
pub const SM_TOLERANCE: u64 = 10;
/// SM use is judged as its mean over this long...
pub const SM_WINDOW: Duration = Duration::from_secs(5);
/// ...once the samples span at least this much (each NVML sample covers
/// at least a second more): a container is never judged on one burst.
pub const SM_MIN_SPAN: Duration = Duration::from_secs(2);

/// Whether a mean SM use of `pct` percent is past an SM `limit`.
pub fn sm_past(limit: u64, pct: u64) -> bool {
    limit < SM_UNLIMITED && pct > limit.saturating_add(SM_TOLERANCE)
}

/// One container's SM use of one GPU, per process, over the last
/// [`SM_WINDOW`]: one sample per scan (NVML's per-process utilization,
/// keyed by host PID).
#[derive(Clone, Debug, Default)]
pub struct SmWindow {
    samples: VecDeque<(Instant, HashMap<u32, u32>)>,
}

impl SmWindow {
    /// Adds the sample taken `at`, forgetting those older than the window.
    pub fn push(&mut self, at: Instant, by_pid: HashMap<u32, u32>) {
        self.samples.push_back((at, by_pid));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| at.saturating_duration_since(*t) > SM_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// Each process's mean use over the window, once the samples span
    /// [`SM_MIN_SPAN`] (a process absent from a sample used nothing then;
    /// one that exited still counts for what it used).
    pub fn means(&self) -> Option<HashMap<u32, u64>> {
        let (first, _) = self.samples.front()?;
        let (last, _) = self.samples.back()?;
        if last.saturating_duration_since(*first) < SM_MIN_SPAN {
            return None;
        }
        let n = self.samples.len() as u64;
        let mut sum: HashMap<u32, u64> = HashMap::new();
        for (_, by_pid) in &self.samples {
            for (&pid, &u) in by_pid {
                *sum.entry(pid).or_insert(0) += u64::from(u.min(100));
            }
        }
        Some(sum.into_iter().map(|(pid, s)| (pid, s / n)).collect())
    }

    /// Starts over (after the container's processes were stopped: what
    /// they used is not held against the ones left).
    pub fn clear(&mut self) {
        self.samples.clear();
    }
}

/// A container's process, as `over_limit` chooses whom to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// What it holds of what is past the limit: bytes on the GPU (the
    /// larger of the kernel's and the driver's count), or percent of it.
    pub held: u64,
    /// How much of that its slot does not account (first to go).
    pub untracked: u64,
}

/// The processes to stop so that what the container holds is back within
/// `allowed`: from `total` (which may include what exited processes still
/// count), those holding the most their slot does not account first, then
/// the largest; every holder when even that is not enough.
pub fn victims(holders: &[Holder], total: u64, allowed: u64) -> Vec<u32> {
    let mut order: Vec<&Holder> = holders.iter().filter(|h| h.held > 0).collect();
    order.sort_by_key(|h| {
        (
            std::cmp::Reverse(h.untracked),
            std::cmp::Reverse(h.held),
            h.pid,
        )
    });
    let mut left = total;
    let mut out = Vec::new();
    for h in order {
        if left <= allowed {
            break;
        }
        left = left.saturating_sub(h.held);
        out.push(h.pid);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn limits(mem: u64, sm: u64) -> Limits {
        Limits {
            mem: [mem; MAX_DEVICES],
            sm: [sm; MAX_DEVICES],
        }
    }

    #[test]
    fn any_difference_in_a_region_is_a_mismatch() {
        let want = limits(G, 30);
        assert!(mismatches(&want, &want).is_empty());
        let mut got = want;
        got.mem[0] = 64 * G;
        got.sm[3] = SM_UNLIMITED;
        let m = mismatches(&want, &got);
        assert_eq!(
            m,
            vec![
                LimitMismatch {
                    device: 0,
                    limit: LimitName::MemoryBytes,
                    expected: G,
                    found: 64 * G
                },
                LimitMismatch {
                    device: 3,
                    limit: LimitName::SmPercent,
                    expected: 30,
                    found: SM_UNLIMITED
                },
            ]
        );
        // Lower is a difference too (the region is not what was given).
        let mut low = want;
        low.mem[1] = G / 2;
        assert_eq!(mismatches(&want, &low).len(), 1);
        // An SM limit the container was not given.
        let free = limits(G, SM_UNLIMITED);
        let mut sm = free;
        sm.sm[0] = 50;
        assert_eq!(mismatches(&free, &sm).len(), 1);
    }

    #[test]
    fn a_process_is_looser_when_unset_or_larger() {
        let want = limits(G, 30);
        assert!(looser(&want, &want).is_empty());
        assert!(
            looser(&want, &limits(G / 2, 10)).is_empty(),
            "stricter is fine"
        );
        let unset = looser(&want, &limits(0, SM_UNLIMITED));
        assert_eq!(unset.len(), 2 * MAX_DEVICES);
        assert!(unset
            .iter()
            .all(|m| m.found == 0 || m.found == SM_UNLIMITED));
        assert_eq!(looser(&want, &limits(2 * G, 30)).len(), MAX_DEVICES);
        assert_eq!(looser(&want, &limits(G, 40)).len(), MAX_DEVICES);
        // Nothing expected: nothing can be looser.
        assert!(looser(&limits(0, SM_UNLIMITED), &limits(0, SM_UNLIMITED)).is_empty());
        assert!(looser(&limits(0, SM_UNLIMITED), &limits(G, 50)).is_empty());
    }

    #[test]
    fn allowance_sums_the_visible_devices() {
        assert_eq!(allowance(&limits(G, 100), 1), Some(G));
        assert_eq!(allowance(&limits(G, 100), 2), Some(2 * G));
        assert_eq!(allowance(&limits(G, 100), 0), Some(G));
        assert_eq!(allowance(&limits(G, 100), 99), Some(16 * G));
        let mut l = limits(G, 100);
        l.mem[1] = 0;
        assert_eq!(allowance(&l, 1), Some(G));
        assert_eq!(allowance(&l, 2), None, "an unlimited device: no allowance");
    }

    #[test]
    fn no_region_field_widens_the_allowance() {
        // The spec's GPUs, else the node's, else one; never more than 16.
        assert_eq!(devices(Some(2), Some(8)), 2);
        assert_eq!(devices(None, Some(8)), 8);
        assert_eq!(devices(None, None), 1);
        assert_eq!(devices(Some(99), None), MAX_DEVICES);
        assert_eq!(devices(Some(0), None), 1);
    }

    #[test]
    fn the_driver_count_holds_what_the_probes_miss() {
        let mib = 1u64 << 20;
        let u = |probe, nvml| Usage {
            probe_bytes: probe,
            nvml_bytes: nvml,
        };
        // Allocated through an unprobed copy of libcuda: NVML alone sees it.
        let h = Held::of(&[u(Some(64 * mib), Some(1664 * mib))]);
        assert_eq!(
            (h.probes, h.nvml, h.bytes),
            (64 * mib, Some(1664 * mib), 1664 * mib)
        );
        // A process NVML does not list still counts by the probes, and
        // one only NVML lists by NVML.
        let h = Held::of(&[u(Some(700 * mib), None), u(None, Some(600 * mib))]);
        assert_eq!(
            (h.probes, h.nvml, h.bytes),
            (700 * mib, Some(600 * mib), 1300 * mib)
        );
        assert_eq!(slack(G), G / 50);
        assert_eq!(slack(G / 2), 16 * mib);
    }

    #[test]
    fn policy_plans() {
        use Kind::*;
        for k in [LimitTampered, UnlimitedProcess, PrivateRegion, OverLimit] {
            assert_eq!(plan(Policy::Report, false, k), Plan::default(), "{k:?}");
        }
        assert!(plan(Policy::Restore, false, LimitTampered).restore);
        assert!(!plan(Policy::Restore, false, UnlimitedProcess).kill);
        assert!(plan(Policy::Kill, false, UnlimitedProcess).kill);
        assert!(plan(Policy::Kill, false, OverLimit).kill);
        assert!(!plan(Policy::Kill, false, LimitTampered).kill);
        assert!(plan(Policy::Kill, false, LimitTampered).restore);
        // The container's own opt-in.
        assert!(plan(Policy::Report, true, PrivateRegion).kill);
        assert!(plan(Policy::Report, true, LimitTampered).restore);
        // Findings of the cross-check are never acted on here.
        assert_eq!(plan(Policy::Kill, true, NoRegion), Plan::default());
        assert_eq!(
            plan(Policy::Kill, true, UntrackedAllocation),
            Plan::default()
        );
    }

    #[test]
    fn victims_go_until_the_rest_fits() {
        let h = |pid, held, untracked| Holder {
            pid,
            held,
            untracked,
        };
        assert!(victims(&[], 0, G).is_empty());
        assert!(victims(&[h(1, 0, 0)], 2 * G, G).is_empty());
        // The most untracked first, and only as many as it takes.
        assert_eq!(
            victims(
                &[h(1, 2 * G, 0), h(2, G, G), h(3, G / 2, 0)],
                3 * G + G / 2,
                2 * G
            ),
            vec![2, 1]
        );
        assert_eq!(
            victims(&[h(1, G, 0), h(2, 2 * G, 0)], 3 * G, 2 * G),
            vec![2]
        );
        // Within the limit: nobody.
        assert!(victims(&[h(1, G, 0)], G, G).is_empty());
        // What exited processes count keeps it past: every holder goes.
        assert_eq!(victims(&[h(1, 10, 0), h(2, 5, 0)], 80, 30), vec![1, 2]);
    }

    #[test]
    fn limits_per_gpu_fail_closed() {
        let mut l = limits(G, 30);
        l.mem[1] = 4 * G;
        l.sm[1] = 50;
        assert_eq!(memory_on(&l, Some(1), 2), Some(4 * G));
        assert_eq!(
            memory_on(&l, None, 2),
            Some(G),
            "a GPU not given: the strictest"
        );
        assert_eq!(sm_on(&l, Some(1), 2), 50);
        assert_eq!(sm_on(&l, None, 2), 30);
        l.mem[2] = 0;
        assert_eq!(memory_on(&l, Some(2), 3), None);
        assert!(memory_past(G, G + G / 50 + 1));
        assert!(!memory_past(G, G + G / 50));
        assert!(sm_past(20, 31) && !sm_past(20, 30) && !sm_past(SM_UNLIMITED, 100));
        let raised = loosest(&limits(G, 30), &limits(2 * G, 20));
        assert_eq!((raised.mem[0], raised.sm[0]), (2 * G, 30));
        assert_eq!(loosest(&limits(G, 30), &limits(0, 30)).mem[0], 0);
    }

    #[test]
    fn sm_use_is_judged_over_a_window() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut w = SmWindow::default();
        w.push(at(0), [(1, 90)].into_iter().collect());
        w.push(at(1000), [(1, 90), (2, 10)].into_iter().collect());
        assert_eq!(w.means(), None, "one second is no window");
        w.push(at(2000), [(2, 10)].into_iter().collect());
        let m = w.means().unwrap();
        assert_eq!((m[&1], m[&2]), (60, 6));
        // Samples older than the window go.
        w.push(at(5500), HashMap::new());
        w.push(at(6500), HashMap::new());
        let m = w.means().unwrap();
        assert_eq!((m.get(&1), m[&2]), (None, 3));
        w.clear();
        assert_eq!(w.means(), None);
    }
}
