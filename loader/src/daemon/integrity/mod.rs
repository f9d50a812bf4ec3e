//! Limit integrity: the daemon knows what each container's limits should
//! be and reports, every scan, what differs, then applies the policy.
//!
//! - [`spec`] reads the container's OCI runtime spec (the environment the
//!   device plugin gave it, which the container cannot change);
//! - [`expected`] turns it into limits, as the hook parses them;
//! - [`overrides`] keeps admins' runtime changes (`vgpu set-*-limit`);
//! - [`decide`] holds the pure decisions, [`enforce`] the actions.
//!
//! Findings: `limit_tampered` (a region's limits differ), `unlimited_process`
//! (a process's own limit variables are unset or looser, or it runs without
//! the hook), `private_region` (it names another region) and `over_limit`
//! (the container holds more than its limit by the kernel's count). See the
//! "Limit integrity" section of docs/daemon.md.

mod access;
pub mod decide;
pub mod enforce;
pub mod expected;
pub mod overrides;
pub mod spec;

use std::collections::{HashMap, HashSet};
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vgpu_common::env::{SHARED_CACHE, SHARED_CACHE_DEFAULT};

use self::decide::{Holder, Plan, Policy};
use self::expected::{Expected, Limits};
use self::overrides::FileKey;
use self::spec::SpecPattern;
use super::findings::{Finding, Kind, LimitMismatch, LimitName};
use super::identity::Identity;
use super::procfs::Procfs;
use crate::regions::summary::bytes;

/// A spec that was not found is looked for again after this long.
const SPEC_RETRY: Duration = Duration::from_secs(5);
/// A container not seen for this long is forgotten.
const SPEC_IDLE: Duration = Duration::from_secs(120);
/// Scans a container must stay past its limit to be `over_limit`.
const OVER_SCANS: u32 = 2;
/// `/proc/<pid>/environ` is read up to this many bytes.
const MAX_ENVIRON: u64 = 1 << 20;

/// Settings (`vgpu daemon` flags).
#[derive(Clone, Debug)]
pub struct Config {
    /// Where runtime specs are (`--runtime-spec`).
    pub specs: Vec<SpecPattern>,
    /// The daemon's `--state-dir` (admin overrides under it).
    pub state_dir: PathBuf,
    /// `--on-violation`.
    pub policy: Policy,
}

/// One CUDA process, as the observer knows it.
#[derive(Clone, Debug)]
pub struct ProcInput<'a> {
    /// Host PID (from the probes or NVML, never from a region).
    pub pid: u32,
    pub ns_pid: u32,
    pub comm: String,
    pub identity: &'a Identity,
    /// The region of its slot.
    pub region: Option<FileKey>,
    /// No slot after the grace period: the hook does not account it.
    pub unhooked: bool,
    /// Bytes the kernel saw it allocate minus free.
    pub probe_bytes: Option<u64>,
    /// Bytes its slot accounts.
    pub tracked_bytes: u64,
}

/// What a region holds, and writing limits back.
pub trait RegionAccess {
    /// The region's limits (normalised as the hook stores them) and
    /// `device_num`, if it is open and initialised.
    fn limits(&self, key: &FileKey) -> Option<(Limits, u64)>;
    /// The path to report.
    fn shown(&self, key: &FileKey) -> Option<PathBuf>;
    /// Writes the expected values of `m` back (see [`enforce::restore`]).
    fn restore(&self, key: &FileKey, m: &[LimitMismatch]) -> usize;
}

#[derive(Debug)]
struct SpecEntry {
    expected: Option<Expected>,
    source: Option<PathBuf>,
    read_at: Instant,
    used_at: Instant,
}

/// A process's own view: its limits and the region it names.
#[derive(Clone, Debug)]
struct OwnEnv {
    limits: Limits,
    region: PathBuf,
    memory_var: bool,
}

/// What a finding is about (for its start time and the log).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Subject {
    Pid(u32),
    Region(FileKey, String),
    Container(String),
}

/// The integrity checker's state.
pub struct Integrity {
    cfg: Config,
    procfs: Procfs,
    specs: HashMap<String, SpecEntry>,
    envs: HashMap<u32, Option<OwnEnv>>,
    since: HashMap<(Kind, Subject), u64>,
    over: HashMap<String, u32>,
    /// Processes a kill was tried on (one try each).
    tried: HashSet<u32>,
}

impl Integrity {
    pub fn new(cfg: Config, procfs: Procfs) -> Self {
        Self {
            cfg,
            procfs,
            specs: HashMap::new(),
            envs: HashMap::new(),
            since: HashMap::new(),
            over: HashMap::new(),
            tried: HashSet::new(),
        }
    }

    /// One scan over the observer's processes: findings, and the policy's
    /// actions.
    pub fn scan(
        &mut self,
        procs: &[ProcInput<'_>],
        regions: &impl RegionAccess,
        now_ms: u64,
    ) -> Vec<Finding> {
        let live: HashSet<u32> = procs.iter().map(|p| p.pid).collect();
        self.envs.retain(|pid, _| live.contains(pid));
        self.tried.retain(|pid| live.contains(pid));
        let mut by_ctr: HashMap<String, Vec<&ProcInput<'_>>> = HashMap::new();
        for p in procs {
            if let Some(c) = &p.identity.container_id {
                by_ctr.entry(c.clone()).or_default().push(p);
            }
        }
        let mut out = Vec::new();
        let mut ids: Vec<&String> = by_ctr.keys().collect();
        ids.sort();
        for id in ids {
            let members = &by_ctr[id];
            let Some((exp, source)) = self.expected(id) else {
                self.over.remove(id);
                continue;
            };
            self.check_regions(&exp, &source, members, regions, &mut out);
            for p in members {
                self.check_process(&exp, p, regions, &mut out);
            }
            self.check_usage(&exp, id, members, regions, &mut out);
        }
        let now = Instant::now();
        self.specs
            .retain(|_, e| now.duration_since(e.used_at) < SPEC_IDLE);
        self.over.retain(|c, _| by_ctr.contains_key(c));
        self.publish(out, now_ms)
    }

    /// Start times, and a log line for each finding that is new or cleared.
    fn publish(&mut self, found: Vec<(Subject, Finding)>, now_ms: u64) -> Vec<Finding> {
        let mut keys = HashSet::new();
        let mut out = Vec::with_capacity(found.len());
        for (subject, mut f) in found {
            let key = (f.kind, subject);
            let since = *self.since.entry(key.clone()).or_insert(now_ms);
            if since == now_ms {
                tracing::warn!("{}", f.message);
            }
            f.since_unix_ms = since;
            keys.insert(key);
            out.push(f);
        }
        self.since.retain(|k, _| {
            let keep = keys.contains(k);
            if !keep {
                tracing::info!("finding {} for {:?} cleared", k.0.name(), k.1);
            }
            keep
        });
        out
    }

    /// The container's expected limits and where they came from; `None`
    /// when it has none (no spec, or a spec without limits).
    fn expected(&mut self, id: &str) -> Option<(Expected, PathBuf)> {
        let now = Instant::now();
        let stale = self.specs.get(id).is_none_or(|e| {
            e.expected.is_none()
                && e.source.is_none()
                && now.duration_since(e.read_at) >= SPEC_RETRY
        });
        if stale {
            // Say what is wrong with a spec once, not at every retry.
            let first = !self.specs.contains_key(id);
            let (expected, source) = match spec::find(&self.cfg.specs, id) {
                Ok(Some((path, env))) => {
                    let e = Expected::from_env(&env);
                    if let Some(e) = &e {
                        for err in &e.errors {
                            tracing::warn!("container {id}: spec {}: {err}", path.display());
                        }
                        tracing::info!(
                            "container {}: limits from {} (memory {}, SM {}%)",
                            short(id),
                            path.display(),
                            show_mem(e.limits.mem[0]),
                            e.limits.sm[0]
                        );
                    }
                    (e, Some(path))
                }
                Ok(None) => (None, None),
                Err(err) => {
                    if first {
                        tracing::warn!("container {}: {err}", short(id));
                    }
                    (None, None)
                }
            };
            self.specs.insert(
                id.to_owned(),
                SpecEntry {
                    expected,
                    source,
                    read_at: now,
                    used_at: now,
                },
            );
        }
        let e = self.specs.get_mut(id)?;
        e.used_at = now;
        Some((e.expected.clone()?, e.source.clone()?))
    }

    /// The limits of region `key` for a container expecting `exp`, with
    /// admins' changes when the region differs from the spec.
    fn effective(&self, exp: &Expected, key: Option<&FileKey>, found: &Limits) -> Limits {
        let m = decide::mismatches(&exp.limits, found);
        match key {
            Some(key) if !m.is_empty() => match overrides::load(&self.cfg.state_dir, *key) {
                Ok(Some(o)) => exp.with_overrides(&o),
                Ok(None) => exp.limits,
                Err(e) => {
                    tracing::warn!("{e}");
                    exp.limits
                }
            },
            _ => exp.limits,
        }
    }

    fn check_regions(
        &self,
        exp: &Expected,
        source: &Path,
        members: &[&ProcInput<'_>],
        regions: &impl RegionAccess,
        out: &mut Vec<(Subject, Finding)>,
    ) {
        let mut keys: Vec<FileKey> = members.iter().filter_map(|p| p.region).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            // Region first, then the admin's record: `set-*-limit` writes
            // the record before the region, so a new value is never seen
            // without it.
            let Some((found, _)) = regions.limits(&key) else {
                continue;
            };
            let want = self.effective(exp, Some(&key), &found);
            let m = decide::mismatches(&want, &found);
            if m.is_empty() {
                continue;
            }
            let first = members[0];
            let plan = decide::plan(self.cfg.policy, exp.oom_killer, Kind::LimitTampered);
            let action = plan.restore.then(|| {
                let n = regions.restore(&key, &m);
                let shown = regions.shown(&key).unwrap_or_default();
                if n > 0 {
                    tracing::warn!(
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
            let ctr = first.identity.container_id.clone().unwrap_or_default();
            out.push((Subject::Region(key, ctr), f));
        }
    }

    fn check_process(
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
                if let Some((have, _)) = regions.limits(&key) {
                    let want = self.effective(exp, Some(&key), &have);
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
    fn private(&self, exp: &Expected, p: &ProcInput<'_>, own: &OwnEnv) -> bool {
        if own.region == exp.region {
            return false;
        }
        let key_of = |path: &Path| {
            std::fs::metadata(self.procfs.resolve(p.pid, path))
                .ok()
                .map(|m| (m.dev(), m.ino()))
        };
        let want = key_of(&exp.region);
        let have = p.region.or_else(|| key_of(&own.region));
        have.is_none() || have != want
    }

    fn check_usage(
        &mut self,
        exp: &Expected,
        id: &str,
        members: &[&ProcInput<'_>],
        regions: &impl RegionAccess,
        out: &mut Vec<(Subject, Finding)>,
    ) {
        let held: u64 = members
            .iter()
            .filter_map(|p| p.probe_bytes)
            .fold(0, u64::saturating_add);
        let mut keys: Vec<FileKey> = members.iter().filter_map(|p| p.region).collect();
        keys.sort();
        keys.dedup();
        let device_num = keys
            .iter()
            .filter_map(|k| regions.limits(k).map(|(_, n)| n))
            .max()
            .unwrap_or(1);
        let devices = exp.devices.unwrap_or(device_num.min(16) as usize);
        let mut limit = decide::allowance(&exp.limits, devices);
        if limit.is_some_and(|l| held > l) {
            // Admins may have raised it: take the largest recorded.
            for key in &keys {
                if let Some((have, _)) = regions.limits(key) {
                    let want = self.effective(exp, Some(key), &have);
                    limit = limit.max(decide::allowance(&want, devices));
                }
            }
        }
        let Some(limit) = limit.filter(|&l| held > l) else {
            self.over.remove(id);
            return;
        };
        let n = self.over.entry(id.to_owned()).or_insert(0);
        *n += 1;
        if *n < OVER_SCANS {
            return;
        }
        let first = members[0];
        let plan = decide::plan(self.cfg.policy, exp.oom_killer, Kind::OverLimit);
        let holders: Vec<Holder> = members
            .iter()
            .filter(|p| !self.tried.contains(&p.pid))
            .map(|p| Holder {
                pid: p.pid,
                probe_bytes: p.probe_bytes.unwrap_or(0),
                tracked_bytes: p.tracked_bytes,
            })
            .collect();
        let action = match (plan.kill, decide::victim(&holders)) {
            (true, Some(pid)) => {
                let who = members.iter().find(|p| p.pid == pid).map_or(first, |p| *p);
                self.act(plan, pid, who.identity)
            }
            _ => None,
        };
        let message = format!(
            "over limit: container {} holds {} of device memory by the kernel's count, past its limit of {}{}",
            short(id),
            bytes(held),
            bytes(limit),
            action.as_deref().map_or(String::new(), |a| format!("; {a}")),
        );
        let mut f = base(Kind::OverLimit, None, first.identity, message);
        f.probe_bytes = Some(held);
        f.action = action;
        out.push((Subject::Container(id.to_owned()), f));
    }

    /// Carries out `plan`'s kill of `pid` (once per process).
    fn act(&mut self, plan: Plan, pid: u32, id: &Identity) -> Option<String> {
        if !plan.kill {
            return None;
        }
        if !self.tried.insert(pid) {
            return Some(format!("kill of host pid {pid} already tried"));
        }
        Some(
            match enforce::kill_in_cgroup(&self.procfs, pid, &id.cgroup) {
                Ok(()) => {
                    tracing::warn!("killed host pid {pid} (cgroup {})", id.cgroup);
                    format!("killed host pid {pid}")
                }
                Err(e) => {
                    tracing::warn!("not killed: {e}");
                    format!("not killed: {e}")
                }
            },
        )
    }

    /// What the process's own environment says (read once per process).
    fn own_env(&mut self, pid: u32) -> Option<OwnEnv> {
        if let Some(e) = self.envs.get(&pid) {
            return e.clone();
        }
        let env = read_environ(&self.procfs, pid);
        let own = env.map(|records| {
            let strs: Vec<&str> = records.iter().map(String::as_str).collect();
            let (limits, _) = Limits::from_env(strs.iter().copied());
            let region = expected::lookup(strs.iter().copied(), SHARED_CACHE)
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| SHARED_CACHE_DEFAULT.to_owned());
            let memory_var = strs
                .iter()
                .any(|r| r.starts_with(vgpu_common::env::MEMORY_LIMIT));
            OwnEnv {
                limits,
                region: PathBuf::from(region),
                memory_var,
            }
        });
        self.envs.insert(pid, own.clone());
        own
    }
}

/// `/proc/<pid>/environ` as records (capped; `None` if unreadable).
fn read_environ(procfs: &Procfs, pid: u32) -> Option<Vec<String>> {
    let f = std::fs::File::open(procfs.dir(pid).join("environ")).ok()?;
    let mut raw = Vec::new();
    f.take(MAX_ENVIRON).read_to_end(&mut raw).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|r| !r.is_empty())
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .collect(),
    )
}

/// A finding with the process and container fields filled.
fn base(kind: Kind, p: Option<&ProcInput<'_>>, id: &Identity, message: String) -> Finding {
    Finding {
        kind,
        pid: p.map_or(0, |p| p.pid),
        ns_pid: p.map_or(0, |p| p.ns_pid),
        comm: p.map(|p| p.comm.clone()).unwrap_or_default(),
        cgroup: id.cgroup.clone(),
        pod_uid: id.pod_uid.clone(),
        container_id: id.container_id.clone(),
        region: None,
        slot: None,
        untracked_bytes: 0,
        source: None,
        probe_bytes: p.and_then(|p| p.probe_bytes),
        nvml_bytes: None,
        tracked_data_bytes: 0,
        tracked_total_bytes: p.map_or(0, |p| p.tracked_bytes),
        since_unix_ms: 0,
        message,
        limits: Vec::new(),
        action: None,
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

fn show_mem(v: u64) -> String {
    if v == 0 {
        "none".to_owned()
    } else {
        bytes(v)
    }
}

fn show_sm(v: u64) -> String {
    if v == expected::SM_NONE {
        "none".to_owned()
    } else {
        format!("{v}%")
    }
}

/// `device 0 memory limit 64 GiB (expected 1 GiB)`, consecutive devices
/// with the same values as one range, the first few ranges.
fn describe(m: &[LimitMismatch]) -> String {
    const SHOWN: usize = 4;
    let mut runs: Vec<(LimitMismatch, usize)> = Vec::new();
    for x in m {
        match runs.last_mut() {
            Some((first, last))
                if first.limit == x.limit
                    && first.expected == x.expected
                    && first.found == x.found
                    && *last + 1 == x.device =>
            {
                *last = x.device;
            }
            _ => runs.push((*x, x.device)),
        }
    }
    let mut parts: Vec<String> = runs
        .iter()
        .take(SHOWN)
        .map(|(x, last)| {
            let devs = if *last == x.device {
                format!("device {}", x.device)
            } else {
                format!("devices {}-{last}", x.device)
            };
            let (what, found, expected) = match x.limit {
                LimitName::MemoryBytes => ("memory", show_mem(x.found), show_mem(x.expected)),
                LimitName::SmPercent => ("SM", show_sm(x.found), show_sm(x.expected)),
            };
            format!("{devs} {what} limit {found} (expected {expected})")
        })
        .collect();
    if runs.len() > SHOWN {
        parts.push(format!("{} more", runs.len() - SHOWN));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use vgpu_common::region::MAX_DEVICES;

    const G: u64 = 1 << 30;
    const CID: &str = "4f1b3c0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";

    /// Regions in memory.
    struct Fake(RefCell<HashMap<FileKey, Limits>>);

    impl RegionAccess for Fake {
        fn limits(&self, key: &FileKey) -> Option<(Limits, u64)> {
            self.0.borrow().get(key).map(|l| (*l, 1))
        }
        fn shown(&self, key: &FileKey) -> Option<PathBuf> {
            Some(PathBuf::from(format!("/r/{}", key.1)))
        }
        fn restore(&self, key: &FileKey, m: &[LimitMismatch]) -> usize {
            let mut map = self.0.borrow_mut();
            let Some(l) = map.get_mut(key) else { return 0 };
            for x in m {
                match x.limit {
                    LimitName::MemoryBytes => l.mem[x.device] = x.expected,
                    LimitName::SmPercent => l.sm[x.device] = x.expected,
                }
            }
            m.len()
        }
    }

    fn limits(mem: u64) -> Limits {
        Limits {
            mem: [mem; MAX_DEVICES],
            sm: [expected::SM_NONE; MAX_DEVICES],
        }
    }

    #[test]
    fn one_container_through_tampering_an_admin_change_and_excess() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // The container's region (a real file: admin records bind to it).
        std::fs::create_dir_all(d.join("ctr/r")).unwrap();
        std::fs::write(d.join("ctr/r/a.cache"), b"r").unwrap();
        let md = std::fs::metadata(d.join("ctr/r/a.cache")).unwrap();
        let key = (md.dev(), md.ino());
        // Its spec, and two processes in a fake /proc.
        let bundle = d.join("task/k8s.io").join(CID);
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(
            bundle.join("config.json"),
            r#"{"process":{"env":["CUDA_DEVICE_MEMORY_LIMIT=1g","CUDA_DEVICE_MEMORY_SHARED_CACHE=/r/a.cache"]}}"#,
        )
        .unwrap();
        for (pid, env) in [
            (
                10,
                "CUDA_DEVICE_MEMORY_LIMIT=1g\0CUDA_DEVICE_MEMORY_SHARED_CACHE=/r/a.cache\0",
            ),
            (11, "CUDA_DEVICE_MEMORY_SHARED_CACHE=/r/a.cache\0"),
        ] {
            let p = d.join("proc").join(pid.to_string());
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("environ"), env).unwrap();
            std::os::unix::fs::symlink(d.join("ctr"), p.join("root")).unwrap();
        }
        let state = d.join("state");
        let pattern = format!("{}/task/*/{{id}}/config.json", d.display());
        let mut integ = Integrity::new(
            Config {
                specs: vec![pattern.parse().unwrap()],
                state_dir: state.clone(),
                policy: Policy::Restore,
            },
            Procfs::at(d.join("proc")),
        );
        let id = Identity {
            cgroup: format!("/kubepods/pod0f9c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f/{CID}"),
            pod_uid: None,
            container_id: Some(CID.to_owned()),
        };
        let proc_in = |pid, probe| ProcInput {
            pid,
            ns_pid: 1,
            comm: "python".into(),
            identity: &id,
            region: Some(key),
            unhooked: false,
            probe_bytes: Some(probe),
            tracked_bytes: probe,
        };
        let regions = Fake(RefCell::new([(key, limits(G))].into_iter().collect()));
        let good = [proc_in(10, G / 2)];
        assert!(integ.scan(&good, &regions, 1).is_empty());

        // The tenant raises device 0: reported and written back.
        regions.0.borrow_mut().get_mut(&key).unwrap().mem[0] = 64 * G;
        let f = integ.scan(&good, &regions, 2);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, Kind::LimitTampered);
        assert_eq!(f[0].limits.len(), 1);
        assert_eq!(f[0].action.as_deref(), Some("restored"));
        assert_eq!(f[0].since_unix_ms, 2);
        assert_eq!(regions.limits(&key).unwrap().0.mem[0], G);
        assert!(integ.scan(&good, &regions, 3).is_empty(), "cleared");

        // An admin raises it: recorded, so not a finding and not undone.
        overrides::record(
            &state,
            &d.join("ctr/r/a.cache"),
            key,
            overrides::Changed::Memory,
            &[0],
            2 * G,
        )
        .unwrap();
        regions.0.borrow_mut().get_mut(&key).unwrap().mem[0] = 2 * G;
        assert!(integ.scan(&good, &regions, 4).is_empty());
        assert_eq!(regions.limits(&key).unwrap().0.mem[0], 2 * G);

        // A process without the variable: reported, not killed (restore).
        let both = [proc_in(10, G / 2), proc_in(11, 0)];
        let f = integ.scan(&both, &regions, 5);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!((f[0].kind, f[0].pid), (Kind::UnlimitedProcess, 11));
        assert_eq!(f[0].action, None);

        // Past the limit by the kernel's count (the admin's 2 GiB on
        // device 0 of one), for two scans.
        let heavy = [proc_in(10, 2 * G + 1)];
        assert!(integ.scan(&heavy, &regions, 6).is_empty());
        let f = integ.scan(&heavy, &regions, 7);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!((f[0].kind, f[0].pid), (Kind::OverLimit, 0));
        let fine = [proc_in(10, 2 * G)];
        assert!(integ.scan(&fine, &regions, 8).is_empty());

        // A container without a spec is not checked.
        let other = Identity {
            container_id: Some(CID.replace('4', "5")),
            ..id.clone()
        };
        let mut p = proc_in(11, 64 * G);
        p.identity = &other;
        assert!(integ.scan(&[p], &regions, 9).is_empty());
    }

    #[test]
    fn mismatches_read_as_ranges() {
        let m = |device, limit, expected, found| LimitMismatch {
            device,
            limit,
            expected,
            found,
        };
        let mut all: Vec<LimitMismatch> = (0..16)
            .map(|d| m(d, LimitName::MemoryBytes, 1 << 30, 0))
            .collect();
        all.push(m(3, LimitName::SmPercent, 30, 100));
        assert_eq!(
            describe(&all),
            "devices 0-15 memory limit none (expected 1 GiB), device 3 SM limit none (expected 30%)"
        );
        assert_eq!(
            describe(&[m(0, LimitName::MemoryBytes, 1 << 30, 64 << 30)]),
            "device 0 memory limit 64 GiB (expected 1 GiB)"
        );
    }
}
