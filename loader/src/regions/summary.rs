//! A snapshot of one region with findings: what `vgpu inspect` prints and
//! what the daemon exports. Field names are part of `vgpu inspect --json`
//! and documented in `docs/inspect.md`; rename nothing.

use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::region::{
    rules, status, ProcSlot, SharedRegion, MAX_DEVICES, MAX_PROCS, MINOR_VERSION,
};
use vgpu_common::region_io::{IoError, RegionIo};

use super::discover::ContainerRef;
use super::liveness::{Alive, Mappers};

/// A counter above this is not a real amount of device memory: it is an
/// unsigned underflow (HAMi's "17592186044134MiB").
pub const IMPLAUSIBLE_BYTES: u64 = 1 << 50;

/// One region.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RegionSummary {
    pub path: PathBuf,
    /// From HAMi's `<podUID>_<containerName>` directory, when so named.
    pub pod_uid: Option<String>,
    pub container: Option<String>,
    pub major_version: u32,
    pub minor_version: u32,
    /// Devices the hook saw (`device_num`); 0 before the first NVML/CUDA init.
    pub device_num: u64,
    pub devices: Vec<DeviceSummary>,
    /// Raw `proc_num` (the slot high-water mark).
    pub proc_num: i32,
    pub priority: i32,
    pub utilization_switch: i32,
    pub recent_kernel: i32,
    /// Unix seconds.
    pub last_kernel_time: u64,
    pub lock: LockSummary,
    /// Slots below `proc_num` that are in use or hold leftovers; clean free
    /// slots are left out.
    pub slots: Vec<SlotSummary>,
    /// Free, clean slots below `proc_num`.
    pub free_slots: usize,
    pub findings: Vec<RegionFinding>,
}

/// Limits and container-wide usage of one device.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceSummary {
    pub index: usize,
    /// `GPU-…`, empty when not recorded.
    pub uuid: String,
    /// Bytes; 0 = no limit.
    pub limit_bytes: u64,
    /// Percent, 100 = no limit (`rules::sm_limit_shown` of the region's value).
    pub sm_limit_percent: u64,
    /// Sum of `total` over slots with a nonzero pid (what the hook checks
    /// the limit against).
    pub used_bytes: u64,
}

/// The slot lock and HAMi-core's semaphores.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LockSummary {
    /// `owner_pid`: namespace PID of the holder, 0 = none recorded.
    pub owner_pid: u64,
    /// Whether the OFD region lock is held by someone now.
    pub held: Option<bool>,
    /// Liveness of `owner_pid` (absent when it is 0).
    pub owner: Option<Alive>,
    /// Value of the glibc semaphore HAMi-core uses (`sem`, low 32 bits).
    pub sem_value: u32,
    /// Value of HAMi-core's `sem_postinit`.
    pub sem_postinit_value: u32,
}

/// One process slot.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlotSummary {
    pub index: usize,
    pub pid: i32,
    pub hostpid: i32,
    /// Liveness (absent for pid 0).
    pub alive: Option<Alive>,
    pub status: i32,
    /// `exited`, `running`, `suspended` or `invalid`.
    pub status_name: &'static str,
    /// Devices with nonzero counters.
    pub usage: Vec<SlotUsage>,
}

/// One slot's counters on one device.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlotUsage {
    pub device: usize,
    pub context_bytes: u64,
    pub module_bytes: u64,
    pub data_bytes: u64,
    pub total_bytes: u64,
    /// NVML-measured, written by whoever samples NVML.
    pub monitor_used_bytes: u64,
    pub sm_util: u64,
    /// Successful kernel and graph launches the process counted.
    pub launches: u64,
    /// Of `data_bytes`, what is served from host memory
    /// (`CUDA_OVERSUBSCRIBE`).
    pub host_bytes: u64,
}

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// Something an operator should know; `kind` values are listed in
/// `docs/inspect.md`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RegionFinding {
    pub kind: RegionFindingKind,
    pub severity: Severity,
    pub slot: Option<usize>,
    pub device: Option<usize>,
    pub message: String,
}

/// Kinds of region findings (stable, snake_case in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionFindingKind {
    DeadSlot,
    HostpidMissing,
    ExitedSlotWithUsage,
    OverLimit,
    TotalMismatch,
    CounterUnderflow,
    ProcNumOutOfRange,
    InvalidStatus,
    Suspended,
    DeviceOutOfRange,
    LockHolderDead,
    SemStuck,
    MinorVersion,
}

fn status_name(s: i32) -> &'static str {
    match s {
        status::EXITED => "exited",
        status::RUNNING => "running",
        status::SUSPENDED => "suspended",
        _ => "invalid",
    }
}

fn usage_of(slot: &ProcSlot, dev: usize) -> SlotUsage {
    let m = &slot.used[dev];
    SlotUsage {
        device: dev,
        context_bytes: m.context_size.load(SeqCst),
        module_bytes: m.module_size.load(SeqCst),
        data_bytes: m.data_size.load(SeqCst),
        total_bytes: m.total.load(SeqCst),
        monitor_used_bytes: slot.monitorused[dev].load(SeqCst),
        sm_util: slot.device_util[dev].sm_util.load(SeqCst),
        launches: m.launches.load(SeqCst),
        host_bytes: m.host_bytes.load(SeqCst),
    }
}

impl SlotUsage {
    fn is_zero(&self) -> bool {
        self.context_bytes == 0
            && self.module_bytes == 0
            && self.data_bytes == 0
            && self.total_bytes == 0
            && self.monitor_used_bytes == 0
            && self.sm_util == 0
            && self.launches == 0
            && self.host_bytes == 0
    }
}

/// The glibc semaphore value of a HAMi `sem_t` (low 32 bits of the first
/// 64-bit word).
pub fn sem_value(sem: &[std::sync::atomic::AtomicU32; 8]) -> u32 {
    sem[0].load(SeqCst)
}

/// Host PID recorded for the slot whose namespace pid is `pid`, or 0.
pub fn hostpid_of(region: &SharedRegion, pid: i32) -> i32 {
    region
        .active_slots()
        .iter()
        .find(|s| s.pid.load(SeqCst) == pid)
        .map_or(0, |s| s.hostpid.load(SeqCst))
}

/// Liveness of the recorded lock owner (`owner_pid` is a namespace PID; the
/// slot with that pid gives its host PID).
pub fn owner_liveness(region: &SharedRegion, mappers: &Mappers) -> Option<Alive> {
    let owner = region.owner_pid.load(SeqCst);
    let pid = i32::try_from(owner).ok().filter(|p| *p > 0)?;
    Some(mappers.liveness(pid, hostpid_of(region, pid)))
}

impl RegionSummary {
    /// Snapshots `file` (a copy read with `pread`, never a mapping).
    /// `mappers` is a [`Mappers::scan`] of the same file.
    pub fn read(
        file: &RegionIo,
        owner: Option<&ContainerRef>,
        mappers: &Mappers,
    ) -> Result<Self, IoError> {
        let snap = file.snapshot()?;
        let r: &SharedRegion = &snap;
        let device_num = r.device_num.load(SeqCst);
        let proc_num = r.proc_num.load(SeqCst);
        let mut findings = Vec::new();
        let mut slots = Vec::new();
        let mut free_slots = 0;
        for (index, slot) in r.active_slots().iter().enumerate() {
            if vgpu_common::reclaim::is_clean(slot) {
                free_slots += 1;
                continue;
            }
            let s = read_slot(index, slot, mappers);
            slot_findings(&s, device_num, &mut findings);
            slots.push(s);
        }
        let used: [u64; MAX_DEVICES] =
            std::array::from_fn(|d| rules::used_by_slots(r.active_slots(), d));
        let devices = (0..MAX_DEVICES)
            .filter(|&d| {
                (d as u64) < device_num
                    || used[d] != 0
                    || (device_num == 0
                        && (r.memory_limit_of(d).is_some() || r.sm_limit_of(d).is_some()))
            })
            .map(|d| {
                let (uuid, len) = r.uuid(d);
                DeviceSummary {
                    index: d,
                    uuid: String::from_utf8_lossy(&uuid[..len]).into_owned(),
                    limit_bytes: r.limit[d].load(SeqCst),
                    sm_limit_percent: rules::sm_limit_shown(r.sm_limit[d].load(SeqCst)),
                    used_bytes: used[d],
                }
            })
            .collect::<Vec<_>>();
        for d in &devices {
            if d.limit_bytes != 0 && d.used_bytes > d.limit_bytes {
                findings.push(RegionFinding {
                    kind: RegionFindingKind::OverLimit,
                    severity: Severity::Warning,
                    slot: None,
                    device: Some(d.index),
                    message: format!(
                        "device {}: the container uses {} of its {} limit",
                        d.index,
                        bytes(d.used_bytes),
                        bytes(d.limit_bytes)
                    ),
                });
            }
        }
        if !(0..=MAX_PROCS as i32).contains(&proc_num) {
            findings.push(RegionFinding {
                kind: RegionFindingKind::ProcNumOutOfRange,
                severity: Severity::Error,
                slot: None,
                device: None,
                message: format!("proc_num is {proc_num}, outside 0..={MAX_PROCS}"),
            });
        }
        let minor = r.minor_version.load(SeqCst);
        if minor != MINOR_VERSION {
            findings.push(RegionFinding {
                kind: RegionFindingKind::MinorVersion,
                severity: Severity::Info,
                slot: None,
                device: None,
                message: format!("region version 1.{minor}; vgpu writes 1.{MINOR_VERSION}"),
            });
        }
        let lock = LockSummary {
            owner_pid: r.owner_pid.load(SeqCst),
            held: vgpu_common::lock::is_locked(file.file()).ok(),
            owner: owner_liveness(r, mappers),
            sem_value: sem_value(&r.sem),
            sem_postinit_value: sem_value(&r.sem_postinit),
        };
        lock_findings(&lock, &mut findings);
        findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
        Ok(Self {
            path: file.path().to_owned(),
            pod_uid: owner.map(|o| o.pod_uid.clone()),
            container: owner.map(|o| o.container.clone()),
            major_version: r.major_version.load(SeqCst),
            minor_version: minor,
            device_num,
            devices,
            proc_num,
            priority: r.priority.load(SeqCst),
            utilization_switch: r.utilization_switch.load(SeqCst),
            recent_kernel: r.recent_kernel.load(SeqCst),
            last_kernel_time: r.last_kernel_time.load(SeqCst),
            lock,
            slots,
            free_slots,
            findings,
        })
    }
}

fn read_slot(index: usize, slot: &ProcSlot, mappers: &Mappers) -> SlotSummary {
    let pid = slot.pid.load(SeqCst);
    let hostpid = slot.hostpid.load(SeqCst);
    let st = slot.status.load(SeqCst);
    SlotSummary {
        index,
        pid,
        hostpid,
        alive: (pid != 0).then(|| mappers.slot_liveness(slot)),
        status: st,
        status_name: status_name(st),
        usage: (0..MAX_DEVICES)
            .map(|d| usage_of(slot, d))
            .filter(|u| !u.is_zero())
            .collect(),
    }
}

fn slot_findings(s: &SlotSummary, device_num: u64, out: &mut Vec<RegionFinding>) {
    let mut push = |kind, severity, device, message: String| {
        out.push(RegionFinding {
            kind,
            severity,
            slot: Some(s.index),
            device,
            message: format!("slot {}: {message}", s.index),
        });
    };
    let total: u64 = s
        .usage
        .iter()
        .map(|u| u.total_bytes)
        .fold(0, u64::saturating_add);
    match s.alive {
        Some(a) if !a.alive => push(
            RegionFindingKind::DeadSlot,
            Severity::Warning,
            None,
            format!(
                "pid {} (hostpid {}) is dead but still holds the slot and {} of counters",
                s.pid,
                s.hostpid,
                bytes(total)
            ),
        ),
        Some(_) if s.hostpid == 0 => push(
            RegionFindingKind::HostpidMissing,
            Severity::Warning,
            None,
            format!("live pid {} has no host PID recorded", s.pid),
        ),
        Some(_) => {}
        None if !s.usage.is_empty() => push(
            RegionFindingKind::ExitedSlotWithUsage,
            Severity::Warning,
            None,
            format!("pid 0 (free) but its counters still hold {}", bytes(total)),
        ),
        None => {}
    }
    match s.status {
        status::EXITED if s.pid != 0 => push(
            RegionFindingKind::InvalidStatus,
            Severity::Info,
            None,
            format!("pid {} has status 0 (exited)", s.pid),
        ),
        status::EXITED => {}
        status::RUNNING if s.pid == 0 => push(
            RegionFindingKind::InvalidStatus,
            Severity::Info,
            None,
            "pid 0 (free) with status 1 (running)".to_owned(),
        ),
        status::RUNNING => {}
        status::SUSPENDED => push(
            RegionFindingKind::Suspended,
            Severity::Info,
            None,
            format!("pid {} is suspended", s.pid),
        ),
        other => push(
            RegionFindingKind::InvalidStatus,
            Severity::Error,
            None,
            format!("status {other} is not 0, 1 or 2"),
        ),
    }
    for u in &s.usage {
        let sum = u
            .context_bytes
            .checked_add(u.module_bytes)
            .and_then(|x| x.checked_add(u.data_bytes));
        if sum != Some(u.total_bytes) {
            push(
                RegionFindingKind::TotalMismatch,
                Severity::Error,
                Some(u.device),
                format!(
                    "device {}: total {} != context {} + module {} + data {}",
                    u.device, u.total_bytes, u.context_bytes, u.module_bytes, u.data_bytes
                ),
            );
        }
        let fields = [
            ("context", u.context_bytes),
            ("module", u.module_bytes),
            ("data", u.data_bytes),
            ("total", u.total_bytes),
            ("monitorused", u.monitor_used_bytes),
            ("host", u.host_bytes),
        ];
        for (name, v) in fields {
            if v > IMPLAUSIBLE_BYTES {
                push(
                    RegionFindingKind::CounterUnderflow,
                    Severity::Error,
                    Some(u.device),
                    format!(
                        "device {}: {name} counter is {v} (> 1 PiB: an underflow)",
                        u.device
                    ),
                );
            }
        }
        if device_num > 0 && u.device as u64 >= device_num {
            push(
                RegionFindingKind::DeviceOutOfRange,
                Severity::Warning,
                Some(u.device),
                format!(
                    "usage on device {} but the region has {device_num} device(s)",
                    u.device
                ),
            );
        }
    }
}

fn lock_findings(l: &LockSummary, out: &mut Vec<RegionFinding>) {
    let owner_dead = l.owner.is_some_and(|a| !a.alive);
    if owner_dead {
        out.push(RegionFinding {
            kind: RegionFindingKind::LockHolderDead,
            severity: Severity::Warning,
            slot: None,
            device: None,
            message: format!(
                "owner_pid {} is dead (the kernel released its OFD lock)",
                l.owner_pid
            ),
        });
    }
    if l.sem_value == 0 && (l.owner_pid == 0 || owner_dead) {
        out.push(RegionFinding {
            kind: RegionFindingKind::SemStuck,
            severity: Severity::Warning,
            slot: None,
            device: None,
            message: "HAMi-core's sem is 0 with no live owner: HAMi-core processes wait on it"
                .to_owned(),
        });
    }
}

/// Bytes in binary units, for messages and the table.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
