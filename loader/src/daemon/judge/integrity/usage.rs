//! `over_limit`: what a container uses of each GPU, by the driver's count
//! (NVML per process, summed over the processes of its cgroup) and the
//! kernel's (the probes), against what its runtime spec (or an admin's
//! record) gave it on that GPU. Nothing of its region decides: not its
//! limits, not its slots, not whether the daemon could read them.

use std::collections::HashMap;
use std::time::Instant;

use super::decide::{self, Held, Holder};
use super::expected::{Expected, Limits};
use super::overrides::FileKey;
use super::report::{base, short, show_sm};
use super::{Integrity, ProcInput, RegionAccess, Subject, OVER_SCANS};
use crate::daemon::collect::nvml::DeviceSample;
use crate::daemon::state::findings::{Finding, Kind, LimitMismatch, LimitName};
use crate::regions::summary::bytes;

/// One limit a container is past, and what each of its processes holds
/// of it.
struct Past {
    /// The limit and what the container holds (`None`: the probes' count
    /// over every GPU, which knows no device).
    what: Option<LimitMismatch>,
    /// NVML's index of the GPU.
    gpu: Option<u32>,
    /// What it may hold before it is past.
    allowed: u64,
    /// What it holds, exited processes included.
    total: u64,
    holders: Vec<Holder>,
    sentence: String,
}

impl Integrity {
    /// Judges the container's use of every GPU, whatever its region says:
    /// memory per GPU (NVML) at every scan, SM use per GPU (NVML) over
    /// [`decide::SM_WINDOW`], and the probes' count over all its GPUs for
    /// [`OVER_SCANS`] scans. Under `kill`, its processes holding what is
    /// past a limit are stopped until the rest fits.
    pub(super) fn check_usage(
        &mut self,
        exp: &Expected,
        id: &str,
        members: &[&ProcInput<'_>],
        regions: &impl RegionAccess,
        gpus: &[DeviceSample],
        out: &mut Vec<(Subject, Finding)>,
    ) {
        let Some(&first) = members.first() else {
            return;
        };
        let node = (!gpus.is_empty()).then_some(gpus.len());
        let devices = decide::devices(exp.devices, node);
        self.sample_sm(id, members, gpus);
        let mut past = self.past(&exp.limits, exp, id, members, gpus, devices);
        if !past.is_empty() {
            // Admins may have raised the limits since: the loosest recorded.
            let mut keys: Vec<FileKey> = members.iter().filter_map(|p| p.region).collect();
            keys.sort();
            keys.dedup();
            let mut limits = exp.limits;
            for key in &keys {
                if let Some(have) = regions.limits(key) {
                    limits = decide::loosest(&limits, &self.effective(exp, key, &have));
                }
            }
            if limits != exp.limits {
                past = self.past(&limits, exp, id, members, gpus, devices);
            }
        }
        // The probes' count alone is two counters that can race (a free
        // seen after the allocation that reused it): it must hold for
        // `OVER_SCANS` scans. The driver's count per GPU is what it holds.
        let probes_only = past.iter().all(|p| p.gpu.is_none());
        let n = self.over.entry(id.to_owned()).or_insert(0);
        *n = if past.is_empty() { 0 } else { *n + 1 };
        if past.is_empty() || (probes_only && *n < OVER_SCANS) {
            return;
        }
        let plan = decide::plan(self.cfg.policy, exp.oom_killer, Kind::OverLimit);
        let mut actions: Vec<String> = Vec::new();
        if plan.kill {
            for p in &past {
                for pid in decide::victims(&p.holders, p.total, p.allowed) {
                    let who = members.iter().find(|m| m.pid == pid).map_or(first, |m| *m);
                    if let Some(a) = self.act(plan, pid, who.identity) {
                        if !actions.contains(&a) {
                            actions.push(a);
                        }
                    }
                    // What it used is not held against the processes left.
                    if let (Some(gpu), Some(LimitName::SmPercent)) =
                        (p.gpu, p.what.map(|m| m.limit))
                    {
                        if let Some(w) = self.sm.get_mut(&(id.to_owned(), gpu)) {
                            w.clear();
                        }
                    }
                }
            }
        }
        let usage: Vec<decide::Usage> = members
            .iter()
            .map(|p| decide::Usage {
                probe_bytes: p.probe_bytes,
                nvml_bytes: p.nvml_bytes,
            })
            .collect();
        let held = Held::of(&usage);
        let action = (!actions.is_empty()).then(|| actions.join(", "));
        let message = format!(
            "over limit: container {}: {}{}",
            short(id),
            past.iter()
                .map(|p| p.sentence.as_str())
                .collect::<Vec<_>>()
                .join("; "),
            action
                .as_deref()
                .map_or(String::new(), |a| format!("; {a}")),
        );
        let mut f = base(Kind::OverLimit, None, first.identity, message);
        f.probe_bytes = Some(held.probes);
        f.nvml_bytes = held.nvml;
        f.limits = past.iter().filter_map(|p| p.what).collect();
        f.action = action;
        out.push((Subject::Container(id.to_owned()), f));
    }

    /// This scan's NVML utilization of each GPU by the container's
    /// processes, into its windows.
    fn sample_sm(&mut self, id: &str, members: &[&ProcInput<'_>], gpus: &[DeviceSample]) {
        let now = Instant::now();
        for g in gpus {
            let Some(util) = &g.process_util else {
                continue;
            };
            let by_pid: HashMap<u32, u32> = members
                .iter()
                .filter_map(|p| Some((p.pid, *util.get(&p.pid)?)))
                .collect();
            self.sm
                .entry((id.to_owned(), g.index))
                .or_default()
                .push(now, by_pid);
        }
    }

    /// Every limit of `limits` the container is past now.
    fn past(
        &self,
        limits: &Limits,
        exp: &Expected,
        id: &str,
        members: &[&ProcInput<'_>],
        gpus: &[DeviceSample],
        devices: usize,
    ) -> Vec<Past> {
        let mut out = Vec::new();
        for g in gpus {
            let ordinal = exp.ordinal(g.index, &g.uuid);
            // Reported by the index its limit variables use when the spec
            // gave it this GPU, else by NVML's.
            let device = ordinal.unwrap_or(g.index as usize);
            let name = match ordinal {
                Some(d) => format!("GPU {} (device {d})", g.index),
                None => format!("GPU {} (not given by its spec)", g.index),
            };
            if let Some(limit) = decide::memory_on(limits, ordinal, devices) {
                let holders: Vec<Holder> = members
                    .iter()
                    .filter_map(|p| {
                        let held = *g.process_memory.get(&p.pid)?;
                        let all = p.probe_bytes.max(p.nvml_bytes).unwrap_or(0);
                        Some(Holder {
                            pid: p.pid,
                            held,
                            untracked: all.saturating_sub(p.tracked_bytes),
                        })
                    })
                    .collect();
                let total = holders.iter().map(|h| h.held).sum::<u64>();
                if decide::memory_past(limit, total) {
                    out.push(Past {
                        what: Some(LimitMismatch {
                            device,
                            limit: LimitName::MemoryBytes,
                            expected: limit,
                            found: total,
                        }),
                        gpu: Some(g.index),
                        allowed: limit.saturating_add(decide::slack(limit)),
                        total,
                        holders,
                        sentence: format!(
                            "{name} holds {} by the driver's count, past its limit of {}",
                            bytes(total),
                            bytes(limit)
                        ),
                    });
                }
            }
            let limit = decide::sm_on(limits, ordinal, devices);
            let means = self
                .sm
                .get(&(id.to_owned(), g.index))
                .and_then(decide::SmWindow::means);
            if let Some(means) = means {
                let total = means.values().sum::<u64>();
                if decide::sm_past(limit, total) {
                    let holders = members
                        .iter()
                        .filter_map(|p| {
                            Some(Holder {
                                pid: p.pid,
                                held: *means.get(&p.pid)?,
                                untracked: 0,
                            })
                        })
                        .collect();
                    out.push(Past {
                        what: Some(LimitMismatch {
                            device,
                            limit: LimitName::SmPercent,
                            expected: limit,
                            found: total,
                        }),
                        gpu: Some(g.index),
                        allowed: limit.saturating_add(decide::SM_TOLERANCE),
                        total,
                        holders,
                        sentence: format!(
                            "{name} used {total}% of its SMs over the last {} s, past its \
                             limit of {} (+{} points)",
                            decide::SM_WINDOW.as_secs(),
                            show_sm(limit),
                            decide::SM_TOLERANCE
                        ),
                    });
                }
            }
        }
        if let Some(allowance) = decide::allowance(limits, devices) {
            let holders: Vec<Holder> = members
                .iter()
                .filter_map(|p| {
                    let held = p.probe_bytes?;
                    Some(Holder {
                        pid: p.pid,
                        held,
                        untracked: held.saturating_sub(p.tracked_bytes),
                    })
                })
                .collect();
            let total = holders.iter().map(|h| h.held).sum::<u64>();
            if total > allowance {
                out.push(Past {
                    what: None,
                    gpu: None,
                    allowed: allowance,
                    total,
                    holders,
                    sentence: format!(
                        "{} allocated by the kernel's count, past its limit of {} on {devices} \
                         GPU(s)",
                        bytes(total),
                        bytes(allowance)
                    ),
                });
            }
        }
        out
    }
}
