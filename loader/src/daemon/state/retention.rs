//! The durable record of findings: a finding that clears (the daemon
//! restored the limit, killed the process, or the tenant undid it) is kept,
//! marked resolved with when, for `--findings-retention` (default 15
//! minutes), and every violation is counted in `vgpu_violations_total{kind,
//! action}` when it appears. A finding that lives for one scan would
//! otherwise be invisible to anyone scraping every 15-60 s.
//!
//! One violation is one finding from when it appears until it clears; a
//! restored limit ends it (the next scan seeing the limit raised again is
//! the tenant's next write, a new violation). What is kept is bounded: at
//! most [`MAX_RESOLVED_PER_CGROUP`] resolved findings per container and
//! [`MAX_RESOLVED`] in all, the oldest dropped first, so one tenant cannot
//! push out the record of another.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::daemon::publish::snapshot::Labels;
use crate::daemon::state::findings::{Finding, Kind};

/// The default `--findings-retention`.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(15 * 60);
/// Resolved findings kept per cgroup.
pub const MAX_RESOLVED_PER_CGROUP: usize = 32;
/// Resolved findings kept in all.
pub const MAX_RESOLVED: usize = 1024;

/// The `action` label of a violation: what the daemon did when it found it.
pub fn action_label(action: Option<&str>) -> &'static str {
    match action {
        None => "none",
        Some("restored") => "restored",
        Some(a) if a.starts_with("killed") => "killed",
        Some(_) => "kill_failed",
    }
}

/// The (kind, action) pairs that can occur, created at 0 so that an
/// alert's `increase()` sees the first violation (a series that appears
/// at 1 has no increase).
pub fn known_labels() -> Vec<(Kind, &'static str)> {
    let mut v = Vec::new();
    for k in Kind::ALL {
        let actions: &[&str] = match k {
            Kind::UntrackedAllocation | Kind::NoRegion => &["none"],
            Kind::LimitTampered => &["none", "restored"],
            Kind::UnlimitedProcess | Kind::PrivateRegion | Kind::OverLimit => {
                &["none", "killed", "kill_failed"]
            }
        };
        v.extend(actions.iter().map(|a| (k, *a)));
    }
    v
}

/// Labels of `vgpu_violations_total`.
pub fn labels(kind: Kind, action: &str) -> Labels {
    vec![
        ("kind".to_owned(), kind.name().to_owned()),
        ("action".to_owned(), action.to_owned()),
    ]
}

/// What tells one finding from another: its kind and subject, and when it
/// started (the same subject failing again later is another violation).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    kind: Kind,
    pid: u32,
    cgroup: String,
    region: Option<PathBuf>,
    since: u64,
}

impl Key {
    fn of(f: &Finding) -> Self {
        Self {
            kind: f.kind,
            pid: f.pid,
            cgroup: f.cgroup.clone(),
            region: f.region.clone(),
            since: f.since_unix_ms,
        }
    }
}

/// Open findings of the last scan, and resolved ones still kept.
#[derive(Debug)]
pub struct Retention {
    keep_ms: u64,
    open: HashMap<Key, Finding>,
    /// Newest last.
    resolved: VecDeque<Finding>,
    violations: Family<Labels, Counter>,
}

impl Retention {
    /// Keeps resolved findings for `keep`; counts violations in
    /// `violations` (every known label pair is created at 0).
    pub fn new(keep: Duration, violations: Family<Labels, Counter>) -> Self {
        for (k, a) in known_labels() {
            drop(violations.get_or_create(&labels(k, a)));
        }
        Self {
            keep_ms: u64::try_from(keep.as_millis()).unwrap_or(u64::MAX),
            open: HashMap::new(),
            resolved: VecDeque::new(),
            violations,
        }
    }

    /// Takes this scan's findings: counts the new ones, marks those of the
    /// last scan that are gone as resolved at `now_ms`, forgets what is
    /// past the retention. Returns what to publish: the open findings as
    /// given, then the resolved ones, newest first.
    pub fn update(&mut self, current: &[Finding], now_ms: u64) -> Vec<Finding> {
        let keys: HashSet<Key> = current.iter().map(Key::of).collect();
        let (still, mut gone): (Vec<_>, Vec<_>) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|(k, _)| keys.contains(k));
        self.open.extend(still);
        gone.sort_by_key(|(k, _)| (k.since, k.kind.name(), k.pid));
        for (_, mut f) in gone {
            f.resolved_unix_ms = Some(now_ms);
            self.keep(f);
        }
        for f in current {
            let key = Key::of(f);
            if !self.open.contains_key(&key) {
                self.violations
                    .get_or_create(&labels(f.kind, action_label(f.action.as_deref())))
                    .inc();
            }
            self.open.insert(key, f.clone());
        }
        let horizon = now_ms.saturating_sub(self.keep_ms);
        self.resolved
            .retain(|f| f.resolved_unix_ms.is_some_and(|t| t >= horizon));
        let mut out = current.to_vec();
        out.extend(self.resolved.iter().rev().cloned());
        out
    }

    /// Takes over what the previous daemon published (`earlier`, written
    /// at `written_ms`): its resolved findings, and its open ones as
    /// resolved when it last wrote (if they still hold, this daemon finds
    /// them anew). A restart does not erase the record; it is not counted
    /// again.
    pub fn carry_over(&mut self, earlier: Vec<Finding>, written_ms: u64, now_ms: u64) {
        let horizon = now_ms.saturating_sub(self.keep_ms);
        let mut earlier: Vec<Finding> = earlier
            .into_iter()
            .map(|mut f| {
                f.resolved_unix_ms = Some(f.resolved_unix_ms.unwrap_or(written_ms));
                f
            })
            .filter(|f| {
                f.resolved_unix_ms
                    .is_some_and(|t| t >= horizon && t <= now_ms)
            })
            .collect();
        earlier.sort_by_key(|f| f.resolved_unix_ms);
        for f in earlier {
            self.keep(f);
        }
    }

    /// Keeps a resolved finding within the bounds.
    fn keep(&mut self, f: Finding) {
        let mine = self
            .resolved
            .iter()
            .filter(|r| r.cgroup == f.cgroup)
            .count();
        if mine >= MAX_RESOLVED_PER_CGROUP {
            if let Some(i) = self.resolved.iter().position(|r| r.cgroup == f.cgroup) {
                self.resolved.remove(i);
            }
        }
        if self.resolved.len() >= MAX_RESOLVED {
            self.resolved.pop_front();
        }
        self.resolved.push_back(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::collect::container_identity::ContainerIdentity;

    fn finding(kind: Kind, pid: u32, cgroup: &str, since: u64, action: Option<&str>) -> Finding {
        let container = ContainerIdentity {
            cgroup: cgroup.to_owned(),
            ..ContainerIdentity::default()
        };
        Finding {
            pid,
            action: action.map(str::to_owned),
            ..Finding::new(kind, &container, since, String::new())
        }
    }

    fn count(fam: &Family<Labels, Counter>, kind: Kind, action: &str) -> u64 {
        fam.get_or_create(&labels(kind, action)).get()
    }

    #[test]
    fn a_cleared_finding_is_kept_resolved_and_counted_once() {
        let fam = Family::<Labels, Counter>::default();
        let mut r = Retention::new(Duration::from_secs(60), fam.clone());
        assert_eq!(count(&fam, Kind::LimitTampered, "restored"), 0);
        let t = finding(Kind::LimitTampered, 0, "/a", 1_000, Some("restored"));
        let out = r.update(std::slice::from_ref(&t), 1_000);
        assert_eq!(out, vec![t.clone()]);
        // Still open at the next scan: not counted again.
        r.update(std::slice::from_ref(&t), 1_500);
        assert_eq!(count(&fam, Kind::LimitTampered, "restored"), 1);
        // Cleared: kept, resolved when it was first seen gone.
        let out = r.update(&[], 2_000);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].resolved_unix_ms, Some(2_000));
        assert_eq!(out[0].action.as_deref(), Some("restored"));
        // A minute later it is still there, then it goes.
        assert_eq!(r.update(&[], 62_000).len(), 1);
        assert!(r.update(&[], 62_001).is_empty());
        assert_eq!(count(&fam, Kind::LimitTampered, "restored"), 1);
        // The same subject again later is another violation.
        let again = finding(Kind::LimitTampered, 0, "/a", 70_000, None);
        r.update(std::slice::from_ref(&again), 70_000);
        assert_eq!(count(&fam, Kind::LimitTampered, "none"), 1);
    }

    #[test]
    fn open_findings_come_first_then_the_newest_resolved() {
        let fam = Family::<Labels, Counter>::default();
        let mut r = Retention::new(DEFAULT_RETENTION, fam.clone());
        let a = finding(
            Kind::UnlimitedProcess,
            7,
            "/a",
            1,
            Some("killed host pid 7"),
        );
        let b = finding(Kind::OverLimit, 0, "/b", 2, Some("not killed: gone"));
        let c = finding(Kind::NoRegion, 9, "/c", 3, None);
        r.update(&[a.clone(), b.clone(), c.clone()], 3);
        r.update(&[b.clone(), c.clone()], 4);
        let out = r.update(std::slice::from_ref(&c), 5);
        let order: Vec<(Kind, Option<u64>)> =
            out.iter().map(|f| (f.kind, f.resolved_unix_ms)).collect();
        assert_eq!(
            order,
            vec![
                (Kind::NoRegion, None),
                (Kind::OverLimit, Some(5)),
                (Kind::UnlimitedProcess, Some(4)),
            ]
        );
        assert_eq!(count(&fam, Kind::UnlimitedProcess, "killed"), 1);
        assert_eq!(count(&fam, Kind::OverLimit, "kill_failed"), 1);
        assert_eq!(count(&fam, Kind::NoRegion, "none"), 1);
    }

    #[test]
    fn one_tenant_cannot_push_out_another_record() {
        let fam = Family::<Labels, Counter>::default();
        let mut r = Retention::new(DEFAULT_RETENTION, fam);
        let other = finding(Kind::LimitTampered, 0, "/victim", 1, Some("restored"));
        r.update(std::slice::from_ref(&other), 1);
        r.update(&[], 2);
        for i in 0..(MAX_RESOLVED as u64 * 2) {
            let f = finding(
                Kind::UnlimitedProcess,
                100 + i as u32,
                "/noisy",
                10 + i,
                None,
            );
            r.update(std::slice::from_ref(&f), 10 + i);
        }
        let out = r.update(&[], 5_000);
        assert_eq!(out.len(), MAX_RESOLVED_PER_CGROUP + 1);
        assert!(out.iter().any(|f| f.cgroup == "/victim"));
    }

    #[test]
    fn a_restart_keeps_the_record() {
        let fam = Family::<Labels, Counter>::default();
        let mut r = Retention::new(Duration::from_secs(60), fam.clone());
        let mut old = finding(Kind::LimitTampered, 0, "/a", 1_000, Some("restored"));
        old.resolved_unix_ms = Some(2_000);
        let open = finding(Kind::OverLimit, 0, "/b", 3_000, Some("killed host pid 9"));
        let mut expired = finding(Kind::NoRegion, 5, "/c", 1, None);
        expired.resolved_unix_ms = Some(10);
        r.carry_over(vec![old, open, expired], 4_000, 61_000);
        let out = r.update(&[], 61_500);
        let got: Vec<(Kind, Option<u64>)> =
            out.iter().map(|f| (f.kind, f.resolved_unix_ms)).collect();
        assert_eq!(
            got,
            vec![
                (Kind::OverLimit, Some(4_000)),
                (Kind::LimitTampered, Some(2_000))
            ]
        );
        // Carried over, not counted again.
        assert_eq!(count(&fam, Kind::OverLimit, "killed"), 0);
        // And the file it came from reads back.
        let dir = tempfile::tempdir().unwrap();
        crate::daemon::state::findings::write_state(
            dir.path(),
            &crate::daemon::state::findings::to_json(&out, 7),
        )
        .unwrap();
        let (back, at) = crate::daemon::state::findings::read_earlier(dir.path());
        assert_eq!((back, at), (out, 7));
    }

    #[test]
    fn action_labels() {
        assert_eq!(action_label(None), "none");
        assert_eq!(action_label(Some("restored")), "restored");
        assert_eq!(action_label(Some("killed host pid 5")), "killed");
        assert_eq!(action_label(Some("not killed: gone")), "kill_failed");
        assert_eq!(known_labels().len(), 13);
    }
}
