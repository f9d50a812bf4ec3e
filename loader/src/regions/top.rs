//! `vgpu top`'s rows: one per container (region) and device, built from
//! region snapshots, the daemon's utilization measurements and its findings
//! file. Pure: no I/O here.

use std::cmp::Reverse;
use std::collections::HashMap;

use vgpu_common::region::rules;

use super::summary::{bytes, RegionSummary};
use crate::printable::escape_controls;

/// A process of a row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RowProcess {
    /// PID in the container's namespace.
    pub pid: i32,
    /// Host PID (0: not known yet).
    pub hostpid: i32,
    pub used_bytes: u64,
    pub sm_util_percent: u64,
    /// Successful kernel and graph launches the process counted (its hook).
    pub launches: u64,
}

/// One container on one device.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// HAMi's `<podUID>_<ctrName>` directory, when so named.
    pub pod_uid: Option<String>,
    /// `<namespace>/<pod>` of `pod_uid`, when the kubelet's pod log
    /// directory names it (as in the daemon's metric labels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    pub container: Option<String>,
    pub region: String,
    pub device: usize,
    pub uuid: String,
    pub memory_used_bytes: u64,
    /// 0: no limit.
    pub memory_limit_bytes: u64,
    /// SM utilization, percent: the daemon's measurement when it has one,
    /// else the sum of the slots' `sm_util` (capped at 100).
    pub sm_util_percent: u64,
    /// `daemon` or `slots`: where `sm_util_percent` comes from.
    pub sm_util_source: &'static str,
    /// 100: no limit.
    pub sm_limit_percent: u64,
    pub processes: Vec<RowProcess>,
    /// Launches counted by the live processes (a process that exits takes
    /// its count with it).
    pub launches_total: u64,
    /// Launches per second between two samples (absent on the first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launches_per_sec: Option<f64>,
    /// Finding kinds: the region's own (as `vgpu inspect`) and the daemon's
    /// about this container.
    pub findings: Vec<String>,
}

/// Sort keys.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Memory used, largest first.
    Mem,
    /// SM utilization, largest first.
    Sm,
    /// Number of processes, most first.
    Procs,
    /// Launches per second (else launches counted), most first.
    Launches,
    /// Findings, most first.
    Findings,
    /// Container name.
    Name,
}

/// A daemon finding (from `findings.json`) is about a region when it names
/// its pod (HAMi directory) or its path.
fn daemon_finding_matches(f: &serde_json::Value, s: &RegionSummary) -> bool {
    let pod = f.get("pod_uid").and_then(|v| v.as_str());
    let region = f.get("region").and_then(|v| v.as_str());
    match (&s.pod_uid, pod) {
        (Some(a), Some(b)) if a == b => true,
        _ => region.is_some_and(|r| std::path::Path::new(r) == s.path),
    }
}

/// One region and what the daemon measured of it.
#[derive(Debug, Clone)]
pub struct Input {
    pub summary: RegionSummary,
    /// `(device index, percent)` from the daemon's last scan (empty: none).
    pub measured: Vec<(usize, u64)>,
}

/// The rows of these regions; `daemon` is the daemon's findings file.
pub fn rows(regions: &[Input], daemon: Option<&serde_json::Value>) -> Vec<Row> {
    let daemon_findings: &[serde_json::Value] = daemon
        .and_then(|d| d.get("findings"))
        .and_then(|f| f.as_array())
        .map_or(&[], |v| v.as_slice());
    let mut out = Vec::new();
    for input in regions {
        let s = &input.summary;
        for d in &s.devices {
            let mut processes = Vec::new();
            let mut util = 0u64;
            for slot in &s.slots {
                if slot.pid == 0 || slot.alive.as_ref().is_some_and(|a| a.is_certainly_dead()) {
                    continue;
                }
                let Some(u) = slot.usage.iter().find(|u| u.device == d.index) else {
                    continue;
                };
                util = util.saturating_add(u.sm_util);
                processes.push(RowProcess {
                    pid: slot.pid,
                    hostpid: slot.hostpid,
                    used_bytes: u.total_bytes,
                    sm_util_percent: u.sm_util.min(100),
                    launches: u.launches,
                });
            }
            let mut findings: Vec<String> = s
                .findings
                .iter()
                .filter(|f| f.device.is_none_or(|i| i == d.index))
                .map(|f| kind_name(&f.kind))
                .collect();
            findings.extend(
                daemon_findings
                    .iter()
                    // A live view: what is wrong now, not the record.
                    .filter(|f| f.get("resolved_unix_ms").is_none())
                    .filter(|f| daemon_finding_matches(f, s))
                    .filter_map(|f| f.get("kind").and_then(|k| k.as_str()))
                    .map(str::to_owned),
            );
            let measured = input
                .measured
                .iter()
                .find(|(i, _)| *i == d.index)
                .map(|(_, p)| *p);
            out.push(Row {
                pod_uid: s.pod_uid.clone(),
                pod: None,
                container: s.container.clone(),
                region: s.path.display().to_string(),
                device: d.index,
                uuid: d.uuid.clone(),
                memory_used_bytes: d.used_bytes,
                memory_limit_bytes: d.limit_bytes,
                sm_util_percent: measured.unwrap_or(util).min(100),
                sm_util_source: if measured.is_some() {
                    "daemon"
                } else {
                    "slots"
                },
                sm_limit_percent: d.sm_limit_percent,
                launches_total: processes
                    .iter()
                    .fold(0u64, |a, p| a.saturating_add(p.launches)),
                launches_per_sec: None,
                processes,
                findings,
            });
        }
    }
    out
}

fn kind_name(k: &super::summary::RegionFindingKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

impl Row {
    /// `<namespace>/<pod>/<container>` when the pod is known, else
    /// `<podUID>/<container>`, else the region path.
    pub fn name(&self) -> String {
        match (&self.pod, &self.pod_uid, &self.container) {
            (Some(p), _, Some(c)) | (None, Some(p), Some(c)) => format!("{p}/{c}"),
            _ => self.region.clone(),
        }
    }
}

/// Fills each row's `launches_per_sec` from `prev`, the rows of a sample
/// taken `secs` earlier: per process, the launches it counted since (all of
/// them for a process new since then, or whose count went down: another
/// process in a reused slot). A process that exited in between is missing
/// from both sums, so its last launches are not counted.
pub fn rates(rows: &mut [Row], prev: &[Row], secs: f64) {
    // Also refuses NaN.
    if secs.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return;
    }
    let before: HashMap<(&str, usize, i32, i32), u64> = prev
        .iter()
        .flat_map(|r| {
            r.processes
                .iter()
                .map(move |p| ((r.region.as_str(), r.device, p.pid, p.hostpid), p.launches))
        })
        .collect();
    for r in rows.iter_mut() {
        let mut n = 0u64;
        for p in &r.processes {
            let key = (r.region.as_str(), r.device, p.pid, p.hostpid);
            let d = match before.get(&key) {
                Some(&b) if b <= p.launches => p.launches - b,
                _ => p.launches,
            };
            n = n.saturating_add(d);
        }
        r.launches_per_sec = Some(n as f64 / secs);
    }
}

/// Sorts in place (ties: name, then device).
pub fn sort(rows: &mut [Row], key: SortKey) {
    rows.sort_by_key(|r| (r.name(), r.device));
    match key {
        SortKey::Mem => rows.sort_by_key(|r| Reverse(r.memory_used_bytes)),
        SortKey::Sm => rows.sort_by_key(|r| Reverse(r.sm_util_percent)),
        SortKey::Procs => rows.sort_by_key(|r| Reverse(r.processes.len())),
        SortKey::Launches => rows.sort_by(|a, b| {
            let key = |r: &Row| (r.launches_per_sec.unwrap_or(0.0), r.launches_total);
            let (ka, kb) = (key(a), key(b));
            kb.0.total_cmp(&ka.0).then(kb.1.cmp(&ka.1))
        }),
        SortKey::Findings => rows.sort_by_key(|r| Reverse(r.findings.len())),
        SortKey::Name => {}
    }
}

/// Plain text lines (no escape codes: names and findings, which tenants
/// choose through their paths, are escaped), widest name first trimmed to
/// fit `width` columns.
pub fn table(rows: &[Row], width: usize) -> Vec<String> {
    const FIXED: usize = 4 + 24 + 12 + 6 + 10 + 2;
    let name_w = width.saturating_sub(FIXED + 16).clamp(12, 60);
    let mut out = vec![format!(
        "{:<name_w$} {:>3} {:>23} {:>11} {:>5} {:>9}  FINDINGS",
        "CONTAINER", "DEV", "MEMORY USED / LIMIT", "SM % / LIM", "PROCS", "LAUNCH/S"
    )];
    for r in rows {
        let mut name = escape_controls(&r.name()).into_owned();
        if name.chars().count() > name_w {
            let tail: String = name.chars().rev().take(name_w - 1).collect();
            name = format!("…{}", tail.chars().rev().collect::<String>());
        }
        let limit = rules::memory_limit(r.memory_limit_bytes).map_or("none".to_owned(), bytes);
        let sm_limit = if rules::sm_limit(r.sm_limit_percent).is_none() {
            "none".to_owned()
        } else {
            r.sm_limit_percent.to_string()
        };
        let findings = if r.findings.is_empty() {
            "-".to_owned()
        } else {
            escape_controls(&r.findings.join(",")).into_owned()
        };
        let launches = match r.launches_per_sec {
            None => "-".to_owned(),
            Some(v) if v < 100.0 => format!("{v:.1}"),
            Some(v) => format!("{v:.0}"),
        };
        out.push(format!(
            "{name:<name_w$} {:>3} {:>23} {:>11} {:>5} {launches:>9}  {findings}",
            r.device,
            format!("{} / {limit}", bytes(r.memory_used_bytes)),
            format!("{} / {sm_limit}", r.sm_util_percent),
            r.processes.len(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, mem: u64, sm: u64, procs: usize) -> Row {
        Row {
            pod_uid: Some(name.into()),
            pod: None,
            container: Some("c".into()),
            region: format!("/r/{name}"),
            device: 0,
            uuid: String::new(),
            memory_used_bytes: mem,
            memory_limit_bytes: 1 << 30,
            sm_util_percent: sm,
            sm_util_source: "slots",
            sm_limit_percent: 100,
            processes: (0..procs)
                .map(|i| RowProcess {
                    pid: i as i32 + 1,
                    hostpid: 0,
                    used_bytes: 0,
                    sm_util_percent: 0,
                    launches: 0,
                })
                .collect(),
            launches_total: 0,
            launches_per_sec: None,
            findings: Vec::new(),
        }
    }

    fn summary(slot_util: u64) -> RegionSummary {
        use super::super::summary::{DeviceSummary, LockSummary, SlotSummary, SlotUsage};
        RegionSummary {
            path: "/r/p_c/x.cache".into(),
            pod_uid: Some("p".into()),
            container: Some("c".into()),
            major_version: 1,
            minor_version: 2,
            device_num: 1,
            devices: vec![DeviceSummary {
                index: 0,
                uuid: "GPU-x".into(),
                limit_bytes: 1 << 30,
                sm_limit_percent: 30,
                used_bytes: 100,
            }],
            proc_num: 1,
            priority: 1,
            utilization_switch: 0,
            recent_kernel: 0,
            last_kernel_time: 0,
            lock: LockSummary {
                owner_pid: 0,
                held: None,
                owner: None,
                sem_value: 1,
                sem_postinit_value: 1,
            },
            slots: vec![SlotSummary {
                index: 0,
                pid: 1,
                hostpid: 4711,
                alive: None,
                status: 1,
                status_name: "running",
                usage: vec![SlotUsage {
                    device: 0,
                    context_bytes: 0,
                    module_bytes: 0,
                    data_bytes: 100,
                    total_bytes: 100,
                    monitor_used_bytes: 0,
                    sm_util: slot_util,
                    launches: 40,
                    host_bytes: 0,
                }],
            }],
            free_slots: 0,
            findings: Vec::new(),
        }
    }

    #[test]
    fn the_daemons_measurement_wins_over_the_slots() {
        let daemon = serde_json::json!({"findings": [
            {"kind": "no_region", "pod_uid": "p"},
            {"kind": "over_limit", "pod_uid": "other"},
        ]});
        let measured = Input {
            summary: summary(0),
            measured: vec![(0, 33)],
        };
        let r = &rows(&[measured], Some(&daemon))[0];
        assert_eq!((r.sm_util_percent, r.sm_util_source), (33, "daemon"));
        assert_eq!((r.sm_limit_percent, r.memory_used_bytes), (30, 100));
        assert_eq!(r.findings, ["no_region"]);
        assert_eq!(r.processes[0].hostpid, 4711);
        assert_eq!((r.launches_total, r.launches_per_sec), (40, None));
        let slots = Input {
            summary: summary(12),
            measured: Vec::new(),
        };
        let r = &rows(&[slots], None)[0];
        assert_eq!((r.sm_util_percent, r.sm_util_source), (12, "slots"));
        assert!(r.findings.is_empty());
    }

    #[test]
    fn sort_keys_order_largest_first_and_names_alphabetically() {
        let mut rs = vec![
            row("b", 10, 90, 1),
            row("a", 30, 10, 3),
            row("c", 20, 50, 2),
        ];
        let names = |rs: &[Row]| {
            rs.iter()
                .map(|r| r.pod_uid.clone().unwrap())
                .collect::<String>()
        };
        sort(&mut rs, SortKey::Mem);
        assert_eq!(names(&rs), "acb");
        sort(&mut rs, SortKey::Sm);
        assert_eq!(names(&rs), "bca");
        sort(&mut rs, SortKey::Procs);
        assert_eq!(names(&rs), "acb");
        sort(&mut rs, SortKey::Name);
        assert_eq!(names(&rs), "abc");
    }

    #[test]
    fn a_known_pod_is_named_instead_of_its_uid() {
        let mut r = row("0f9c1d2e", 0, 0, 0);
        assert_eq!(r.name(), "0f9c1d2e/c");
        r.pod = Some("ml-team/trainer".into());
        assert_eq!(r.name(), "ml-team/trainer/c");
    }

    #[test]
    fn table_shows_usage_limits_and_none() {
        let mut r = row("pod", 512 << 20, 42, 2);
        r.sm_limit_percent = 30;
        r.findings = vec!["dead_slot".into()];
        let mut u = row("other", 0, 0, 0);
        u.memory_limit_bytes = 0;
        let t = table(&[r, u], 100);
        assert!(t[0].starts_with("CONTAINER"), "{t:?}");
        assert!(t[1].starts_with("pod/c "), "{t:?}");
        assert!(t[1].contains("512 MiB / 1 GiB"), "{t:?}");
        assert!(t[1].contains("42 / 30"), "{t:?}");
        assert!(t[1].ends_with("dead_slot"), "{t:?}");
        assert!(t[0].contains("LAUNCH/S"), "{t:?}");
        assert!(t[1].contains(" -  dead_slot"), "{t:?}");
        assert!(t[2].contains("0 B / none"), "{t:?}");
        assert!(t[2].contains("0 / none"), "{t:?}");
        assert!(t.iter().all(|l| !l.contains('\x1b')));
    }

    #[test]
    fn launch_rates_count_what_each_process_launched_since_the_last_sample() {
        let mut prev = row("pod", 0, 0, 3);
        for (p, n) in prev.processes.iter_mut().zip([100, 50, 70]) {
            p.launches = n;
        }
        let mut now = prev.clone();
        // Process 1 launched 300 more; process 2 is gone (exited); process
        // 3's count fell (another process in its slot: all 20 are new); a
        // new process 4 launched 80.
        now.processes[0].launches = 400;
        now.processes.remove(1);
        now.processes[1].launches = 20;
        now.processes.push(RowProcess {
            pid: 4,
            hostpid: 0,
            used_bytes: 0,
            sm_util_percent: 0,
            launches: 80,
        });
        let mut other = row("other", 0, 0, 1);
        other.processes[0].launches = 10;
        let mut rows = vec![now, other.clone()];
        rates(&mut rows, &[prev, other], 2.0);
        assert_eq!(rows[0].launches_per_sec, Some((300.0 + 20.0 + 80.0) / 2.0));
        assert_eq!(rows[1].launches_per_sec, Some(0.0));
        let t = table(&rows, 100);
        assert!(t[1].contains("  200  "), "{t:?}");
        assert!(t[2].contains("  0.0  "), "{t:?}");
        sort(&mut rows, SortKey::Launches);
        assert_eq!(rows[0].pod_uid.as_deref(), Some("pod"));
    }
}
