//! One meaning per region value, whoever reads it: a region's `sm_limit`
//! as `vgpu inspect` (text and JSON), `vgpu top --json`, the daemon's
//! `/metrics` and the hook (the device time the simulated GPU measured for
//! a launch loop under it) read it. 0 and anything from 100 up mean "no
//! limit" to all four; a value in between is that limit to all four.
//! Needs the built artifacts (`cargo xtask build`) and root (the daemon).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use serde_json::Value;
use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::daemon::{Running as Daemon, Workdir};
use vgpu_tests::dist;
use vgpu_tests::hook::Running;
use vgpu_tests::sim::SimGpu;

const UID: &str = "0b6c3a52-9d1e-4f7a-b2c8-5e4d3c2b1a09";
const CONTAINER: &str = "main";

/// Device 0's busy share (percent) over the next `window`, as the
/// simulated GPU measured it.
fn device_share(gpu: &SimGpu, window: Duration) -> f64 {
    let from = simgpu::clock::mono_ns();
    std::thread::sleep(window);
    let to = simgpu::clock::mono_ns();
    let busy = simgpu::timeline::busy_between(gpu.shm(), 0, from, to);
    busy as f64 * 100.0 / (to - from) as f64
}

fn vgpu(args: &[&str], at: &Path) -> String {
    let out = Command::new(dist::vgpu_bin())
        .args(args)
        .arg(at)
        .output()
        .unwrap_or_else(|e| panic!("run vgpu {args:?}: {e}"));
    assert!(out.status.success(), "vgpu {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `vgpu inspect` shows as device 0's SM limit: (JSON, text column).
fn inspect_says(region: &Path) -> (Value, String) {
    let doc: Value = serde_json::from_str(&vgpu(&["inspect", "--json"], region)).unwrap();
    let json = doc["regions"][0]["devices"][0]["sm_limit_percent"].clone();
    let text = vgpu(&["inspect"], region);
    // The device table: `DEV UUID LIMIT SM% USED`, device 0's row first.
    let row = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("DEV"))
        .nth(1)
        .unwrap_or_else(|| panic!("no device row in:\n{text}"));
    let col: Vec<&str> = row.split_whitespace().collect();
    // DEV UUID LIMIT(value unit, or none) SM% USED(value unit).
    let sm = col[col.len() - 3].to_owned();
    (json, sm)
}

/// What `vgpu top --json` shows as the container's SM limit on device 0.
fn top_says(root: &Path, state: &Path) -> Value {
    let out = Command::new(dist::vgpu_bin())
        .args(["top", "--json", "--json-window", "0", "--root"])
        .arg(root)
        .arg("--state-dir")
        .arg(state)
        .output()
        .unwrap();
    assert!(out.status.success(), "vgpu top: {out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = doc["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["device"] == 0))
        .unwrap_or_else(|| panic!("no device 0 row: {doc:#}"));
    row["sm_limit_percent"].clone()
}

/// `vgpu_sm_limit_percent` of the container, once the daemon's render
/// shows `want` (it renders every scan); the last value seen otherwise.
fn metrics_say(d: &Daemon, want: u64) -> Option<u64> {
    let t = Instant::now();
    let mut last = None;
    while t.elapsed() < Duration::from_secs(10) {
        last = d
            .metrics()
            .lines()
            .find(|l| l.starts_with("vgpu_sm_limit_percent{") && l.contains(UID))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok());
        if last == Some(want) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    last
}

/// The hook's reading: whether the launch loop is held to about `limit`
/// (`Some`, ±10 points) or runs unlimited (`None`, above 90 %), judged by
/// the median of three windows, so that one window a loaded host skews
/// decides nothing either way.
fn hook_limits_to(gpu: &SimGpu, want: Option<u64>) -> Result<(), String> {
    let mut seen: Vec<f64> = (0..3)
        .map(|_| device_share(gpu, Duration::from_millis(1500)))
        .collect();
    let shown: Vec<String> = seen.iter().map(|s| format!("{s:.1}%")).collect();
    seen.sort_by(f64::total_cmp);
    let median = seen[1];
    eprintln!("hook at {want:?}: windows {shown:?}, median {median:.1}%");
    let ok = match want {
        None => median > 90.0,
        Some(l) => (median - l as f64).abs() <= 10.0,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "device share median {median:.1}% of windows {shown:?}, want {want:?} \
             (None: above 90, Some: ±10)"
        ))
    }
}

#[test]
fn inspect_top_metrics_and_the_hook_read_an_sm_limit_alike() {
    let gpu = SimGpu::new();
    let work = Workdir::new("vgpu-rules-", &["containers", "pods", "state"]);
    let region_dir = work.path("containers").join(format!("{UID}_{CONTAINER}"));
    std::fs::create_dir_all(&region_dir).unwrap();
    let region: PathBuf = region_dir.join("r.cache");

    let exe = dist::compile_c("sm_loop", work.root(), false);
    let mut c = Command::new(&exe);
    c.args(["kernel", "busy_1000us", "60"])
        .envs(work.envs(&gpu))
        .env("LD_PRELOAD", dist::hook_lib())
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
        .env("CUDA_DEVICE_SM_LIMIT", "30")
        .env("GPU_CORE_UTILIZATION_POLICY", "force");
    let mut p = Running::start(c);
    assert_eq!(p.wait_for("ready"), "ready", "sm_loop did not start");

    let d = work.start_daemon(
        &gpu,
        &work.path("state"),
        &work.path("containers"),
        &["--pods-log-dir", work.path("pods").to_str().unwrap()],
    );
    let file = RegionFile::open(&region, Access::ReadWrite).unwrap();
    let root = work.path("containers");
    let state = work.path("state");

    let mut wrong = Vec::new();
    // (raw sm_limit, what every reader must show: the percent, 100 = none).
    for (raw, shown) in [(30u64, 30u64), (150, 100), (0, 100), (100, 100), (40, 40)] {
        file.region().sm_limit[0].store(raw, SeqCst);
        // The hook follows a change within 2 s.
        std::thread::sleep(Duration::from_millis(2500));
        let limited = (shown < 100).then_some(shown);
        let (json, text) = inspect_says(&region);
        let want_text = if shown < 100 {
            shown.to_string()
        } else {
            "none".to_owned()
        };
        let top = top_says(&root, &state);
        let metrics = metrics_say(&d, shown);
        let hook = hook_limits_to(&gpu, limited);
        eprintln!(
            "sm_limit {raw}: inspect --json {json}, inspect {text}, top --json {top}, \
             /metrics {metrics:?}, hook {hook:?}"
        );
        if json != shown || text != want_text || top != shown || metrics != Some(shown) {
            wrong.push(format!(
                "sm_limit {raw}: inspect --json {json}, inspect {text:?}, top {top}, \
                 /metrics {metrics:?}; all should say {shown}"
            ));
        }
        if let Err(e) = hook {
            wrong.push(format!("sm_limit {raw}: the hook: {e}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "the readers disagree:\n{}",
        wrong.join("\n")
    );
}
