//! `vgpu turns`: the node's tables of limited containers that take turns on
//! a GPU (docs/sm-limit.md, "Time division between containers").

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

use anyhow::Context as _;
use vgpu_common::clock;
use vgpu_common::node::{self, NodeFile, NodeView, ACTIVE_NS, FRAME_NS};
use vgpu_common::paths::VGPULOCK_DIR;

use crate::printable::escape_controls;
use crate::regions::open::{open_file, Access};

/// Show which SM-limited containers take turns on each GPU, and their turns.
///
/// Containers with an SM limit that set `VGPU_SM_NODE_DIR` (HAMi's
/// /tmp/vgpulock) share a table per GPU there, `vgpu-sm-<GPU UUID>`. Those
/// that use at least 70 % of their share take turns: each runs only in its
/// phase of a 50 ms frame (its limit's share of it). This lists every
/// member of every table: its container id, limit, when it last launched
/// and last wanted its share, its state, and its turn. Nothing is written.
///
/// States: "taking turns"; "wants its share" (the only one that does: its
/// bucket limits it); "under its share" (launching but not using most of
/// its share: not waited for); "idle" (no launch for 200 ms); "stale" (no
/// launch for 10 s: its member may be reused); "not valid" (an instant
/// ahead of the clock, which no hook writes: any container can write the
/// table, and such a member counts for nobody).
///
/// Exits 1 if a table could not be read.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The node directory, or one table file in it.
    #[arg(value_name = "PATH", default_value = VGPULOCK_DIR)]
    path: PathBuf,

    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize, Debug)]
struct Output {
    tables: Vec<Table>,
    errors: Vec<ReadError>,
}

#[derive(serde::Serialize, Debug)]
struct ReadError {
    path: PathBuf,
    error: String,
}

/// One GPU's table.
#[derive(serde::Serialize, Debug)]
struct Table {
    path: PathBuf,
    frame_ms: f64,
    members: Vec<Member>,
}

#[derive(serde::Serialize, Debug, PartialEq)]
struct Member {
    /// The container's id, hex.
    container: String,
    limit: u32,
    /// `None`: its instants are not valid (ahead of the clock).
    last_launch_ms_ago: Option<f64>,
    /// `None`: it never used most of its share.
    wanted_ms_ago: Option<f64>,
    state: &'static str,
    /// `[start, end)` ms within every frame, while taking turns.
    turn_ms: Option<[f64; 2]>,
}

fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e5).round() / 10.0
}

/// Every member of `t` as of `now` (CLOCK_MONOTONIC ns), in id order.
fn members(t: &NodeFile, now: u64) -> Vec<Member> {
    let wanting = t.wanting(now, ACTIVE_NS);
    let mut out: Vec<Member> = t
        .members
        .iter()
        .filter_map(|m| {
            let id = m.owner.load(Acquire);
            if id == 0 {
                return None;
            }
            let seen = now.saturating_sub(m.seen.load(Relaxed));
            let wants = m.wants.load(Relaxed);
            let wanted = (wants != 0).then(|| now.saturating_sub(wants));
            let turn = node::plan(&wanting, id);
            let valid = m.valid(now);
            let state = if !valid {
                "not valid"
            } else if turn.is_some() {
                "taking turns"
            } else if m.wanted_within(now, ACTIVE_NS) {
                "wants its share"
            } else if m.is_stale(now) {
                "stale"
            } else if seen > ACTIVE_NS {
                "idle"
            } else {
                "under its share"
            };
            Some(Member {
                container: format!("{id:016x}"),
                limit: m.limit.load(Relaxed),
                last_launch_ms_ago: valid.then(|| ms(seen)),
                wanted_ms_ago: wanted.filter(|_| valid).map(ms),
                state,
                turn_ms: turn.map(|p| [ms(p.start), ms(p.start + p.len)]),
            })
        })
        .collect();
    out.sort_by(|a, b| a.container.cmp(&b.container));
    out
}

/// The table files to read: `path` itself, or the `vgpu-sm-*` files in it.
fn table_paths(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    anyhow::ensure!(
        path.exists(),
        "{}: no such node directory or table (the containers' VGPU_SM_NODE_DIR; \
         HAMi mounts /tmp/vgpulock)",
        path.display()
    );
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut v: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading {}", path.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("vgpu-sm-"))
        .map(|e| e.path())
        .collect();
    v.sort();
    Ok(v)
}

/// Runs `vgpu turns`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let paths = table_paths(&args.path)?;
    let mut out = Output {
        tables: Vec::new(),
        errors: Vec::new(),
    };
    for p in &paths {
        let view = open_file(p, Access::ReadOnly)
            .map_err(|e| e.to_string())
            .and_then(|f| NodeView::from_file(&f, p).map_err(|e| e.to_string()));
        match view {
            Ok(v) => out.tables.push(Table {
                path: p.clone(),
                frame_ms: ms(FRAME_NS),
                members: members(v.table(), clock::monotonic_ns()),
            }),
            Err(error) => out.errors.push(ReadError {
                path: p.clone(),
                error,
            }),
        }
    }
    super::report(args.json, &out, !out.errors.is_empty(), |w, out| {
        print(w, &args.path, out)
    })
}

fn print(w: &mut impl std::io::Write, path: &Path, out: &Output) -> std::io::Result<()> {
    if out.tables.is_empty() && out.errors.is_empty() {
        writeln!(
            w,
            "no node tables in {}: no SM-limited container there has set VGPU_SM_NODE_DIR to it",
            path.display()
        )?;
    }
    for t in &out.tables {
        let taking = t.members.iter().filter(|m| m.turn_ms.is_some()).count();
        writeln!(
            w,
            "{}: {} member(s), {taking} taking turns in a {} ms frame",
            escape_controls(&t.path.display().to_string()),
            t.members.len(),
            t.frame_ms
        )?;
        writeln!(
            w,
            "  {:<16}  {:>5}  {:>12}  {:>12}  {:<16}  turn",
            "container", "limit", "launched", "wanted", "state"
        )?;
        for m in &t.members {
            let valid = m.last_launch_ms_ago.is_some();
            let wanted = match m.wanted_ms_ago {
                _ if !valid => "-".to_owned(),
                Some(a) => format!("{a:.0} ms ago"),
                None => "never".to_owned(),
            };
            let launched = m
                .last_launch_ms_ago
                .map_or("-".to_owned(), |a| format!("{a:.0} ms ago"));
            let turn = m
                .turn_ms
                .map_or("-".to_owned(), |[a, b]| format!("{a:.1}-{b:.1} ms"));
            writeln!(
                w,
                "  {:<16}  {:>4}%  {:>12}  {:>12}  {:<16}  {turn}",
                m.container, m.limit, launched, wanted, m.state
            )?;
        }
    }
    for e in &out.errors {
        let line = format!("{}: {}", e.path.display(), e.error);
        writeln!(w, "{}", escape_controls(&line))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_common::node::STALE_NS;

    const MS: u64 = 1_000_000;

    #[test]
    fn members_are_described_by_what_they_do() {
        let t = NodeFile::default();
        let now = 1_000 * STALE_NS;
        let join = |id: u64, pct: u32, seen: u64, wants: Option<u64>| {
            let m = t.join(id, now).expect("room");
            m.limit.store(pct, Relaxed);
            m.seen.store(now - seen, Relaxed);
            if let Some(w) = wants {
                m.wants.store(now - w, Relaxed);
            }
        };
        join(0xa, 30, MS, Some(MS));
        join(0xb, 70, 2 * MS, Some(5 * MS));
        join(0xc, 50, 3 * MS, None);
        join(0xd, 20, ACTIVE_NS + MS, Some(ACTIVE_NS + MS));
        join(0xe, 10, STALE_NS + MS, None);
        // Any container can write the table: a member whose instants are
        // ahead of the clock is flagged, not shown as launching now.
        let forged = &t.members[5];
        forged.owner.store(0xf, Relaxed);
        forged.rank.store(1, Relaxed);
        for w in [&forged.seen, &forged.wants, &forged.inflight_until] {
            w.store(i64::MAX as u64, Relaxed);
        }
        let got = members(&t, now);
        let states: Vec<(&str, &str, Option<[f64; 2]>)> = got
            .iter()
            .map(|m| (&m.container[14..], m.state, m.turn_ms))
            .collect();
        assert_eq!(
            states,
            vec![
                ("0a", "taking turns", Some([0.0, 15.0])),
                ("0b", "taking turns", Some([15.0, 50.0])),
                ("0c", "under its share", None),
                ("0d", "idle", None),
                ("0e", "stale", None),
                ("0f", "not valid", None),
            ]
        );
        assert_eq!(got[5].last_launch_ms_ago, None);
        assert_eq!(got[1].wanted_ms_ago, Some(5.0));
        assert_eq!(got[2].wanted_ms_ago, None);
        assert_eq!(got[1].last_launch_ms_ago, Some(2.0));

        // Alone in wanting: its bucket limits it, no turn.
        let t = NodeFile::default();
        let m = t.join(0xa, now).expect("room");
        m.touch(now, 30);
        m.want(now);
        assert_eq!(members(&t, now)[0].state, "wants its share");

        let mut buf = Vec::new();
        let out = Output {
            tables: vec![Table {
                path: "/tmp/vgpulock/vgpu-sm-GPU-1".into(),
                frame_ms: 50.0,
                members: got,
            }],
            errors: Vec::new(),
        };
        print(&mut buf, Path::new("/tmp/vgpulock"), &out).expect("print");
        let text = String::from_utf8(buf).expect("utf-8");
        assert!(
            text.contains("6 member(s), 2 taking turns in a 50 ms frame"),
            "{text}"
        );
        let line = text.lines().find(|l| l.contains("000f")).expect("0f");
        assert!(
            line.contains("not valid") && !line.contains("ms ago"),
            "{line}"
        );
        assert!(text.contains("15.0-50.0 ms"), "{text}");
    }
}
