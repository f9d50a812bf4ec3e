//! `vgpu top`: a live per-node view of every container on every GPU.

use std::io::{IsTerminal as _, Write as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::daemon::collect::pods::PodNames;
use crate::daemon::judge::utilization::{State, FILE_NAME as UTILIZATION};
use crate::daemon::state::findings::read_state_file;
use crate::printable::escape_controls;
use crate::regions::top::{rates, rows, sort, table, Input, Row, SortKey};

/// The daemon's measurements are used while at most this old.
const FRESH_MS: u64 = 5_000;

/// Live view of the node: one row per container and device.
///
/// Each row shows memory used / limit, SM utilization / SM limit (percent:
/// `vgpu daemon`'s per-container NVML measurement from its state directory
/// when fresh, else the slots' `sm_util`), the processes
/// using the device, launches per second (counted by each process's hook in
/// its slot; "-" on the first frame, which has no earlier sample) and
/// findings (the region's own, as `vgpu inspect`, and
/// `vgpu daemon`'s about the container when its state directory is there).
/// Containers are named `<namespace>/<pod>/<container>` when the kubelet's
/// pod log directory (--pods-log-dir, as the daemon's metric labels) names
/// the pod, else `<podUID>/<container>`.
/// Reads the region files, the daemon's findings file and the pod log
/// directory only; attaches nothing. Refreshes every --interval seconds
/// until `q` or Ctrl-C, plain text: on a terminal the screen is cleared
/// and redrawn in place (no alternate screen, so it works over ssh and
/// leaves the last frame visible); otherwise frames follow each other. See
/// docs/inspect.md.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    at: super::regions_arg::Where,

    /// State directory of `vgpu daemon` (its findings.json).
    #[arg(long, value_name = "DIR", default_value = "/run/vgpu")]
    state_dir: PathBuf,

    /// The kubelet's pod log directory: its `<namespace>_<pod>_<uid>`
    /// entries name the pods.
    #[arg(long, value_name = "DIR", default_value = vgpu_common::paths::PODS_LOG_DIR)]
    pods_log_dir: PathBuf,

    /// Print one snapshot as JSON and exit.
    #[arg(long)]
    json: bool,

    /// With --json: sample twice this many seconds apart and report each
    /// row's launches_per_sec over that window (0: one sample, cumulative
    /// launches_total only).
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS", requires = "json", value_parser = super::bounds::seconds(0.0, 3600.0))]
    json_window: f64,

    /// Sort rows by this key.
    #[arg(long, value_enum, default_value_t = SortKey::Mem)]
    sort: SortKey,

    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS", value_parser = super::bounds::seconds(0.1, 3600.0))]
    interval: f64,

    /// Stop after this many frames (0: until interrupted).
    #[arg(long, default_value_t = 0, value_name = "N")]
    count: u64,
}

#[derive(serde::Serialize)]
struct Snapshot {
    updated_unix_ms: u64,
    rows: Vec<Row>,
    /// Region files that could not be read: (path, error).
    errors: Vec<(PathBuf, String)>,
    /// Whether the daemon's findings file was read.
    daemon: bool,
    /// Whether the daemon's utilization file was read (and fresh).
    daemon_utilization: bool,
}

fn snapshot(args: &Args, pods: &mut PodNames) -> anyhow::Result<Snapshot> {
    // As `vgpu inspect`: files under a root are opened below it, read
    // with pread, never mapped.
    let (found, root) = args.at.find()?;
    let now = crate::daemon::state::findings::now_ms();
    let util: Option<State> = read_state_file(&args.state_dir, UTILIZATION)
        .filter(|s: &State| now.saturating_sub(s.updated_unix_ms) <= FRESH_MS);
    let mut inputs = Vec::new();
    let mut errors = Vec::new();
    for f in &found {
        match super::inspect::summarize(f, root) {
            Ok(summary) => {
                // The daemon keys regions by inode, whatever path names them.
                let key = std::fs::symlink_metadata(&f.path)
                    .ok()
                    .map(|m| (m.dev(), m.ino()));
                let measured = util
                    .as_ref()
                    .zip(key)
                    .map(|(u, k)| {
                        summary
                            .devices
                            .iter()
                            .filter_map(|d| u.get(k, d.index).map(|p| (d.index, p)))
                            .collect()
                    })
                    .unwrap_or_default();
                inputs.push(Input { summary, measured });
            }
            Err(e) => errors.push((f.path.clone(), e)),
        }
    }
    let daemon = crate::daemon::state::findings::read_state(&args.state_dir);
    let mut rs = rows(&inputs, daemon.as_ref());
    // Off Kubernetes there is no such directory: nothing to say about it.
    if args.pods_log_dir.is_dir() {
        pods.refresh();
    }
    for r in &mut rs {
        r.pod = r
            .pod_uid
            .as_deref()
            .and_then(|uid| pods.get(uid))
            .map(|p| format!("{}/{}", p.namespace, p.pod));
    }
    Ok(Snapshot {
        updated_unix_ms: now,
        rows: rs,
        errors,
        daemon: daemon.is_some(),
        daemon_utilization: util.is_some(),
    })
}

fn frame(s: &Snapshot, width: usize, sort: SortKey) -> String {
    let secs = s.updated_unix_ms / 1000;
    let containers = s
        .rows
        .iter()
        .map(|r| r.region.as_str())
        .collect::<std::collections::HashSet<_>>()
        .len();
    let mut out = format!(
        "vgpu top: {containers} container(s), {} row(s), {:02}:{:02}:{:02} UTC, sort {sort:?}, daemon findings {}\n",
        s.rows.len(),
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60,
        if s.daemon { "read" } else { "absent" },
    );
    for l in table(&s.rows, width) {
        out.push_str(&l);
        out.push('\n');
    }
    for (p, e) in &s.errors {
        let line = format!("{}: {e}", p.display());
        out.push_str(&escape_controls(&line));
        out.push('\n');
    }
    out
}

fn width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(120)
}

/// Runs `vgpu top`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut pods = PodNames::new(args.pods_log_dir.clone());
    if args.json {
        let mut s = snapshot(&args, &mut pods)?;
        if args.json_window > 0.0 {
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(args.json_window));
            let first = std::mem::replace(&mut s, snapshot(&args, &mut pods)?);
            rates(&mut s.rows, &first.rows, t0.elapsed().as_secs_f64());
        }
        sort(&mut s.rows, args.sort);
        let mut w = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut w, &s).context("writing JSON")?;
        writeln!(w)?;
        return Ok(ExitCode::SUCCESS);
    }
    let tty = std::io::stdout().is_terminal();
    let every = Duration::from_secs_f64(args.interval.max(0.1));
    let mut n = 0u64;
    let mut prev: Option<(Vec<Row>, Instant)> = None;
    let mut keys = super::top_keys::Keys::new();
    loop {
        let mut s = snapshot(&args, &mut pods)?;
        let taken = Instant::now();
        if let Some((p, at)) = &prev {
            rates(&mut s.rows, p, taken.duration_since(*at).as_secs_f64());
        }
        sort(&mut s.rows, args.sort);
        let mut w = std::io::stdout().lock();
        if tty {
            // Cursor home and clear: redraw in place, no alternate screen.
            write!(w, "\x1b[H\x1b[2J")?;
        } else if n > 0 {
            writeln!(w)?;
        }
        write!(w, "{}", frame(&s, width(), args.sort))?;
        w.flush()?;
        drop(w);
        prev = Some((s.rows, taken));
        n += 1;
        if args.count != 0 && n >= args.count {
            return Ok(ExitCode::SUCCESS);
        }
        if keys.wait(every) {
            return Ok(ExitCode::SUCCESS);
        }
    }
}
