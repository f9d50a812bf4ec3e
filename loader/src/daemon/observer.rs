//! The daemon's state and its two periodic jobs: [`Observer::poll`] (fast:
//! learn processes from the probes, fill host PIDs, forget the dead) and
//! [`Observer::scan`] (the cross-check, findings and metrics).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use vgpu_common::event::{Caller, Func, FuncClass, ProcCounters};
use vgpu_common::region::MAX_DEVICES;

use crate::daemon::apply;
use crate::daemon::collect::container_identity::{ContainerIdentities, ContainerIdentity};
use crate::daemon::collect::libs::LibWatch;
use crate::daemon::collect::nvml::{DeviceSample, NvmlView, Sample};
use crate::daemon::collect::pods::PodNames;
use crate::daemon::collect::procfs::{ProcIdentity, Procfs};
use crate::daemon::collect::region_cache::{RegionCache, RegionKey};
use crate::daemon::collect::root_regions::RootRegions;
use crate::daemon::judge::check::{excess, Observation, Streaks, Thresholds};
use crate::daemon::judge::hostpid::{self, Miss, SlotRef};
use crate::daemon::judge::integrity::{self, Integrity, ProcInput};
use crate::daemon::judge::launches::Ledger;
use crate::daemon::judge::reclaim::Reclaimer;
use crate::daemon::judge::utilization::{self, SlotProc, Utilization};
use crate::daemon::plan::planner::Handle as PlanHandle;
use crate::daemon::plan::roster::{Member, RosterBuilder};
use crate::daemon::plan::witness::LaunchWitness;
use crate::daemon::publish::exposition::Exposition;
use crate::daemon::publish::metrics;
use crate::daemon::publish::region_view;
use crate::daemon::publish::snapshot::{self, Counters, Snapshot};
use crate::daemon::state::findings::{self, Finding, Kind, Subject};
use crate::daemon::state::retention::Retention;
use crate::host_pidns::NotHost;
use crate::probes::{ProbeError, ProbeSet};

/// The region pass (every open region re-read, dead slots judged and
/// freed, `/metrics` rendered) runs at most this often while the set of
/// regions and findings stays the same, so values lag by at most this
/// much; a region or finding that comes or goes starts one at the next
/// scan. The regions of processes the daemon tracks are re-read at every
/// scan: the cross-check and the integrity checks judge them. Reading and
/// rendering thousands of regions is most of the daemon's work.
pub const RENDER_EVERY: Duration = Duration::from_secs(1);

/// Entry points the daemon probes: driver init, context creation, every
/// allocation and free. Never a launch (a uprobe there taxes every launch).
pub fn daemon_funcs() -> Vec<Func> {
    Func::CONTEXT
        .into_iter()
        .chain(
            Func::ALL
                .into_iter()
                .filter(|f| matches!(f.class(), FuncClass::Alloc | FuncClass::Free)),
        )
        .collect()
}

/// What `vgpu daemon` was told to observe and how (its flags).
#[derive(Clone, Debug)]
pub struct ObserverSettings {
    pub thresholds: Thresholds,
    /// How long a process may run without a slot before it is `no_region`.
    pub slot_grace: Duration,
    /// The roots of container directories to scan for regions (HAMi's,
    /// Volcano's; each skipped while absent).
    pub regions_roots: Vec<PathBuf>,
    /// The kubelet's pod log directory, which names pods by UID.
    pub pods_log_dir: PathBuf,
    /// This node's name, a label of the host GPU series (empty: none).
    pub node: String,
    /// Also export HAMi 2.5–2.8's series (`crate::daemon::publish::legacy_metrics`).
    pub legacy_metrics: bool,
    /// Limit integrity checks (`None`: off).
    pub integrity: Option<integrity::Config>,
    /// Whether this process sees host PIDs; if not, no slot is freed.
    pub host_pids: Result<(), NotHost>,
    /// How long a resolved finding stays published.
    pub findings_retention: Duration,
    /// Where the planner takes each scan's roster (`None`: no plans; the
    /// containers keep to their own SM limits).
    pub planner: Option<PlanHandle>,
}

/// One process the daemon knows.
#[derive(Debug)]
struct Proc {
    caller: Caller,
    identity: Option<ContainerIdentity>,
    first_seen: Instant,
    counts: ProcCounters,
    /// Seen in NVML's list but never in the probed libcuda.
    nvml_only: bool,
    slot: Option<SlotRef>,
    miss: Option<Miss>,
    /// What its slot must record (read from `/proc` once).
    me: Option<ProcIdentity>,
}

impl Proc {
    /// The region it names, open in the cache: its slot's, or the one
    /// where its slot was not found (past the slots the daemon reads).
    fn region(&self) -> Option<RegionKey> {
        self.slot
            .map(|at| at.region)
            .or_else(|| self.miss.as_ref()?.region())
    }

    fn new(caller: Caller, nvml_only: bool) -> Self {
        Self {
            caller,
            identity: None,
            first_seen: Instant::now(),
            counts: ProcCounters::default(),
            nvml_only,
            slot: None,
            miss: None,
            me: None,
        }
    }
}

/// What one scan publishes.
#[derive(Debug)]
pub struct ScanOutput {
    /// The `/metrics` text: shared with the previous scan's when it was
    /// not rendered anew (see [`RENDER_EVERY`]).
    pub metrics: Exposition,
    pub findings_json: String,
    pub findings: usize,
    /// [`crate::daemon::judge::utilization::State`] as JSON.
    pub utilization_json: String,
}

/// The daemon.
pub struct Observer {
    settings: ObserverSettings,
    probes: ProbeSet,
    libs: LibWatch,
    procfs: Procfs,
    cache: RegionCache,
    ids: ContainerIdentities,
    pods: PodNames,
    nvml: Option<NvmlView>,
    procs: HashMap<u32, Proc>,
    streaks: Streaks<u32>,
    since: HashMap<(u32, Kind), u64>,
    counters: Counters,
    lost_seen: HashMap<&'static str, u64>,
    attached: Vec<(String, String)>,
    integrity: Option<Integrity>,
    /// The regions found by listing each regions root, in the order of
    /// `regions_roots`.
    roots: Vec<RootRegions>,
    /// This scan's processes of containers whose spec opts out of the hook:
    /// identity, host PID, device memory (the larger of NVML's and the
    /// probes' count).
    uncontrolled: Vec<(ContainerIdentity, u32, u64)>,
    /// How long the last scan and its render took.
    last_timing: snapshot::ScanTiming,
    /// The last render: when, what it showed (a fingerprint of the regions
    /// and findings), the text.
    rendered: Option<(Instant, u64, Exposition)>,
    /// [`ScanOutput::utilization_json`] of the last region pass.
    utilization_json: String,
    reclaimer: Reclaimer,
    launches: Ledger,
    retention: Retention,
    dead_slots: region_view::DeadSlots,
    /// The roster's builder and where it goes (`ObserverSettings::planner`).
    roster: Option<(RosterBuilder, PlanHandle, LaunchWitness)>,
}

impl Observer {
    pub fn new(
        settings: ObserverSettings,
        probes: ProbeSet,
        libs: LibWatch,
        nvml: Option<NvmlView>,
    ) -> Self {
        let integrity = settings
            .integrity
            .clone()
            .map(|c| Integrity::new(c, Procfs::default()));
        let counters = Counters::default();
        let retention = Retention::new(settings.findings_retention, counters.violations.clone());
        let reclaimer = Reclaimer::new(settings.host_pids.clone());
        let roster = settings.planner.clone().map(|h| {
            let specs = settings.integrity.as_ref().map(|c| c.specs.clone());
            (
                RosterBuilder::new(specs.unwrap_or_default(), Procfs::default()),
                h,
                LaunchWitness::default(),
            )
        });
        let roots = settings
            .regions_roots
            .iter()
            .map(|_| RootRegions::default())
            .collect();
        Self {
            roster,
            pods: PodNames::new(settings.pods_log_dir.clone()),
            settings,
            probes,
            libs,
            procfs: Procfs::default(),
            cache: RegionCache::default(),
            ids: ContainerIdentities::default(),
            nvml,
            procs: HashMap::new(),
            streaks: Streaks::default(),
            since: HashMap::new(),
            counters,
            lost_seen: HashMap::new(),
            attached: Vec::new(),
            integrity,
            roots,
            uncontrolled: Vec::new(),
            last_timing: snapshot::ScanTiming::default(),
            rendered: None,
            utilization_json: String::new(),
            reclaimer,
            launches: Ledger::default(),
            dead_slots: region_view::DeadSlots::default(),
            retention,
        }
    }

    /// Keeps the record a previous daemon published (see
    /// [`Retention::carry_over`]).
    pub fn carry_over_findings(&mut self, earlier: Vec<Finding>, written_ms: u64) {
        self.retention
            .carry_over(earlier, written_ms, findings::now_ms());
    }

    /// Libraries with probes attached so far.
    pub fn attached_libs(&self) -> usize {
        let mut libs: Vec<&String> = self.attached.iter().map(|(_, l)| l).collect();
        libs.dedup();
        libs.len()
    }

    /// Attaches to libcuda files not seen before; returns how many.
    pub fn attach_new_libs(&mut self) -> Result<usize, ProbeError> {
        let found = self.libs.scan()?;
        let funcs = daemon_funcs();
        let mut n = 0;
        for lib in found {
            let rep = match self.probes.attach(&lib, &funcs) {
                Ok(r) => r,
                // A container's file may vanish or be unreadable: skip it.
                Err(ProbeError::Libcuda(e)) => {
                    tracing::info!("skipping {}: {e}", lib.path.display());
                    continue;
                }
                Err(e) => return Err(e),
            };
            if rep.already {
                continue;
            }
            let path = lib.path.display().to_string();
            tracing::info!(
                "probing {} (inode {}): {}",
                path,
                lib.ino,
                rep.attached
                    .iter()
                    .map(|f| f.symbol())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            for f in &rep.attached {
                self.attached.push((f.symbol().to_owned(), path.clone()));
            }
            n += 1;
        }
        Ok(n)
    }

    /// Fast job: new processes from the probe maps, host-PID fills and
    /// re-checks, forgetting the dead.
    pub fn poll(&mut self) -> Result<(), ProbeError> {
        self.probes.flush_diagnostics();
        // Host PIDs name other processes here (or none): nothing to track,
        // and "gone" proves nothing.
        if self.settings.host_pids.is_err() {
            return Ok(());
        }
        for (caller, counts) in self.probes.procs()? {
            let tgid = caller.host_tgid;
            let p = self
                .procs
                .entry(tgid)
                .or_insert_with(|| Proc::new(caller, false));
            if p.nvml_only {
                p.nvml_only = false;
                p.caller = caller;
            }
            self.counters.count_probe_events(&p.counts, &counts);
            p.counts = counts;
        }
        let mut dead = Vec::new();
        for (&tgid, p) in &mut self.procs {
            if !self.procfs.alive(tgid) {
                dead.push(tgid);
                continue;
            }
            if p.identity.is_none() {
                p.identity = Some(self.ids.of_process(&self.procfs, tgid, p.caller.cgroup_id));
            }
            let procfs = &self.procfs;
            let me = *p.me.get_or_insert_with(|| {
                let ns_pid = match p.caller.ns_tgid {
                    0 => procfs.ns_pid(tgid).unwrap_or(tgid),
                    n => n,
                };
                procfs.identity(tgid, ns_pid)
            });
            if let Some(at) = p.slot {
                match hostpid::refresh(&self.cache, at, &me, tgid) {
                    Some(true) => {
                        self.counters.hostpid_fills.inc();
                    }
                    Some(false) => {}
                    None => p.slot = None,
                }
                if p.slot.is_some() {
                    continue;
                }
            }
            match hostpid::fill(&self.procfs, &mut self.cache, tgid, &me, p.caller.cgroup_id) {
                Ok(f) => {
                    if f.wrote {
                        self.counters.hostpid_fills.inc();
                    } else {
                        self.counters.hostpid_verified.inc();
                    }
                    tracing::debug!(
                        "host pid {tgid} (pid {}) in slot {} after {:?}",
                        me.pid,
                        f.at.slot,
                        p.first_seen.elapsed()
                    );
                    p.slot = Some(f.at);
                    p.miss = None;
                }
                Err(m) => p.miss = Some(m),
            }
        }
        for tgid in dead {
            self.procs.remove(&tgid);
            if let Err(e) = self.probes.forget(tgid) {
                tracing::debug!("forgetting {tgid}: {e}");
            }
        }
        let procs = &self.procs;
        self.streaks.retain(|k| procs.contains_key(k));
        self.since.retain(|(pid, _), _| procs.contains_key(pid));
        Ok(())
    }

    /// Slow job, in three stages: collect (the judged processes' regions,
    /// NVML, the probes' counters), judge (the cross-check, limit
    /// integrity, the planner's roster), publish (findings; at most once a second
    /// the region pass: every region, dead slots, metrics, utilization).
    pub fn scan(&mut self) -> ScanOutput {
        let started = Instant::now();
        let nv = self.collect();
        let now_ms = findings::now_ms();
        let mut out = self.judge_processes(nv.as_ref(), now_ms);
        let untracked = untracked_by_container(&out);
        out.extend(self.check_and_restore_limits(nv.as_ref(), now_ms));
        self.publish_roster(nv.as_ref());
        self.publish(started, now_ms, nv, untracked, out)
    }

    /// Collect: re-lists the regions root when due, re-reads the regions of
    /// the processes it judges, samples NVML (adopting the processes only
    /// it lists) and counts the probes' lost events.
    fn collect(&mut self) -> Option<Sample> {
        let started = Instant::now();
        for (root, found) in self.settings.regions_roots.iter().zip(&mut self.roots) {
            found.collect(root, &mut self.cache, started);
        }
        // What the cross-check and the integrity checks read now; every
        // other region waits for the region pass.
        let judged: Vec<RegionKey> = self.procs.values().filter_map(Proc::region).collect();
        self.cache.refresh_only(&judged);
        let nv = self.nvml.as_mut().map(NvmlView::sample);
        self.adopt_nvml_processes(nv.as_ref());
        self.count_lost();
        nv
    }

    /// Judge: the cross-check of every tracked process (untracked
    /// allocations, processes without a region), sorted, logging what is
    /// new and what cleared.
    fn judge_processes(&mut self, nv: Option<&Sample>, now_ms: u64) -> Vec<Finding> {
        let mut out = Vec::new();
        self.uncontrolled.clear();
        for (&tgid, p) in &self.procs {
            if let Some(key) = p.region() {
                self.cache.touch(&key);
            }
            let obs = self.observe(tgid, p, nv);
            let (kind, ex) = match p.slot {
                Some(_) => {
                    let e = self.streaks.update(
                        &tgid,
                        excess(&obs, &self.settings.thresholds),
                        &self.settings.thresholds,
                    );
                    match e {
                        Some(e) => (Kind::UntrackedAllocation, Some(e)),
                        None => continue,
                    }
                }
                None if p.first_seen.elapsed() >= self.settings.slot_grace => {
                    let id = p.identity.as_ref().and_then(|i| i.container_id.as_deref());
                    let opted_out = match (self.integrity.as_mut(), id) {
                        (Some(integ), Some(id)) => integ.uncontrolled(id),
                        _ => false,
                    };
                    if opted_out {
                        // Unhooked by design (HAMi's whole-GPU mode): shown
                        // with its memory, never a finding.
                        let bytes = obs
                            .nvml_bytes
                            .unwrap_or(0)
                            .max(obs.probe_bytes.unwrap_or(0));
                        let who = p.identity.clone().unwrap_or_default();
                        self.uncontrolled.push((who, tgid, bytes));
                        continue;
                    }
                    let none = Thresholds {
                        min_bytes: 0,
                        ratio: 0.0,
                        scans: 1,
                    };
                    (Kind::NoRegion, excess(&obs, &none))
                }
                None => continue,
            };
            let since = *self.since.entry((tgid, kind)).or_insert(now_ms);
            let container = p.identity.clone().unwrap_or_default();
            let open = p.slot.and_then(|at| self.cache.get(&at.region));
            let who = Subject {
                pid: tgid,
                ns_pid: p.caller.ns_tgid,
                comm: &p.caller.comm_str(),
                container: &container,
                region: open.map(|r| r.shown_path.as_path()),
                slot: p.slot.map(|at| at.slot),
                miss: p.miss.as_ref(),
            };
            out.push(findings::cross_check(kind, who, ex, &obs, since));
        }
        // Log what is new and what cleared.
        for f in &out {
            if f.since_unix_ms == now_ms {
                tracing::warn!("{}", f.message);
            }
        }
        self.since.retain(|(pid, kind), _| {
            let keep = out.iter().any(|f| f.pid == *pid && f.kind == *kind);
            if !keep {
                tracing::info!("finding {} for pid {pid} cleared", kind.name());
            }
            keep
        });
        out.sort_by(|a, b| (a.kind.name(), a.pid).cmp(&(b.kind.name(), b.pid)));
        out
    }

    /// Publish: keeps findings for their retention, then, at most every
    /// `RENDER_EVERY` unless what it shows changed, the region pass: every
    /// open region re-read, dead slots freed, the measured shares written
    /// into the regions, `/metrics` and the utilization file rendered.
    fn publish(
        &mut self,
        started: Instant,
        now_ms: u64,
        nv: Option<Sample>,
        untracked: Vec<(ContainerIdentity, u64)>,
        out: Vec<Finding>,
    ) -> ScanOutput {
        let published = self.retention.update(&out, now_ms);
        let findings_json = findings::to_json(&published, now_ms);
        let shown = self.shown_fingerprint(&out);
        if let Some((at, fp, text)) = &self.rendered {
            if *fp == shown && at.elapsed() < RENDER_EVERY {
                return ScanOutput {
                    metrics: text.clone(),
                    findings_json,
                    findings: out.len(),
                    utilization_json: self.utilization_json.clone(),
                };
            }
        }
        // The region pass, counted before the render so that /metrics
        // shows the pass whose values it carries.
        self.counters.region_passes.inc();
        self.cache.refresh();
        self.reclaim_dead_slots();
        let views = self.region_views(nv.as_ref().map_or(&[][..], |s| &s.devices[..]));
        apply::apply(&self.cache, &views.sm_util);
        self.cache.evict_idle(Duration::from_secs(60));
        let snap = Snapshot {
            regions: views.regions,
            host: nv.map(|s| s.devices).unwrap_or_default(),
            findings: &out,
            untracked,
            uncontrolled: self.uncontrolled.clone(),
            probes: self.attached.clone(),
            processes: self.procs.len(),
            region_files_skipped: self.roots.iter().map(RootRegions::skipped).sum(),
            overruns: self.cache.overruns(),
            labels_shortened: views.labels_shortened,
            timing: self.last_timing,
            now_unix: now_ms / 1000,
            node: &self.settings.node,
            pods: Some(&self.pods),
            legacy: self.settings.legacy_metrics,
        };
        let rendering = Instant::now();
        let metrics = Exposition::from_openmetrics(metrics::render(&snap, &self.counters));
        drop(snap);
        self.last_timing = snapshot::ScanTiming {
            render: rendering.elapsed(),
            scan: started.elapsed(),
        };
        // After the pass: a region it dropped is no change next time.
        let shown = self.shown_fingerprint(&out);
        self.rendered = Some((rendering, shown, metrics.clone()));
        self.utilization_json = serde_json::to_string(&utilization::State {
            version: 1,
            updated_unix_ms: now_ms,
            regions: views.measured,
        })
        .unwrap_or_default();
        ScanOutput {
            metrics,
            findings_json,
            findings: out.len(),
            utilization_json: self.utilization_json.clone(),
        }
    }

    /// What decides whether `/metrics` must be rendered at once: the open
    /// regions and the findings (order-independent).
    fn shown_fingerprint(&self, findings: &[Finding]) -> u64 {
        use std::hash::BuildHasher;
        let state = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default();
        let regions = self.cache.iter().map(|(k, _)| state.hash_one(k));
        let found = findings
            .iter()
            .map(|f| state.hash_one((f.kind.name(), f.pid)));
        regions.chain(found).fold(0u64, u64::wrapping_add) ^ self.procs.len() as u64
    }

    /// Frees slots whose processes are proven dead (see [`Reclaimer`]);
    /// slots of processes the daemon tracks are left alone.
    fn reclaim_dead_slots(&mut self) {
        let tracked: HashSet<SlotRef> = self.procs.values().filter_map(|p| p.slot).collect();
        let dead_slots = &self.dead_slots;
        let n = self
            .reclaimer
            .run(&mut self.cache, &self.procfs, &tracked, &|key, i, s| {
                dead_slots.alive_lately(key, i, s)
            });
        self.counters.slots_reclaimed.inc_by(n as u64);
    }

    /// The integrity checks over every known process.
    fn check_and_restore_limits(&mut self, nv: Option<&Sample>, now_ms: u64) -> Vec<Finding> {
        if self.integrity.is_none() {
            return Vec::new();
        }
        let mut procs: Vec<(&u32, &Proc)> = self.procs.iter().collect();
        procs.sort_by_key(|(pid, _)| **pid);
        let empty = ContainerIdentity::default();
        let inputs: Vec<ProcInput<'_>> = procs
            .into_iter()
            .map(|(&tgid, p)| {
                let obs = self.observe(tgid, p, nv);
                ProcInput {
                    pid: tgid,
                    ns_pid: p.caller.ns_tgid,
                    comm: p.caller.comm_str(),
                    identity: p.identity.as_ref().unwrap_or(&empty),
                    region: p.region(),
                    unhooked: p.slot.is_none()
                        && p.first_seen.elapsed() >= self.settings.slot_grace,
                    probe_bytes: obs.probe_bytes,
                    nvml_bytes: obs.nvml_bytes,
                    tracked_bytes: obs.tracked_total,
                }
            })
            .collect();
        match self.integrity.as_mut() {
            Some(integ) => {
                let gpus = nv.map_or(&[][..], |s| &s.devices[..]);
                integ.scan(&inputs, &self.cache, gpus, now_ms)
            }
            None => Vec::new(),
        }
    }

    /// Hands the planner the containers of the live tracked processes that
    /// hold slots (`plan::roster`). Without the host's PIDs the daemon
    /// tracks nobody: no plans, and the containers keep to their own limits.
    fn publish_roster(&mut self, nv: Option<&Sample>) {
        let Some((builder, handle, witness)) = self.roster.as_mut() else {
            return;
        };
        if self.settings.host_pids.is_err() {
            return;
        }
        let members: Vec<Member<'_>> = self
            .procs
            .iter()
            .filter_map(|(&pid, p)| {
                let id = p.identity.as_ref()?.container_id.as_deref()?;
                let open = self.cache.get(&p.slot?.region)?;
                let uuids = open.last_snapshot().map_or_else(Vec::new, |r| {
                    (0..MAX_DEVICES)
                        .map(|d| {
                            let (b, n) = r.uuid(d);
                            String::from_utf8_lossy(&b[..n]).into_owned()
                        })
                        .collect()
                });
                Some(Member {
                    pid,
                    container_id: id,
                    region: &open.shown_path,
                    on_host: open.owner.is_some(),
                    uuids,
                })
            })
            .collect();
        let mut roster = builder.build(&members, nv);
        let launched = witness.sync(&mut self.probes, self.libs.drivers(), &roster.watched());
        roster.add_launched(&launched, nv);
        handle.publish(roster);
    }

    /// Processes NVML lists that the probes never saw (a libcuda we do not
    /// probe, or static linking): tracked too, so a missing region shows.
    fn adopt_nvml_processes(&mut self, nv: Option<&Sample>) {
        let Some(nv) = nv.filter(|_| self.settings.host_pids.is_ok()) else {
            return;
        };
        for &pid in nv.processes.keys() {
            if self.procs.contains_key(&pid) || !self.procfs.alive(pid) {
                continue;
            }
            let comm =
                std::fs::read_to_string(self.procfs.dir(pid).join("comm")).unwrap_or_default();
            let mut c = Caller {
                host_tgid: pid,
                host_pid: pid,
                ..Caller::default()
            };
            let b = comm.trim().as_bytes();
            let n = b.len().min(c.comm.len());
            c.comm[..n].copy_from_slice(&b[..n]);
            self.procs.insert(pid, Proc::new(c, true));
        }
    }

    fn observe(&self, tgid: u32, p: &Proc, nv: Option<&Sample>) -> Observation {
        let (mut data, mut total) = (0u64, 0u64);
        if let Some(at) = p.slot {
            if let Some(r) = self.cache.get(&at.region).and_then(|r| r.last_snapshot()) {
                let s = &r.procs[at.slot];
                for d in 0..MAX_DEVICES {
                    data = data.saturating_add(s.used[d].data_size.load(SeqCst));
                    total = total.saturating_add(s.used[d].total.load(SeqCst));
                }
            }
        }
        Observation {
            probe_bytes: (!p.nvml_only).then(|| {
                p.counts
                    .bytes_allocated
                    .saturating_sub(p.counts.bytes_freed)
            }),
            nvml_bytes: nv.and_then(|s| s.processes.get(&tgid).copied()),
            tracked_data: data,
            tracked_total: total,
        }
    }

    /// One view per open region. `devices` (NVML) gives each container's
    /// utilization, and the per-slot values to write into the slots of
    /// devices the region does not SM-limit (written by `daemon::apply`).
    fn region_views(&mut self, devices: &[DeviceSample]) -> region_view::Views {
        self.pods.refresh();
        let util = Utilization::new(
            devices,
            self.procs.iter().filter_map(|(&host_pid, p)| {
                p.slot.map(|at| SlotProc {
                    host_pid,
                    region: at.region,
                    slot: at.slot,
                })
            }),
        );
        region_view::views(
            &self.cache,
            &mut self.ids,
            &self.pods,
            &mut self.launches,
            &mut self.dead_slots,
            &util,
        )
    }

    fn count_lost(&mut self) {
        let Ok(counters) = self.probes.counters() else {
            return;
        };
        for (c, n) in counters {
            let last = self.lost_seen.insert(c.name(), n).unwrap_or(0);
            let fam = self
                .counters
                .probe_lost
                .get_or_create(&snapshot::one("reason", c.name()));
            fam.inc_by(n.saturating_sub(last));
        }
    }
}

/// The bytes the cross-check found untracked, summed per container.
fn untracked_by_container(out: &[Finding]) -> Vec<(ContainerIdentity, u64)> {
    let mut untracked: HashMap<ContainerIdentity, u64> = HashMap::new();
    for f in out {
        let id = ContainerIdentity {
            cgroup: f.cgroup.clone(),
            pod_uid: f.pod_uid.clone(),
            container_id: f.container_id.clone(),
        };
        *untracked.entry(id).or_insert(0) += f.untracked_bytes;
    }
    let mut untracked: Vec<_> = untracked.into_iter().collect();
    untracked.sort();
    untracked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_never_probes_a_launch() {
        let funcs = daemon_funcs();
        assert!(funcs
            .iter()
            .all(|f| !matches!(f.class(), FuncClass::Launch | FuncClass::GraphLaunch)));
        for f in [
            Func::Init,
            Func::CtxCreate,
            Func::DevicePrimaryCtxRetain,
            Func::MemAlloc,
            Func::MemFree,
            Func::MemCreate,
            Func::MemRelease,
            Func::MemAllocFromPoolAsync,
        ] {
            assert!(funcs.contains(&f), "{f:?}");
        }
    }
}
