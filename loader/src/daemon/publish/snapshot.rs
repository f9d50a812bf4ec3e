//! What a scan publishes, as the renderers read it: the regions' views,
//! NVML's samples, the findings and the counters. Its own module so that
//! each renderer ([`super::metrics`], [`super::legacy_metrics`]) depends on
//! it and neither on the other.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use vgpu_common::event::ProcCounters;

use crate::daemon::collect::container_identity::ContainerIdentity;
use crate::daemon::collect::nvml::DeviceSample;
use crate::daemon::collect::pods::PodNames;
use crate::daemon::collect::region_cache::Overruns;
use crate::daemon::state::findings::Finding;

/// Label pairs.
pub type Labels = Vec<(String, String)>;

/// One device of one region, summed over slots with status != 0 (as HAMi's
/// monitor does).
#[derive(Clone, Debug, Default)]
pub struct RegionDevice {
    pub index: usize,
    pub uuid: String,
    pub limit: u64,
    pub total: u64,
    pub context: u64,
    pub module: u64,
    pub data: u64,
    /// Summed slot `offset`s (HAMi's monitor exports them as a label).
    pub offset: u64,
    pub sm_util: u64,
    /// Kernel and graph launches the container's processes counted
    /// (monotonic: `launches::Ledger`).
    pub launches: u64,
    /// The region's raw `sm_limit` (`rules::sm_limit` says what it means).
    pub sm_limit: u64,
    /// Of `data`, bytes served from host memory (`CUDA_OVERSUBSCRIBE`).
    pub host: u64,
}

/// One region (one container).
#[derive(Clone, Debug, Default)]
pub struct RegionView {
    /// pod_uid, container, container_id, cgroup, region.
    pub labels: Labels,
    pub devices: Vec<RegionDevice>,
    /// Unix seconds; 0 = never.
    pub last_kernel_time: u64,
    /// Slots in use whose process is gone (by host PID), until reclaimed.
    pub dead_slots: u64,
}

/// How long one scan took, all of it and its render.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScanTiming {
    pub scan: std::time::Duration,
    pub render: std::time::Duration,
}

/// Everything one scan exports besides the counters.
#[derive(Debug, Default)]
pub struct Snapshot<'a> {
    pub regions: Vec<RegionView>,
    pub host: Vec<DeviceSample>,
    pub findings: &'a [Finding],
    /// Untracked bytes per container (cgroup identity).
    pub untracked: Vec<(ContainerIdentity, u64)>,
    /// Processes of containers that opt out of the hook (HAMi's whole-GPU
    /// mode): identity, host PID, device memory bytes.
    pub uncontrolled: Vec<(ContainerIdentity, u32, u64)>,
    /// Probed libcuda entry points: (symbol, libcuda path).
    pub probes: Vec<(String, String)>,
    /// Processes the probes know.
    pub processes: usize,
    /// Region files under the regions root the scan bounds left out.
    pub region_files_skipped: usize,
    /// Containers over a per-container bound of the region cache.
    pub overruns: Overruns,
    /// Containers whose label values were shortened to their bound.
    pub labels_shortened: usize,
    /// How long the previous scan took (this one's is not over).
    pub timing: ScanTiming,
    pub now_unix: u64,
    /// This node's name: HAMi's `node` label of host series and the `node`
    /// label of the findings' series (empty: left out).
    pub node: &'a str,
    /// Pod names by UID, for the per-pod findings series.
    pub pods: Option<&'a PodNames>,
    /// Also export HAMi 2.5–2.8's series ([`crate::daemon::publish::legacy_metrics`]).
    pub legacy: bool,
}

/// Counters that accumulate over the daemon's life.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// `hostpid` writes into slots.
    pub hostpid_fills: Counter,
    /// Processes whose slot already held the right `hostpid` when the daemon
    /// first found it (the hook learnt it itself, e.g. outside a PID
    /// namespace or from NVML during its context measurement).
    pub hostpid_verified: Counter,
    /// Slots of dead processes the daemon freed.
    pub slots_reclaimed: Counter,
    /// Region passes (every region re-read and its values refreshed), so
    /// that a reader can wait for values at least one pass newer.
    pub region_passes: Counter,
    /// Calls seen by the probes, by kind (`alloc`, `alloc_failure`, `free`, `launch`, `graph_launch`).
    pub probe_events: Family<Labels, Counter>,
    /// Calls the probes could not record, by reason.
    pub probe_lost: Family<Labels, Counter>,
    /// Violations found, by kind and the action taken
    /// (`crate::daemon::state::retention`).
    pub violations: Family<Labels, Counter>,
}

impl Counters {
    /// Adds to `probe_events` what a process's probe counters gained from
    /// `old` to `new`.
    pub fn count_probe_events(&self, old: &ProcCounters, new: &ProcCounters) {
        let kinds = [
            ("alloc", old.allocs, new.allocs),
            ("alloc_failure", old.alloc_failures, new.alloc_failures),
            ("free", old.frees, new.frees),
            ("launch", old.launches, new.launches),
            ("graph_launch", old.graph_launches, new.graph_launches),
        ];
        for (kind, a, b) in kinds {
            let d = b.saturating_sub(a);
            if d > 0 {
                self.probe_events
                    .get_or_create(&one("kind", kind))
                    .inc_by(d);
            }
        }
    }
}

/// `[("kind", v)]`.
pub fn one(k: &str, v: &str) -> Labels {
    vec![(k.to_owned(), v.to_owned())]
}
