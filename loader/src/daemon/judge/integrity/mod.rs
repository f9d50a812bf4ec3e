//! Limit integrity: the daemon knows what each container's limits should
//! be and reports, every scan, what differs, then applies the policy.
//!
//! - [`spec`] reads the container's OCI runtime spec (the environment the
//!   device plugin gave it, which the container cannot change);
//! - [`expected`] turns it into limits, as the hook parses them;
//! - [`overrides`] keeps admins' runtime changes (`vgpu set-*-limit`);
//! - [`decide`] holds the pure decisions, [`enforce`] the actions;
//! - `checks` runs them per container and `usage` judges what it uses of
//!   each GPU, `environ` reads a process's own limits, `report` words the
//!   findings, `access` reads the daemon's open regions.
//!
//! Findings: `limit_tampered` (a region's limits differ), `unlimited_process`
//! (a process's own limit variables are unset or looser, or it runs without
//! the hook), `private_region` (it names another region) and `over_limit`
//! (the container uses more of a GPU than its spec gives it there, by the
//! driver's and the kernel's count, whatever its region says). See the
//! "Limit integrity" section of docs/daemon.md.

mod access;
mod checks;
pub mod decide;
pub mod enforce;
mod environ;
pub mod expected;
pub mod overrides;
mod report;
pub mod spec;
#[cfg(test)]
mod tests;
mod usage;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use self::decide::Policy;
use self::expected::{Expected, Limits};
use self::overrides::FileKey;
use self::report::{short, show_mem};
use self::spec::SpecPattern;
use crate::daemon::collect::container_identity::ContainerIdentity;
use crate::daemon::collect::nvml::DeviceSample;
use crate::daemon::collect::procfs::Procfs;
use crate::daemon::state::findings::{Finding, Kind, LimitMismatch};

/// A spec that was not found is looked for again after this long.
const SPEC_RETRY: Duration = Duration::from_secs(5);
/// A container not seen for this long is forgotten.
const SPEC_IDLE: Duration = Duration::from_secs(120);
/// Scans a container must stay past its limit by the probes' count alone
/// to be `over_limit` (the driver's count per GPU needs one).
const OVER_SCANS: u32 = 2;

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
    pub identity: &'a ContainerIdentity,
    /// The region it names, open in the daemon (whether or not its slot
    /// was found there).
    pub region: Option<FileKey>,
    /// No slot after the grace period: the hook does not account it.
    pub unhooked: bool,
    /// Bytes the kernel saw it allocate minus free.
    pub probe_bytes: Option<u64>,
    /// Bytes the driver says it uses (NVML, by host PID; context included).
    pub nvml_bytes: Option<u64>,
    /// Bytes its slot accounts.
    pub tracked_bytes: u64,
}

/// What a region holds, and writing limits back.
pub trait RegionAccess {
    /// The region's limits (normalised as the hook stores them), if it is
    /// open and initialised.
    fn limits(&self, key: &FileKey) -> Option<Limits>;
    /// The path to report.
    fn shown(&self, key: &FileKey) -> Option<PathBuf>;
    /// Writes the expected values of `m` back (see [`enforce::restore`]).
    fn restore(&self, key: &FileKey, m: &[LimitMismatch]) -> usize;
}

#[derive(Debug)]
struct SpecEntry {
    expected: Option<Expected>,
    /// The spec opts the container out of the hook (HAMi's whole-GPU
    /// mode, [`expected::disables_control`]): nothing is expected of it.
    uncontrolled: bool,
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
    /// SM use per (container, NVML index of the GPU).
    sm: HashMap<(String, u32), decide::SmWindow>,
    /// Processes a kill was tried on (one try each), and how it went.
    tried: HashMap<u32, String>,
    /// Admin records already warned about.
    bad_records: HashSet<FileKey>,
    /// Findings of this scan that an action ended (a restored limit): the
    /// next scan finding them again is a new violation.
    ended: HashSet<(Kind, Subject)>,
    /// Those the last scan ended: found again at once, the tenant rewrites
    /// continuously, which is logged at `info` (the first one warned).
    undone: HashSet<(Kind, Subject)>,
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
            sm: HashMap::new(),
            tried: HashMap::new(),
            bad_records: HashSet::new(),
            ended: HashSet::new(),
            undone: HashSet::new(),
        }
    }

    /// One scan over the observer's processes: findings, and the policy's
    /// actions. `gpus`: this scan's NVML sample of each GPU of the node
    /// (empty without NVML).
    pub fn scan(
        &mut self,
        procs: &[ProcInput<'_>],
        regions: &impl RegionAccess,
        gpus: &[DeviceSample],
        now_ms: u64,
    ) -> Vec<Finding> {
        let live: HashSet<u32> = procs.iter().map(|p| p.pid).collect();
        self.envs.retain(|pid, _| live.contains(pid));
        self.tried.retain(|pid, _| live.contains(pid));
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
            self.check_usage(&exp, id, members, regions, gpus, &mut out);
        }
        let now = Instant::now();
        self.specs
            .retain(|_, e| now.duration_since(e.used_at) < SPEC_IDLE);
        self.over.retain(|c, _| by_ctr.contains_key(c));
        self.sm.retain(|(c, _), _| by_ctr.contains_key(c));
        self.publish(out, now_ms)
    }

    /// Start times, and a log line for each finding that is new or cleared.
    fn publish(&mut self, found: Vec<(Subject, Finding)>, now_ms: u64) -> Vec<Finding> {
        let mut keys = HashSet::new();
        let mut out = Vec::with_capacity(found.len());
        for (subject, mut f) in found {
            let key = (f.kind, subject);
            let since = *self.since.entry(key.clone()).or_insert(now_ms);
            if since == now_ms && self.undone.contains(&key) {
                tracing::info!("{}", f.message);
            } else if since == now_ms {
                tracing::warn!("{}", f.message);
            }
            f.since_unix_ms = since;
            keys.insert(key);
            out.push(f);
        }
        let ended = std::mem::take(&mut self.ended);
        self.undone.clone_from(&ended);
        self.since.retain(|k, _| {
            if ended.contains(k) {
                return false;
            }
            let keep = keys.contains(k);
            if !keep {
                tracing::info!("finding {} for {:?} cleared", k.0.name(), k.1);
            }
            keep
        });
        out
    }

    /// The container's expected limits and where they came from; `None`
    /// when it has none (no spec, a spec without limits, or one that opts
    /// out of the hook).
    fn expected(&mut self, id: &str) -> Option<(Expected, PathBuf)> {
        let e = self.entry(id);
        Some((e.expected.clone()?, e.source.clone()?))
    }

    /// Whether container `id`'s spec opts it out of the hook (HAMi's
    /// whole-GPU mode): its processes run unhooked by design, and are
    /// neither `no_region` nor judged against limits.
    pub fn uncontrolled(&mut self, id: &str) -> bool {
        self.entry(id).uncontrolled
    }

    /// Container `id`'s spec, read (again, while none was found) as due.
    fn entry(&mut self, id: &str) -> &mut SpecEntry {
        let now = Instant::now();
        let stale = self.specs.get(id).is_none_or(|e| {
            e.expected.is_none()
                && e.source.is_none()
                && now.duration_since(e.read_at) >= SPEC_RETRY
        });
        if stale {
            // Say what is wrong with a spec once, not at every retry.
            let first = !self.specs.contains_key(id);
            let (expected, source, uncontrolled) = match spec::find(&self.cfg.specs, id) {
                Ok(Some((path, env))) if expected::disables_control(&env) => {
                    tracing::info!(
                        "container {}: {}=true in {}: no hook by the device plugin's design; \
                         its processes are shown, not judged",
                        short(id),
                        expected::DISABLE_CONTROL,
                        path.display()
                    );
                    (None, Some(path), true)
                }
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
                    (e, Some(path), false)
                }
                Ok(None) => (None, None, false),
                Err(err) => {
                    if first {
                        tracing::warn!("container {}: {err}", short(id));
                    }
                    (None, None, false)
                }
            };
            self.specs.insert(
                id.to_owned(),
                SpecEntry {
                    expected,
                    uncontrolled,
                    source,
                    read_at: now,
                    used_at: now,
                },
            );
        }
        let e = self
            .specs
            .entry(id.to_owned())
            .or_insert_with(|| SpecEntry {
                expected: None,
                uncontrolled: false,
                source: None,
                read_at: now,
                used_at: now,
            });
        e.used_at = now;
        e
    }

    /// The limits of region `key` for a container expecting `exp`, with
    /// admins' changes when the region differs from the spec.
    fn effective(&mut self, exp: &Expected, key: &FileKey, found: &Limits) -> Limits {
        if decide::mismatches(&exp.limits, found).is_empty() {
            return exp.limits;
        }
        match overrides::load(&self.cfg.state_dir, *key) {
            Ok(Some(o)) => exp.with_overrides(&o),
            Ok(None) => exp.limits,
            Err(e) => {
                if self.bad_records.insert(*key) {
                    tracing::warn!("{e}");
                }
                exp.limits
            }
        }
    }
}
