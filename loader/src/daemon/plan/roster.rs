//! The containers to plan for, as one scan knows them.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_common::env::TASK_PRIORITY;
use vgpu_common::node::rank_of;
use vgpu_common::region::rules::{sm_limit, SmLimit};
use vgpu_common::region::MAX_DEVICES;
use vgpu_common::sidecar;

use crate::daemon::collect::nvml::Sample;
use crate::daemon::collect::procfs::Procfs;
use crate::daemon::judge::integrity::expected::{lookup, Limits};
use crate::daemon::judge::integrity::spec::{self, SpecPattern};
use crate::regions::open::{open_file, open_file_in_process, Access};

/// HAMi's priority for a container whose spec states none (the lowest).
const DEFAULT_PRIORITY: i32 = 1;
/// A container's spec is read again after this long.
const SPEC_TTL: Duration = Duration::from_secs(30);

/// One container, as the planner needs it.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Orders its turns; from its container id.
    pub key: u64,
    /// Its container id.
    pub id: String,
    /// Its sidecar, open for the plan's `pwrite`s and the `pread`s of its
    /// own statement.
    pub sidecar: Arc<File>,
    /// (CUDA ordinal in the container, GPU UUID), as its region lists them.
    pub gpus: Vec<(usize, String)>,
    /// Its SM limit per ordinal, from its spec.
    pub limits: [Option<SmLimit>; MAX_DEVICES],
    /// Its priority's rank, from its spec.
    pub rank: u32,
    /// Its host PIDs the daemon tracks.
    pub pids: Vec<u32>,
}

/// What one scan hands the planner.
#[derive(Debug, Clone, Default)]
pub struct Roster {
    pub tenants: Vec<Tenant>,
    /// GPU UUID -> the host PIDs the kernel's view says put work on it since
    /// the scan before: NVML attributed it SM time, or the driver accepted
    /// its launches (a watched process, `witness`) and it uses no other GPU.
    pub used: HashMap<String, HashSet<u32>>,
    /// When NVML was sampled (`None`: no sample).
    pub sampled: Option<Instant>,
}

/// Whether `t` has an SM limit on its CUDA ordinal `i`.
fn limited(t: &Tenant, i: usize) -> bool {
    t.limits.get(i).is_some_and(Option::is_some)
}

impl Roster {
    /// The host PIDs of the containers whose statement can hold back or
    /// shorten a neighbour's turn: ranked above another on a GPU they
    /// share, or SM-limited there beside another limited one (turns).
    pub fn watched(&self) -> HashSet<u32> {
        let mut out = HashSet::new();
        for t in &self.tenants {
            let binds = t.gpus.iter().any(|(i, u)| {
                self.tenants.iter().filter(|o| o.key != t.key).any(|o| {
                    o.gpus.iter().any(|(j, v)| {
                        u == v && (o.rank > t.rank || (limited(t, *i) && limited(o, *j)))
                    })
                })
            });
            if binds {
                out.extend(&t.pids);
            }
        }
        out
    }

    /// Adds the processes whose launches the driver accepted (`launched`)
    /// to `used`, on their container's one GPU, or else on the one GPU
    /// NVML lists them on: a launch says nothing about which GPU of
    /// several it went to.
    pub fn add_launched(&mut self, launched: &HashSet<u32>, nv: Option<&Sample>) {
        for t in &self.tenants {
            for &pid in t.pids.iter().filter(|p| launched.contains(p)) {
                let uuid = match t.gpus.as_slice() {
                    [(_, u)] => Some(u.clone()),
                    _ => nv.and_then(|s| {
                        let mut on = s
                            .devices
                            .iter()
                            .filter(|d| d.process_memory.contains_key(&pid));
                        match (on.next(), on.next()) {
                            (Some(d), None) => Some(d.uuid.clone()),
                            _ => None,
                        }
                    }),
                };
                if let Some(u) = uuid {
                    self.used.entry(u).or_default().insert(pid);
                }
            }
        }
    }
}

/// A process of a container, with the region it holds a slot in.
#[derive(Debug, Clone)]
pub struct Member<'a> {
    pub pid: u32,
    pub container_id: &'a str,
    /// The region as the process names it, or its host path.
    pub region: &'a Path,
    /// `region` is a host path (found under HAMi's containers directory).
    pub on_host: bool,
    /// The region's GPU UUIDs by ordinal (empty: none set).
    pub uuids: Vec<String>,
}

/// What a spec says, kept for `SPEC_TTL`.
#[derive(Debug, Clone)]
struct SpecView {
    /// The SM limit per ordinal.
    limits: [Option<SmLimit>; MAX_DEVICES],
    rank: u32,
    read_at: Instant,
}

/// Builds rosters, reading specs once in a while.
pub struct RosterBuilder {
    specs: Vec<SpecPattern>,
    procfs: Procfs,
    seen: HashMap<String, SpecView>,
    /// Sidecars already warned about.
    warned: HashSet<PathBuf>,
}

impl RosterBuilder {
    pub fn new(specs: Vec<SpecPattern>, procfs: Procfs) -> Self {
        Self {
            specs,
            procfs,
            seen: HashMap::new(),
            warned: HashSet::new(),
        }
    }

    /// The roster of `members` (every tracked process with a slot), with
    /// NVML's sample `nv`. A container without a spec is left out: nothing
    /// unforgeable says its limit or priority.
    pub fn build(&mut self, members: &[Member<'_>], nv: Option<&Sample>) -> Roster {
        let mut by: HashMap<(&str, &Path), Tenant> = HashMap::new();
        for m in members {
            if let Some(t) = by.get_mut(&(m.container_id, m.region)) {
                t.pids.push(m.pid);
                continue;
            }
            let Some(spec) = self.spec(m.container_id) else {
                continue;
            };
            let Some(file) = self.sidecar(m) else {
                continue;
            };
            let gpus = m
                .uuids
                .iter()
                .enumerate()
                .filter(|(_, u)| !u.is_empty())
                .map(|(i, u)| (i, u.clone()))
                .collect();
            by.insert(
                (m.container_id, m.region),
                Tenant {
                    key: key_of(m.container_id, m.region),
                    id: m.container_id.to_owned(),
                    sidecar: Arc::new(file),
                    gpus,
                    limits: spec.limits,
                    rank: spec.rank,
                    pids: vec![m.pid],
                },
            );
        }
        let now = Instant::now();
        self.seen
            .retain(|_, v| now.duration_since(v.read_at) < SPEC_TTL * 4);
        let mut tenants: Vec<Tenant> = by.into_values().collect();
        tenants.sort_by_key(|t| t.key);
        let used = nv
            .iter()
            .flat_map(|s| &s.devices)
            .map(|d| {
                let busy = d.process_util.as_ref().map_or_else(HashSet::new, |u| {
                    u.iter()
                        .filter(|(_, &p)| p > 0)
                        .map(|(&pid, _)| pid)
                        .collect()
                });
                (d.uuid.clone(), busy)
            })
            .collect();
        Roster {
            tenants,
            used,
            sampled: nv.map(|_| now),
        }
    }

    fn spec(&mut self, id: &str) -> Option<SpecView> {
        let now = Instant::now();
        let fresh = self
            .seen
            .get(id)
            .is_some_and(|v| now.duration_since(v.read_at) < SPEC_TTL);
        if !fresh {
            let view = match spec::find(&self.specs, id) {
                Ok(Some((_, env))) => {
                    let records = env.iter().map(String::as_str);
                    let (limits, _) = Limits::from_env(records.clone());
                    let priority = lookup(records, TASK_PRIORITY)
                        .and_then(|v| v.trim().parse::<i32>().ok())
                        .unwrap_or(DEFAULT_PRIORITY);
                    Some(SpecView {
                        limits: limits.sm.map(sm_limit),
                        rank: rank_of(priority),
                        read_at: now,
                    })
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!("container {id}: {e}");
                    None
                }
            };
            match view {
                Some(v) => {
                    self.seen.insert(id.to_owned(), v);
                }
                None => {
                    self.seen.remove(id);
                }
            }
        }
        self.seen.get(id).cloned()
    }

    /// The sidecar of `m`'s region, read-write, opened inside `m`'s root
    /// (or on the host) without following a link, refused unless a regular
    /// file.
    fn sidecar(&mut self, m: &Member<'_>) -> Option<File> {
        let path = sidecar::path_for(m.region);
        let opened = if m.on_host {
            open_file(&path, Access::ReadWrite)
        } else {
            open_file_in_process(&self.procfs.dir(m.pid), &path, Access::ReadWrite)
        };
        match opened {
            Ok(f) => {
                self.warned.remove(&path);
                Some(f)
            }
            Err(e) => {
                if self.warned.insert(path) {
                    tracing::debug!("container {}: {e}; not planned", m.container_id);
                }
                None
            }
        }
    }
}

/// A container's key among the seats of a GPU.
fn key_of(id: &str, region: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    region.hash(&mut h);
    h.finish() | 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::collect::nvml::DeviceSample;

    fn tenant(key: u64, gpus: &[&str], limit: Option<u64>, priority: i32, pid: u32) -> Tenant {
        let mut limits = [None; MAX_DEVICES];
        for l in limits.iter_mut().take(gpus.len()) {
            *l = limit.and_then(sm_limit);
        }
        Tenant {
            key,
            id: format!("c{key}"),
            sidecar: Arc::new(File::open("/dev/null").expect("/dev/null")),
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(i, u)| (i, (*u).to_owned()))
                .collect(),
            limits,
            rank: rank_of(priority),
            pids: vec![pid],
        }
    }

    fn roster(tenants: Vec<Tenant>) -> Roster {
        Roster {
            tenants,
            ..Roster::default()
        }
    }

    #[test]
    fn watched_are_those_whose_statement_binds_a_neighbour() {
        // A priority-0 service beside a default-priority trainer: the
        // service can hold the trainer; the trainer holds nobody.
        let r = roster(vec![
            tenant(1, &["A"], None, 0, 10),
            tenant(2, &["A"], None, 1, 20),
        ]);
        assert_eq!(r.watched(), HashSet::from([10]));
        // Two limited containers take turns: both; an unlimited one beside
        // them, of the same priority, binds nobody.
        let r = roster(vec![
            tenant(1, &["A"], Some(30), 1, 10),
            tenant(2, &["A"], Some(70), 1, 20),
            tenant(3, &["A"], None, 1, 30),
        ]);
        assert_eq!(r.watched(), HashSet::from([10, 20]));
        // On different GPUs nothing binds.
        let r = roster(vec![
            tenant(1, &["A"], Some(30), 0, 10),
            tenant(2, &["B"], Some(70), 1, 20),
        ]);
        assert!(r.watched().is_empty());
    }

    fn device(uuid: &str, pids: &[u32]) -> DeviceSample {
        DeviceSample {
            uuid: uuid.to_owned(),
            process_memory: pids.iter().map(|&p| (p, 1 << 20)).collect(),
            ..DeviceSample::default()
        }
    }

    #[test]
    fn a_launch_counts_on_the_one_gpu_it_can_have_gone_to() {
        let mut r = roster(vec![
            tenant(1, &["A"], None, 0, 10),
            tenant(2, &["A", "B"], None, 0, 20),
            tenant(3, &["A", "B"], None, 0, 30),
        ]);
        let nv = Sample {
            devices: vec![device("A", &[10, 20, 30]), device("B", &[30])],
            processes: HashMap::new(),
        };
        r.add_launched(&HashSet::from([10, 20, 30]), Some(&nv));
        // 10: its container's one GPU. 20: two GPUs, NVML lists it on A
        // only. 30: listed on both, so on neither.
        assert_eq!(r.used.get("A"), Some(&HashSet::from([10, 20])));
        assert_eq!(r.used.get("B"), None);
    }
}
