//! `cargo xtask bench`: the hook's cost on the launch, allocation and
//! memory-info paths, as a ratio to the bare driver measured in the same
//! run. Without a GPU it
//! runs on the simulated driver, which measures the hook's own overhead (the
//! simulated calls are cheap); real-GPU figures come from `gpu-check`.
//!
//! `cargo xtask bench daemon`: the node daemon at N containers × 3 regions ×
//! 2 live processes (RSS, CPU per scan, `/metrics` size and timings,
//! `/healthz` latency), run by the integration suite's `daemon_scale`
//! benchmark so it shares the tests' fixtures (needs root).

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{build, util};

#[derive(clap::Args)]
pub struct Args {
    /// What to measure.
    #[arg(value_enum, default_value_t = Target::Hook)]
    pub target: Target,
    /// Interleaved repetitions of each configuration (hook).
    #[arg(long, default_value_t = 7)]
    pub reps: usize,
    /// Container counts to load the daemon with (daemon).
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    pub containers: Vec<usize>,
    /// Seconds measured at each load (daemon).
    #[arg(long, default_value_t = 15)]
    pub secs: u64,
}

/// What `cargo xtask bench` measures.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Target {
    /// The hook's launch and allocation paths against the bare driver.
    Hook,
    /// The node daemon at node scale.
    Daemon,
}

pub fn run(args: &Args) -> Result<()> {
    match args.target {
        Target::Hook => hook(args),
        Target::Daemon => daemon(args),
    }
}

fn daemon(args: &Args) -> Result<()> {
    if !util::is_root() {
        bail!("cargo xtask bench daemon loads eBPF probes and cgroups; run it as root");
    }
    let dist = build::run(&build::Args::default())?;
    let ns: Vec<String> = args.containers.iter().map(usize::to_string).collect();
    util::run(
        util::cargo()
            .args(["test", "-p", "vgpu-tests", "--test", "daemon_scale"])
            .args(["--", "--ignored", "--exact", "bench_daemon", "--nocapture"])
            .env("VGPU_DIST", &dist)
            .env("VGPU_BENCH_N", ns.join(","))
            .env("VGPU_BENCH_SECS", args.secs.to_string()),
    )
}

fn hook(args: &Args) -> Result<()> {
    let dist = build::run(&build::Args::default())?;
    let work = std::env::temp_dir().join(format!("vgpu-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let c_dir = util::root().join("tests/c");
    let exe = work.join("bench_launch");
    util::run(
        Command::new("cc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&exe)
            .arg(c_dir.join("bench_launch.c"))
            .arg("-I")
            .arg(&c_dir)
            .arg(format!("-L{}", dist.join("sim").display()))
            .arg("-l:libcuda.so.1"),
    )?;
    // Each run launches for `WARM_S` first, except the last row's: an empty
    // kernel's timing is the launch latency, charged until the feedback
    // loop's correction brings it down (a few seconds); the last row is
    // the limited path before that, every launch accounted in full.
    let configs: [(&str, Hook, bool); 4] = [
        ("native", Hook::None, true),
        ("hook, 1g limit", Hook::Memory, true),
        ("hook, 1g + SM 90 (never binds)", Hook::Sm, true),
        (
            "hook, 1g + SM 90, its first 3 s (full accounting)",
            Hook::Sm,
            false,
        ),
    ];
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); configs.len()];
    for _ in 0..args.reps {
        for (i, (_, hook, warm)) in configs.iter().enumerate() {
            samples[i].push(measure(&exe, &dist, &work, *hook, *warm)?);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut launch: Vec<f64> = Vec::new();
    let mut alloc: Vec<f64> = Vec::new();
    let mut calls: Vec<f64> = Vec::new();
    let mut info: Vec<f64> = Vec::new();
    for s in &samples {
        launch.push(median(&mut s.iter().map(|x| x.launch).collect()));
        alloc.push(median(&mut s.iter().map(|x| x.alloc_free).collect()));
        calls.push(median(
            &mut s.iter().map(|x| x.calls.unwrap_or(f64::NAN)).collect(),
        ));
        info.push(median(&mut s.iter().map(|x| x.meminfo).collect()));
    }
    println!("simulated GPU, {} interleaved runs, medians", args.reps);
    println!(
        "| configuration | launch (ns/call) | ratio | driver calls/launch | alloc+free (ns/pair) | ratio | cuMemGetInfo (ns/call) | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (i, (name, _, _)) in configs.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.3} | {:.3} | {:.0} | {:.3} | {:.0} | {:.2} |",
            launch[i],
            launch[i] / launch[0],
            calls[i],
            alloc[i],
            alloc[i] / alloc[0],
            info[i],
            info[i] / info[0]
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// What the benchmark program runs under.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hook {
    None,
    /// The hook with a memory limit: the launch path's fast path.
    Memory,
    /// Also an SM limit the empty kernels never reach: the limited launch
    /// path's own cost (charging, the bucket, sampled timings), never a
    /// wait.
    Sm,
}

/// Seconds each run launches before the timed loop (`measure`'s `warm`).
const WARM_S: &str = "3";

/// What one run of the benchmark program measures.
#[derive(Clone, Copy)]
struct Sample {
    /// ns per launch.
    launch: f64,
    /// ns per 1 MiB alloc+free pair.
    alloc_free: f64,
    /// Driver calls per launch (the simulated driver counts them).
    calls: Option<f64>,
    /// ns per `cuMemGetInfo`.
    meminfo: f64,
}

/// One run of the benchmark program, after `WARM_S` of launches when
/// `warm`.
fn measure(exe: &Path, dist: &Path, work: &Path, hook: Hook, warm: bool) -> Result<Sample> {
    let mut cmd = Command::new(exe);
    cmd.env("LD_LIBRARY_PATH", dist.join("sim"))
        .env("SIMGPU_DIR", work.join("simgpu"))
        .env("SIMGPU_KERNEL_NS", "0");
    if warm {
        cmd.env("BENCH_WARM_S", WARM_S);
    }
    if hook != Hook::None {
        // A fresh region per run: the first creator's limits win.
        static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        cmd.env("LD_PRELOAD", dist.join("libvgpu.so"))
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
            .env(
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                work.join(format!("bench-{}-{run}.cache", hook as u8)),
            );
    }
    if hook == Hook::Sm {
        cmd.env("CUDA_DEVICE_SM_LIMIT", "90")
            .env("GPU_CORE_UTILIZATION_POLICY", "force");
    }
    let out = cmd.output().context("run bench_launch")?;
    if !out.status.success() {
        bail!(
            "bench_launch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| -> Result<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("bench_launch printed no {key:?}: {text}"))
    };
    Ok(Sample {
        launch: field("launch_ns_per_call")?,
        alloc_free: field("alloc_free_ns_per_pair")?,
        calls: field("driver_calls_per_launch").ok(),
        meminfo: field("meminfo_ns_per_call")?,
    })
}
