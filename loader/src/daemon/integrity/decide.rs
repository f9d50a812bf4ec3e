//! The integrity decisions, free of I/O: which limits differ, whether a
//! process escaped its container's limit, whether a container is past it,
//! and what the policy does about each.

use vgpu_common::region::MAX_DEVICES;

use super::expected::Limits;
use crate::daemon::findings::{Kind, LimitMismatch, LimitName};
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
        // The node table is repaired whatever the policy (`node_table`).
        Kind::UntrackedAllocation | Kind::NoRegion | Kind::NodeTableForged => Plan::default(),
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

    /// Whether this is past `limit`: the probes (data alone) past it, or
    /// the larger count past it by more than [`slack`].
    pub fn over(&self, limit: u64) -> bool {
        self.probes > limit || self.bytes > limit.saturating_add(slack(limit))
    }

    /// `kernel's count X, driver's count Y`.
    pub fn describe(&self) -> String {
        let probes = crate::regions::summary::bytes(self.probes);
        match self.nvml {
            Some(n) => format!(
                "kernel's count {probes}, driver's count {}",
                crate::regions::summary::bytes(n)
            ),
            None => format!("kernel's count {probes}"),
        }
    }
}

/// A container's process, as `over_limit` chooses whom to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// The larger of what the kernel saw it allocate minus free and what
    /// the driver says it uses.
    pub held_bytes: u64,
    /// What its slot accounts.
    pub tracked_bytes: u64,
}

/// The process to stop first when a container is past its limit: the one
/// holding the most memory its slot does not account, then the largest.
pub fn victim(holders: &[Holder]) -> Option<u32> {
    holders
        .iter()
        .filter(|h| h.held_bytes > 0)
        .max_by_key(|h| {
            (
                h.held_bytes.saturating_sub(h.tracked_bytes),
                h.held_bytes,
                std::cmp::Reverse(h.pid),
            )
        })
        .map(|h| h.pid)
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
        assert!(h.over(G));
        // A process NVML does not list still counts by the probes, and
        // one only NVML lists by NVML.
        let h = Held::of(&[u(Some(700 * mib), None), u(None, Some(600 * mib))]);
        assert_eq!(
            (h.probes, h.nvml, h.bytes),
            (700 * mib, Some(600 * mib), 1300 * mib)
        );
        assert!(h.over(G));
        // At the limit by NVML (context included), within the slack: fine.
        let h = Held::of(&[u(Some(500 * mib), Some(G + 10 * mib))]);
        assert!(!h.over(G));
        // The probes past the limit need no slack (they see no context).
        assert!(Held::of(&[u(Some(G + 1), None)]).over(G));
        assert_eq!(slack(G), G / 50);
        assert_eq!(slack(G / 2), 16 * mib);
        assert!(Held::of(&[u(Some(1), Some(2))])
            .describe()
            .contains("driver's count"));
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
    fn the_victim_holds_the_most_untracked_memory() {
        let h = |pid, held_bytes, tracked_bytes| Holder {
            pid,
            held_bytes,
            tracked_bytes,
        };
        assert_eq!(victim(&[]), None);
        assert_eq!(victim(&[h(1, 0, 0)]), None);
        assert_eq!(
            victim(&[h(1, 2 * G, 2 * G), h(2, G, 0), h(3, G / 2, 0)]),
            Some(2)
        );
        assert_eq!(victim(&[h(1, G, G), h(2, 2 * G, 2 * G)]), Some(2));
    }
}
