//! The checks of one container, run by [`Integrity::scan`]: its regions'
//! limits, each process's own environment and region (its usage:
//! `usage`).

use crate::regions::open::{open_in_process, Access};
use std::path::Path;

use super::decide::{self, Plan};
use super::enforce;
use super::expected::Expected;
use super::overrides::FileKey;
use super::report::{base, describe, short};
use super::{Integrity, OwnEnv, ProcInput, RegionAccess, Subject};
use crate::daemon::collect::container_identity::ContainerIdentity;
use crate::daemon::state::findings::{Finding, Kind, LimitMismatch, LimitName};

impl Integrity {
    pub(super) fn check_regions(
        &mut self,
        exp: &Expected,
        source: &Path,
        members: &[&ProcInput<'_>],
        regions: &impl RegionAccess,
        out: &mut Vec<(Subject, Finding)>,
    ) {
        let Some(first) = members.first() else {
            return;
        };
        let mut keys: Vec<FileKey> = members.iter().filter_map(|p| p.region).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            // Region first, then the admin's record: `set-*-limit` writes
            // the record before the region, so a new value is never seen
            // without it.
            let Some(found) = regions.limits(&key) else {
                continue;
            };
            let want = self.effective(exp, &key, &found);
            let m = decide::mismatches(&want, &found);
            if m.is_empty() {
                continue;
            }
            let plan = decide::plan(self.cfg.policy, exp.oom_killer, Kind::LimitTampered);
            let ctr = first.identity.container_id.clone().unwrap_or_default();
            let subject = Subject::Region(key, ctr);
            let action = plan.restore.then(|| {
                let n = regions.restore(&key, &m);
                if n > 0 {
                    // Undone: seeing it again is the tenant's next write.
                    self.ended.insert((Kind::LimitTampered, subject.clone()));
                }
                let shown = regions.shown(&key).unwrap_or_default();
                // The finding itself is logged once; a tenant rewriting the
                // limit continuously makes this line repeat, so not a warning.
                if n > 0 {
                    tracing::info!(
                        "restored {n} limit(s) of region {} (container {})",
                        shown.display(),
                        short(first.identity.container_id.as_deref().unwrap_or("-"))
                    );
                }
                "restored".to_owned()
            });
            let region = regions.shown(&key);
            let message = format!(
                "limit tampered: region {} of container {}: {}; its spec: {}{}",
                region.as_deref().unwrap_or(Path::new("-")).display(),
                short(first.identity.container_id.as_deref().unwrap_or("-")),
                describe(&m),
                source.display(),
                action
                    .as_deref()
                    .map_or(String::new(), |a| format!("; {a}")),
            );
            let mut f = base(Kind::LimitTampered, None, first.identity, message);
            f.region = region;
            f.limits = m;
            f.action = action;
            out.push((subject, f));
        }
    }

    pub(super) fn check_process(
        &mut self,
        exp: &Expected,
        p: &ProcInput<'_>,
        regions: &impl RegionAccess,
        out: &mut Vec<(Subject, Finding)>,
    ) {
        let Some(own) = self.own_env(p.pid) else {
            return;
        };
        let ctr = short(p.identity.container_id.as_deref().unwrap_or("-"));
        let mut found: Vec<(Kind, String, Vec<LimitMismatch>)> = Vec::new();
        let mut loose = decide::looser(&exp.limits, &own.limits);
        if !loose.is_empty() {
            // An admin may have raised the container's limit since.
            if let Some(key) = p.region {
                if let Some(have) = regions.limits(&key) {
                    let want = self.effective(exp, &key, &have);
                    loose = decide::looser(&want, &own.limits);
                }
            }
        }
        if p.unhooked || !loose.is_empty() {
            let why = if p.unhooked {
                "runs without the hook's accounting".to_owned()
            } else if !own.memory_var && loose.iter().any(|m| m.limit == LimitName::MemoryBytes) {
                format!(
                    "has no {} ({})",
                    vgpu_common::env::MEMORY_LIMIT,
                    describe(&loose)
                )
            } else {
                format!(
                    "has looser limits than its container ({})",
                    describe(&loose)
                )
            };
            found.push((
                Kind::UnlimitedProcess,
                format!(
                    "unlimited process: pid {} ({}) container {ctr} {why}",
                    p.pid, p.comm
                ),
                loose,
            ));
        }
        if self.private(exp, p, &own) {
            found.push((
                Kind::PrivateRegion,
                format!(
                    "private region: pid {} ({}) container {ctr} names region {}, not its container's {}",
                    p.pid,
                    p.comm,
                    own.region.display(),
                    exp.region.display()
                ),
                Vec::new(),
            ));
        }
        for (kind, message, limits) in found {
            let plan = decide::plan(self.cfg.policy, exp.oom_killer, kind);
            let action = self.act(plan, p.pid, p.identity);
            let mut f = base(kind, Some(p), p.identity, message);
            if let Some(a) = &action {
                f.message.push_str(&format!("; {a}"));
            }
            f.region = Some(own.region.clone());
            f.limits = limits;
            f.action = action;
            out.push((Subject::Pid(p.pid), f));
        }
    }

    /// Whether `p` names another region than its container's (by file, so
    /// another spelling of the same path is not one).
    pub(super) fn private(&self, exp: &Expected, p: &ProcInput<'_>, own: &OwnEnv) -> bool {
        if own.region == exp.region {
            return false;
        }
        // Opened inside the process's root like every path it names: no
        // symlink, no FIFO, nothing outside the container.
        let key_of = |path: &Path| {
            open_in_process(&self.procfs.dir(p.pid), path, Access::ReadOnly)
                .ok()
                .map(|io| io.key())
        };
        let want = key_of(&exp.region);
        let have = p.region.or_else(|| key_of(&own.region));
        have.is_none() || have != want
    }

    /// Carries out `plan`'s kill of `pid`, once per process: later calls
    /// return the first outcome.
    pub(super) fn act(&mut self, plan: Plan, pid: u32, id: &ContainerIdentity) -> Option<String> {
        if !plan.kill {
            return None;
        }
        if let Some(done) = self.tried.get(&pid) {
            return Some(done.clone());
        }
        let outcome = match enforce::kill_in_cgroup(&self.procfs, pid, &id.cgroup) {
            Ok(()) => {
                tracing::warn!("killed host pid {pid} (cgroup {})", id.cgroup);
                format!("killed host pid {pid}")
            }
            Err(e) => {
                tracing::warn!("not killed: {e}");
                format!("not killed: {e}")
            }
        };
        self.tried.insert(pid, outcome.clone());
        Some(outcome)
    }
}
