//! Findings of the cross-check and the state file that publishes them
//! (`<state-dir>/findings.json`, replaced atomically every scan; the same
//! JSON is served at `/findings`). Field names are documented in
//! docs/daemon.md; rename nothing.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::daemon::collect::container_identity::ContainerIdentity;
use crate::daemon::judge::check::{Excess, Observation, Source};
use crate::daemon::judge::hostpid::Miss;

/// Name of the state file under `--state-dir`.
pub const FILE_NAME: &str = "findings.json";
/// Version of the file's format.
pub const FORMAT_VERSION: u32 = 1;

/// Finding kinds (stable, snake_case in JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Device memory the hook did not account (probes or NVML saw more
    /// than the slot holds, persistently).
    UntrackedAllocation,
    /// A CUDA process with no region or no slot: the hook is not loaded,
    /// disabled, or bypassed.
    NoRegion,
    /// A region's `limit[]` / `sm_limit[]` differ from what the container
    /// was given (its runtime spec, or an admin's `vgpu set-*-limit`).
    LimitTampered,
    /// A CUDA process whose own limit variables are unset or looser than
    /// its container's.
    UnlimitedProcess,
    /// A CUDA process that names another region than its container's.
    PrivateRegion,
    /// A container holds more device memory than its limit, by the
    /// kernel's count (the probes).
    OverLimit,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::UntrackedAllocation,
        Kind::NoRegion,
        Kind::LimitTampered,
        Kind::UnlimitedProcess,
        Kind::PrivateRegion,
        Kind::OverLimit,
    ];

    /// The JSON / metric label value.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::UntrackedAllocation => "untracked_allocation",
            Kind::NoRegion => "no_region",
            Kind::LimitTampered => "limit_tampered",
            Kind::UnlimitedProcess => "unlimited_process",
            Kind::PrivateRegion => "private_region",
            Kind::OverLimit => "over_limit",
        }
    }
}

/// Which limit of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitName {
    MemoryBytes,
    SmPercent,
}

/// One limit that is not what the container was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LimitMismatch {
    pub device: usize,
    pub limit: LimitName,
    pub expected: u64,
    pub found: u64,
}

/// One finding about one process.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Finding {
    pub kind: Kind,
    /// Host PID.
    pub pid: u32,
    /// PID in the process's own namespace (0: unknown).
    pub ns_pid: u32,
    pub comm: String,
    /// cgroup path under the cgroup2 mount (empty if unknown).
    pub cgroup: String,
    pub pod_uid: Option<String>,
    pub container_id: Option<String>,
    /// Region file as the process names it (absent for `no_region`).
    pub region: Option<PathBuf>,
    pub slot: Option<usize>,
    /// Bytes not accounted by the hook.
    pub untracked_bytes: u64,
    /// Which view saw them (absent when nothing was measured yet).
    pub source: Option<Source>,
    /// Probe-observed bytes allocated minus freed.
    pub probe_bytes: Option<u64>,
    /// NVML used memory of the process.
    pub nvml_bytes: Option<u64>,
    /// Slot `data_size` and `total`, summed over devices.
    pub tracked_data_bytes: u64,
    pub tracked_total_bytes: u64,
    /// Unix milliseconds when the finding first held.
    pub since_unix_ms: u64,
    /// One sentence for people.
    pub message: String,
    /// Limits that differ from the container's (integrity findings).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<LimitMismatch>,
    /// What the daemon did about it (`restored`, `killed`, or why not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Unix milliseconds of the first scan that no longer found it; absent
    /// while it holds. Kept for `--findings-retention` (`retention`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_unix_ms: Option<u64>,
}

impl Finding {
    /// A finding of `kind` about `container`, holding since `since_unix_ms`
    /// and saying `message`; the process, region and byte fields are empty
    /// for the caller to fill (`Finding { pid, ..Finding::new(..) }`).
    pub fn new(
        kind: Kind,
        container: &ContainerIdentity,
        since_unix_ms: u64,
        message: String,
    ) -> Finding {
        Finding {
            kind,
            pid: 0,
            ns_pid: 0,
            comm: String::new(),
            cgroup: container.cgroup.clone(),
            pod_uid: container.pod_uid.clone(),
            container_id: container.container_id.clone(),
            region: None,
            slot: None,
            untracked_bytes: 0,
            source: None,
            probe_bytes: None,
            nvml_bytes: None,
            tracked_data_bytes: 0,
            tracked_total_bytes: 0,
            since_unix_ms,
            message,
            limits: Vec::new(),
            action: None,
            resolved_unix_ms: None,
        }
    }
}

/// The process a cross-check finding is about.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    /// Host PID.
    pub pid: u32,
    /// PID in its own namespace (0: unknown).
    pub ns_pid: u32,
    pub comm: &'a str,
    pub container: &'a ContainerIdentity,
    /// Its region file as it names it, and its slot there (none without a
    /// slot).
    pub region: Option<&'a Path>,
    pub slot: Option<usize>,
    /// Why it has no slot, when it has none.
    pub miss: Option<&'a Miss>,
}

impl Subject<'_> {
    /// The container as people read it: the short container id, else the
    /// cgroup path, else `-`.
    fn container_shown(&self) -> &str {
        match self.container.container_id.as_deref() {
            Some(c) => &c[..c.len().min(12)],
            None if self.container.cgroup.is_empty() => "-",
            None => &self.container.cgroup,
        }
    }
}

/// A finding of the cross-check (`untracked_allocation`, `no_region`)
/// about `who`, holding since `since` (Unix ms): what the probes, NVML and
/// the slot saw (`obs`), the escaped bytes (`ex`), and one sentence saying
/// so. Integrity findings are built by `integrity`.
pub fn cross_check(
    kind: Kind,
    who: Subject<'_>,
    ex: Option<Excess>,
    obs: &Observation,
    since: u64,
) -> Finding {
    let (pid, comm, ctr) = (who.pid, who.comm, who.container_shown());
    let bytes = ex.map_or(0, |e| e.bytes);
    let message = match kind {
        Kind::UntrackedAllocation => {
            let (view, seen) = match ex.map(|e| e.source) {
                Some(Source::Nvml) => ("nvml", obs.nvml_bytes.unwrap_or(0)),
                _ => ("probes", obs.probe_bytes.unwrap_or(0)),
            };
            format!(
                "untracked allocation: pid {pid} ({comm}, ns pid {}) container {ctr}: {bytes} bytes \
                 not accounted by the hook ({view} saw {seen} bytes, slot tracks data {} / total {}) \
                 in {}",
                who.ns_pid,
                obs.tracked_data,
                obs.tracked_total,
                who.region.map_or("-".into(), |r| r.display().to_string()),
            )
        }
        Kind::NoRegion => format!(
            "no region: pid {pid} ({comm}) container {ctr} uses CUDA without the hook's \
             accounting ({}); {bytes} bytes untracked",
            who.miss.map_or("no slot".into(), ToString::to_string),
        ),
        other => format!("{}: pid {pid} ({comm}) container {ctr}", other.name()),
    };
    Finding {
        pid,
        ns_pid: who.ns_pid,
        comm: comm.to_owned(),
        region: who.region.map(Path::to_owned),
        slot: who.slot,
        untracked_bytes: bytes,
        source: ex.map(|e| e.source),
        probe_bytes: obs.probe_bytes,
        nvml_bytes: obs.nvml_bytes,
        tracked_data_bytes: obs.tracked_data,
        tracked_total_bytes: obs.tracked_total,
        ..Finding::new(kind, who.container, since, message)
    }
}

/// The state file's content.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report<'a> {
    pub version: u32,
    /// Unix milliseconds of the scan.
    pub updated_unix_ms: u64,
    pub findings: &'a [Finding],
}

/// Why the state file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot create state directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Serializes a report (the `/findings` body and the file content).
pub fn to_json(findings: &[Finding], now_ms: u64) -> String {
    let report = Report {
        version: FORMAT_VERSION,
        updated_unix_ms: now_ms,
        findings,
    };
    let mut s = serde_json::to_string_pretty(&report).unwrap_or_else(|_| "{}".to_owned());
    s.push('\n');
    s
}

/// Replaces `<dir>/findings.json` with `json` atomically (temp file +
/// rename), so a reader never sees a torn file.
pub fn write_state(dir: &Path, json: &str) -> Result<(), StateError> {
    write_state_file(dir, FILE_NAME, json)
}

/// Writes `<dir>/<name>` the same way (temp file + rename: never torn).
pub fn write_state_file(dir: &Path, name: &str, json: &str) -> Result<(), StateError> {
    std::fs::create_dir_all(dir).map_err(|source| StateError::Dir {
        path: dir.to_owned(),
        source,
    })?;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let werr = |source| StateError::Write {
        path: path.clone(),
        source,
    };
    let mut f = std::fs::File::create(&tmp).map_err(werr)?;
    f.write_all(json.as_bytes()).map_err(werr)?;
    f.sync_data().map_err(werr)?;
    std::fs::rename(&tmp, &path).map_err(werr)
}

/// The findings a previous daemon left in `<dir>/findings.json` and when
/// it last wrote it (empty when absent or unreadable).
pub fn read_earlier(dir: &Path) -> (Vec<Finding>, u64) {
    #[derive(serde::Deserialize)]
    struct Earlier {
        #[serde(default)]
        updated_unix_ms: u64,
        #[serde(default)]
        findings: Vec<Finding>,
    }
    read_state_file::<Earlier>(dir, FILE_NAME)
        .map_or((Vec::new(), 0), |e| (e.findings, e.updated_unix_ms))
}

/// The findings file under `dir` as JSON, if present and valid (for
/// `vgpu inspect --json`).
pub fn read_state(dir: &Path) -> Option<serde_json::Value> {
    read_state_file(dir, FILE_NAME)
}

/// `<dir>/<name>` parsed, if present and valid.
pub fn read_state_file<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Option<T> {
    let text = std::fs::read_to_string(dir.join(name)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("run/vgpu");
        let f = Finding {
            kind: Kind::NoRegion,
            pid: 42,
            ns_pid: 1,
            comm: "python".into(),
            cgroup: "/kubepods/x".into(),
            pod_uid: None,
            container_id: None,
            region: None,
            slot: None,
            untracked_bytes: 1 << 20,
            source: Some(Source::Probes),
            probe_bytes: Some(1 << 20),
            nvml_bytes: None,
            tracked_data_bytes: 0,
            tracked_total_bytes: 0,
            since_unix_ms: 5,
            message: "m".into(),
            limits: Vec::new(),
            action: None,
            resolved_unix_ms: None,
        };
        write_state(&state, &to_json(&[f.clone(), f], 7)).unwrap();
        write_state(&state, &to_json(&[], 8)).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(state.join(FILE_NAME)).unwrap()).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["updated_unix_ms"], 8);
        assert_eq!(v["findings"].as_array().unwrap().len(), 0);
        let one = to_json(
            &[Finding {
                kind: Kind::UntrackedAllocation,
                ..f_default()
            }],
            1,
        );
        let v: serde_json::Value = serde_json::from_str(&one).unwrap();
        assert_eq!(v["findings"][0]["kind"], "untracked_allocation");
        assert_eq!(v["findings"][0]["source"], "nvml");
    }

    #[test]
    fn cross_check_findings_say_what_each_view_saw() {
        let container = ContainerIdentity {
            cgroup: "/kubepods/pod1/abc".into(),
            pod_uid: Some("pod1".into()),
            container_id: Some("0123456789abcdef0123".into()),
        };
        let region = Path::new("/tmp/vgpu/r.cache");
        let who = Subject {
            pid: 4000,
            ns_pid: 7,
            comm: "python",
            container: &container,
            region: Some(region),
            slot: Some(3),
            miss: None,
        };
        let obs = Observation {
            probe_bytes: Some(300),
            nvml_bytes: Some(900),
            tracked_data: 100,
            tracked_total: 150,
        };
        let ex = Excess {
            bytes: 750,
            source: Source::Nvml,
        };
        let f = cross_check(Kind::UntrackedAllocation, who, Some(ex), &obs, 55);
        assert_eq!(
            f.message,
            "untracked allocation: pid 4000 (python, ns pid 7) container 0123456789ab: 750 bytes \
             not accounted by the hook (nvml saw 900 bytes, slot tracks data 100 / total 150) in \
             /tmp/vgpu/r.cache"
        );
        assert_eq!(
            (f.pid, f.ns_pid, f.slot, f.untracked_bytes, f.since_unix_ms),
            (4000, 7, Some(3), 750, 55)
        );
        assert_eq!(f.region.as_deref(), Some(region));
        assert_eq!(f.source, Some(Source::Nvml));
        assert_eq!((f.tracked_data_bytes, f.tracked_total_bytes), (100, 150));
        assert_eq!(f.container_id.as_deref(), Some("0123456789abcdef0123"));
        let probes = Excess {
            bytes: 200,
            source: Source::Probes,
        };
        let f = cross_check(Kind::UntrackedAllocation, who, Some(probes), &obs, 55);
        assert!(
            f.message.contains("(probes saw 300 bytes,"),
            "{}",
            f.message
        );

        let bare = ContainerIdentity {
            container_id: None,
            ..container.clone()
        };
        let miss = Miss::NoRegion("/tmp/vgpu/x.cache".into());
        let who = Subject {
            container: &bare,
            region: None,
            slot: None,
            miss: Some(&miss),
            ..who
        };
        let f = cross_check(Kind::NoRegion, who, None, &obs, 1);
        assert_eq!(
            f.message,
            "no region: pid 4000 (python) container /kubepods/pod1/abc uses CUDA without the \
             hook's accounting (no region file /tmp/vgpu/x.cache (hook not loaded, or not \
             initialised yet)); 0 bytes untracked"
        );
        assert_eq!((f.region, f.slot, f.source), (None, None, None));
        let nobody = ContainerIdentity::default();
        let who = Subject {
            container: &nobody,
            miss: None,
            ..who
        };
        let f = cross_check(Kind::NoRegion, who, None, &obs, 1);
        assert!(f.message.contains("container - uses CUDA"), "{}", f.message);
        assert!(f.message.contains("(no slot)"), "{}", f.message);
    }

    fn f_default() -> Finding {
        Finding {
            kind: Kind::NoRegion,
            pid: 1,
            ns_pid: 1,
            comm: String::new(),
            cgroup: String::new(),
            pod_uid: None,
            container_id: None,
            region: None,
            slot: None,
            untracked_bytes: 0,
            source: Some(Source::Nvml),
            probe_bytes: None,
            nvml_bytes: None,
            tracked_data_bytes: 0,
            tracked_total_bytes: 0,
            since_unix_ms: 0,
            message: String::new(),
            limits: Vec::new(),
            action: None,
            resolved_unix_ms: None,
        }
    }
}
