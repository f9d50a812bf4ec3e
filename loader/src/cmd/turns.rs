//! `vgpu turns`: the plan of turns and priority holds the daemon made for
//! each GPU (docs/sm-limit.md, "Time division between containers").

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use crate::daemon::plan::{Report, TURNS_FILE};
use crate::daemon::state::findings::now_ms;
use crate::regions::open::{open_file, Access, OpenError};

/// A plan older than this is not the work of a running daemon.
const STALE_MS: u64 = 5_000;
/// A view larger than this is not the daemon's.
const MAX_VIEW_BYTES: u64 = 4 << 20;

/// Show the daemon's plan: which containers take turns, which are held.
///
/// Per GPU: which SM-limited containers take turns, and which containers
/// are held for higher-priority ones.
///
/// `vgpu daemon` alone plans this, from each container's runtime spec
/// (its SM limit, CUDA_TASK_PRIORITY) and NVML's view of who uses each GPU,
/// and writes each container its plan into its own sidecar. It leaves its
/// last view in <state-dir>/turns.json, which this prints: per GPU, each
/// container's limit and priority, whether NVML confirms it uses the GPU,
/// whether it launched lately, its turn in the 50 ms frame, and whether
/// it is held. Nothing is written.
///
/// Without a running daemon (no view, or one older than 5 s) containers do
/// not coordinate: each keeps its own SM limit, as HAMi-core does; this
/// says so and exits 1.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The daemon's --state-dir.
    #[arg(long, value_name = "DIR", default_value = "/run/vgpu")]
    state_dir: PathBuf,

    /// Print the daemon's JSON as it is.
    #[arg(long)]
    json: bool,
}

/// What `vgpu turns` concludes from the file at `path` at `now_ms`.
enum View {
    Planned(Report, String),
    Absent(String),
}

fn view(path: &Path, now: u64) -> anyhow::Result<View> {
    let body = match read_bounded(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(View::Absent(format!(
                "no plan in {}: no vgpu daemon plans this node's GPUs; containers do not \
                 coordinate, each keeps its own SM limit",
                path.display()
            )))
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    let r: Report =
        serde_json::from_slice(&body).with_context(|| format!("parsing {}", path.display()))?;
    let age = now.saturating_sub(r.at_unix_ms);
    if age > STALE_MS {
        return Ok(View::Absent(format!(
            "the plan in {} is {:.0} s old: no vgpu daemon plans this node's GPUs now; \
             containers do not coordinate, each keeps its own SM limit",
            path.display(),
            age as f64 / 1e3
        )));
    }
    Ok(View::Planned(r, text))
}

/// The view's bytes: opened without following a link, refused unless a
/// regular file (a FIFO there would block a plain read), at most 4 MiB.
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let file = match open_file(path, Access::ReadOnly) {
        Ok(f) => f,
        Err(OpenError::Missing { .. }) => return Err(std::io::ErrorKind::NotFound.into()),
        Err(e) => return Err(std::io::Error::other(e.to_string())),
    };
    let mut body = Vec::new();
    file.take(MAX_VIEW_BYTES).read_to_end(&mut body)?;
    Ok(body)
}

/// Runs `vgpu turns`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let path = args.state_dir.join(TURNS_FILE);
    match view(&path, now_ms())? {
        View::Absent(why) => {
            println!("{why}");
            Ok(ExitCode::from(1))
        }
        View::Planned(r, text) => {
            if args.json {
                print!("{text}");
            } else {
                print!("{}", render(&r));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn render(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if r.gpus.is_empty() {
        s.push_str("no container with a runtime spec uses a GPU here\n");
    }
    for g in &r.gpus {
        let _ = writeln!(s, "GPU {} (frame {} ms)", g.uuid, r.frame_ms);
        s.push_str("  CONTAINER    DEV  LIMIT PRIO NVML       TURN           STATE\n");
        for c in &g.seats {
            let limit = c.sm_limit.map_or("-".to_owned(), |l| format!("{l}%"));
            let turn = c
                .turn_ms
                .map_or("-".to_owned(), |[a, b]| format!("{a:.1}-{b:.1} ms"));
            let state = match (c.held, c.turn_ms.is_some(), c.launching) {
                (true, _, _) => "held for a higher priority",
                (false, true, _) => "taking turns",
                (false, false, true) => "launching, its own limit",
                (false, false, false) => "idle",
            };
            let nvml = if c.confirmed { "confirmed" } else { "not seen" };
            let _ = writeln!(
                s,
                "  {:<12} {:>3} {:>6} {:>4} {:<10} {:<14} {}",
                crate::printable::escape_controls(&c.container),
                c.ordinal,
                limit,
                c.priority,
                nvml,
                turn,
                state
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: &str = r#"{"at_unix_ms": 1000000, "frame_ms": 50, "gpus": [{"uuid": "GPU-1",
        "seats": [{"container": "abc", "ordinal": 0, "sm_limit": 30, "priority": 1,
        "confirmed": true, "launching": true, "turn_ms": [0.0, 15.0], "held": false},
        {"container": "def", "ordinal": 0, "sm_limit": null, "priority": 1,
        "confirmed": false, "launching": false, "turn_ms": null, "held": true}]}]}"#;

    #[test]
    fn a_fresh_plan_is_shown_and_a_stale_or_missing_one_says_nobody_plans() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(TURNS_FILE);
        assert!(matches!(view(&p, 1_000_000).unwrap(), View::Absent(_)));
        std::fs::write(&p, PLAN).unwrap();
        let View::Planned(r, _) = view(&p, 1_001_000).unwrap() else {
            panic!("a fresh plan")
        };
        let out = render(&r);
        assert!(
            out.contains("0.0-15.0 ms") && out.contains("taking turns"),
            "{out}"
        );
        assert!(out.contains("held for a higher priority"), "{out}");
        let View::Absent(why) = view(&p, 1_000_000 + STALE_MS + 1).unwrap() else {
            panic!("a stale plan")
        };
        assert!(why.contains("each keeps its own SM limit"), "{why}");
    }
}
