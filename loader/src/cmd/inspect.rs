//! `vgpu inspect`: shared regions, their limits, slots, lock and findings.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::printable::escape_controls;
use crate::regions::discover::Found;
use crate::regions::liveness::{Alive, AliveBy, Mappers};
use crate::regions::open::{open_region, open_under, Access};
use crate::regions::summary::{bytes, RegionSummary};

/// Show HAMi shared regions: limits, process slots, the lock, and findings.
///
/// Reads one region file (PATH), or every region under a root of HAMi
/// container directories (`<podUID>_<containerName>/*.cache`, files named
/// like libvgpu.so skipped). Nothing is written. For each region it shows
/// the version, per-device memory and SM limits and usage, every slot (pid,
/// host pid, whether the process lives and how that was decided, usage by
/// kind, status), proc_num, priority, utilization switch, recent kernel,
/// last kernel time, the lock holder, and findings: dead slots, missing host
/// PIDs, usage over the limit, counter anomalies. See docs/inspect.md.
///
/// Liveness is decided by /proc/<hostpid> when the host PID is known, else
/// by finding the process that maps the region with that PID in its
/// namespace (needs root to read every /proc/<pid>/maps), else by the pid
/// in this namespace (marked "pid?").
///
/// Exits 1 if any region could not be read.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    at: super::regions_arg::Where,

    /// Print JSON (format in docs/inspect.md) instead of tables.
    #[arg(long)]
    json: bool,

    /// State directory of `vgpu daemon`: its findings (untracked
    /// allocations, CUDA processes without a region) are added to --json as
    /// `daemon_findings` (docs/daemon.md).
    #[arg(long, value_name = "DIR", default_value = "/run/vgpu")]
    state_dir: PathBuf,
}

#[derive(serde::Serialize)]
struct Output {
    regions: Vec<RegionSummary>,
    errors: Vec<ReadError>,
    /// `vgpu daemon`'s findings file, when the daemon runs on this node.
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_findings: Option<serde_json::Value>,
}

#[derive(serde::Serialize)]
struct ReadError {
    path: PathBuf,
    error: String,
}

/// Opens a region without following symlinks: below `root` for files
/// found there, the whole path for a file named on the command line.
/// Opens (confined under `root` when scanning one) and summarizes a region.
pub(super) fn summarize(found: &Found, root: Option<&Path>) -> Result<RegionSummary, String> {
    let file = match root {
        Some(root) => open_under(root, &found.path, Access::ReadOnly),
        None => open_region(&found.path, Access::ReadOnly),
    }
    .map_err(|e| e.to_string())?;
    let mappers = Mappers::scan(file.file());
    RegionSummary::read(&file, found.owner.as_ref(), &mappers).map_err(|e| e.to_string())
}

/// Runs `vgpu inspect`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (found, root) = args.at.find()?;
    let mut out = Output {
        regions: Vec::new(),
        errors: Vec::new(),
        daemon_findings: crate::daemon::state::findings::read_state(&args.state_dir),
    };
    for f in &found {
        match summarize(f, root) {
            Ok(s) => out.regions.push(s),
            // One file: its error is the command's error.
            Err(e) if root.is_none() => anyhow::bail!("{e}"),
            Err(error) => out.errors.push(ReadError {
                path: f.path.clone(),
                error,
            }),
        }
    }
    super::report(args.json, &out, !out.errors.is_empty(), |w, out| {
        if found.is_empty() {
            writeln!(w, "no region files under {}", shown(args.at.shown()))?;
        }
        for s in &out.regions {
            print_region(w, s)?;
        }
        for e in &out.errors {
            writeln!(w, "{}: {}", shown(&e.path), escape_controls(&e.error))?;
        }
        Ok(())
    })
}

/// A path for the text output: file names under a root are the tenants'.
fn shown(p: &Path) -> String {
    escape_controls(&p.display().to_string()).into_owned()
}

fn alive_text(a: &Option<Alive>) -> String {
    match a {
        None => "-".to_owned(),
        Some(a) => {
            let by = match a.by {
                AliveBy::Hostpid => "",
                AliveBy::Mapping => " (mapping)",
                AliveBy::Pid => " (pid?)",
            };
            format!("{}{by}", if a.alive { "yes" } else { "DEAD" })
        }
    }
}

fn ago(unix: u64) -> String {
    if unix == 0 {
        return "never".to_owned();
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{unix} ({}s ago)", now.saturating_sub(unix))
}

/// The text form of one region. Every string from the region's file or
/// its path (UUIDs, file names) is a tenant's: escaped, so that its bytes
/// never drive the admin's terminal.
fn print_region(w: &mut impl std::io::Write, s: &RegionSummary) -> std::io::Result<()> {
    write!(w, "{}", shown(&s.path))?;
    if let (Some(pod), Some(ctr)) = (&s.pod_uid, &s.container) {
        write!(
            w,
            "  pod {} container {}",
            escape_controls(pod),
            escape_controls(ctr)
        )?;
    }
    writeln!(w)?;
    writeln!(
        w,
        "  version {}.{}  device_num {}  proc_num {}  priority {}  utilization_switch {}  recent_kernel {}  last_kernel_time {}",
        s.major_version,
        s.minor_version,
        s.device_num,
        s.proc_num,
        s.priority,
        s.utilization_switch,
        s.recent_kernel,
        ago(s.last_kernel_time)
    )?;
    let l = &s.lock;
    let held = match l.held {
        Some(true) => "held",
        Some(false) => "free",
        None => "unknown",
    };
    write!(w, "  lock {held}  owner_pid {}", l.owner_pid)?;
    if l.owner_pid != 0 {
        write!(w, " alive {}", alive_text(&l.owner))?;
    }
    writeln!(
        w,
        "  sem {}  sem_postinit {}",
        l.sem_value, l.sem_postinit_value
    )?;
    writeln!(
        w,
        "  {:<4} {:<44} {:>12} {:>4} {:>12}",
        "DEV", "UUID", "LIMIT", "SM%", "USED"
    )?;
    for d in &s.devices {
        let limit = vgpu_common::region::rules::memory_limit(d.limit_bytes)
            .map_or("none".to_owned(), bytes);
        let sm = if vgpu_common::region::rules::sm_limit(d.sm_limit_percent).is_none() {
            "none".to_owned()
        } else {
            d.sm_limit_percent.to_string()
        };
        let uuid = if d.uuid.is_empty() {
            "-".into()
        } else {
            escape_controls(&d.uuid)
        };
        writeln!(
            w,
            "  {:<4} {:<44} {:>12} {:>4} {:>12}",
            d.index,
            uuid,
            limit,
            sm,
            bytes(d.used_bytes)
        )?;
    }
    writeln!(
        w,
        "  {:<4} {:>8} {:>8} {:<14} {:<9} {:>3} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "SLOT",
        "PID",
        "HOSTPID",
        "ALIVE",
        "STATUS",
        "DEV",
        "CONTEXT",
        "MODULE",
        "DATA",
        "TOTAL",
        "HOST"
    )?;
    for slot in &s.slots {
        let head = format!(
            "  {:<4} {:>8} {:>8} {:<14} {:<9}",
            slot.index,
            slot.pid,
            slot.hostpid,
            alive_text(&slot.alive),
            slot.status_name
        );
        if slot.usage.is_empty() {
            writeln!(w, "{head}")?;
        }
        for (i, u) in slot.usage.iter().enumerate() {
            let lead = if i == 0 { head.as_str() } else { "" };
            writeln!(
                w,
                "{lead:<50} {:>3} {:>11} {:>11} {:>11} {:>11} {:>11}",
                u.device,
                bytes(u.context_bytes),
                bytes(u.module_bytes),
                bytes(u.data_bytes),
                bytes(u.total_bytes),
                bytes(u.host_bytes)
            )?;
        }
    }
    if s.free_slots > 0 {
        writeln!(w, "  ({} free slots below proc_num)", s.free_slots)?;
    }
    if s.findings.is_empty() {
        writeln!(w, "  findings: none")?;
    } else {
        writeln!(w, "  findings:")?;
        for f in &s.findings {
            let sev = serde_json::to_value(f.severity)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let kind = serde_json::to_value(f.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            writeln!(w, "    {sev:<7} {kind:<24} {}", escape_controls(&f.message))?;
        }
    }
    writeln!(w)
}
