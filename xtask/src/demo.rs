//! `cargo xtask demo`: the main job on one machine. A sample CUDA workload
//! (`tests/c/demo_workload.c`) runs under `libvgpu.so` with a 1 GiB memory
//! limit, against the simulated GPU, or the real one when `nvidia-smi`
//! works. Meanwhile `vgpu trace` (root) watches its calls. Then it prints a
//! short account of what happened. Then `share`: two tenants with
//! different limits on one simulated GPU, `vgpu daemon` watching them,
//! `vgpu top` and their metric lines.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};

use crate::{build, share, util};

#[derive(clap::Args)]
pub struct Args {
    /// Memory limit given to the workload (HAMi syntax: 1g, 1024m, ...).
    #[arg(long, default_value = "1g")]
    pub limit: String,
    /// Force the simulated GPU even when a real one is present.
    #[arg(long)]
    pub sim: bool,
}

/// Where the workload's CUDA driver comes from.
struct Driver {
    libcuda: PathBuf,
    lib_dir: PathBuf,
    real: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let dist = build::run(&build::Args::default())?;
    let work = std::env::temp_dir().join(format!("vgpu-demo-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let driver = pick_driver(&dist, args.sim)?;
    let exe = compile_workload(&driver, &work)?;
    let region = work.join("demo.cache");

    let mut trace = if util::is_root() {
        Some(start_trace(&dist, &driver)?)
    } else {
        eprintln!("demo: not root, so `vgpu trace` cannot load eBPF; running without it");
        None
    };

    let mut cmd = Command::new(&exe);
    cmd.env("LD_PRELOAD", dist.join("libvgpu.so"))
        .env("CUDA_DEVICE_MEMORY_LIMIT", &args.limit)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
        .env("LD_LIBRARY_PATH", &driver.lib_dir);
    if !driver.real {
        cmd.env("SIMGPU_DIR", work.join("simgpu"))
            .env("SIMGPU_MEMORY", "8g")
            .env("SIMGPU_IDLE_EXIT_MS", "2000");
    }
    let started = Instant::now();
    let out = cmd.output().context("run the demo workload")?;
    let workload_pid_lines = String::from_utf8_lossy(&out.stdout).into_owned();
    std::thread::sleep(Duration::from_millis(500));
    let seen = match trace.as_mut() {
        Some(t) => stop_trace(t)?,
        None => BTreeMap::new(),
    };

    println!(
        "\n=== vgpu demo ({}) ===",
        if driver.real {
            "real GPU"
        } else {
            "simulated GPU"
        }
    );
    println!(
        "workload: {} with CUDA_DEVICE_MEMORY_LIMIT={}",
        exe.display(),
        args.limit
    );
    for line in workload_pid_lines.lines() {
        println!("  | {line}");
    }
    if !out.status.success() {
        println!("  workload exited with {}:", out.status);
        println!("{}", String::from_utf8_lossy(&out.stderr));
    }
    println!("ran for {:.2} s", started.elapsed().as_secs_f64());
    if trace.is_some() {
        println!(
            "vgpu trace (eBPF uprobes on {}) saw:",
            driver.libcuda.display()
        );
        if seen.is_empty() {
            println!("  nothing: the probes did not fire");
        }
        for (func, n) in &seen {
            println!("  {n:>6} x {func}");
        }
    }
    summarize(&workload_pid_lines, &seen, &args.limit);
    free_finished_slot(&dist, &region);
    let inspect = Command::new(dist.join("vgpu"))
        .args(["inspect"])
        .arg(&region)
        .output();
    if let Ok(o) = inspect {
        if o.status.success() {
            println!(
                "\nvgpu inspect {}:\n{}",
                region.display(),
                String::from_utf8_lossy(&o.stdout)
            );
        }
    }
    let shared = if out.status.success() {
        share::run(&dist, &work)
    } else {
        Err(anyhow!("the demo workload failed"))
    };
    // Its simulator's server would outlive it until its idle timeout.
    share::stop_sim_server(&work.join("simgpu"));
    let _ = std::fs::remove_dir_all(&work);
    shared
}

/// The account in plain words, from what the workload printed and what the
/// tracer saw.
fn summarize(workload: &str, seen: &BTreeMap<String, u64>, limit: &str) {
    let line = |prefix: &str| workload.lines().find(|l| l.starts_with(prefix));
    println!("\nWhat happened:");
    if let Some(info) = line("cuMemGetInfo") {
        println!(
            "  - under the hook the program saw the {limit} limit as the GPU's size ({info});"
        );
        println!("    the CUDA context is already counted in what is used");
    }
    if let Some(alloc) = line("allocated") {
        println!(
            "  - it then {alloc}: the hook refused the allocation that would have passed the limit"
        );
    }
    let allocs = seen.get("cuMemAlloc_v2").copied().unwrap_or(0);
    let launches = seen.get("cuLaunchKernel").copied().unwrap_or(0);
    if allocs + launches > 0 {
        println!(
            "  - vgpu trace, watching libcuda from the kernel with eBPF (below the hook), saw \
             {allocs} successful cuMemAlloc_v2 calls and {launches} kernel launches: the refused \
             call never reached the driver"
        );
    }
}

/// The finished workload's slot stays registered after its exit (the hook
/// keeps counting until the process is dead: docs/hook.md); on a node
/// `vgpu daemon` frees it, here `vgpu cleanup` does, so that the slot table
/// below is clean, or its line says why a slot remains.
fn free_finished_slot(dist: &Path, region: &Path) {
    let out = Command::new(dist.join("vgpu"))
        .arg("cleanup")
        .arg(region)
        .output();
    println!("\nThe workload has exited; `vgpu cleanup` frees its slot, as `vgpu daemon` does on a node:");
    match out {
        Ok(o) => {
            let said = if o.status.success() {
                &o.stdout
            } else {
                &o.stderr
            };
            for line in String::from_utf8_lossy(said).lines() {
                println!("  {line}");
            }
        }
        Err(e) => println!("  vgpu cleanup could not run ({e}): the slot remains"),
    }
}

fn pick_driver(dist: &Path, force_sim: bool) -> Result<Driver> {
    if !force_sim && util::real_gpu_present() {
        let found = util::output(
            Command::new("sh").args(["-c", "ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}'"]),
        )
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            let p = PathBuf::from("/usr/local/nvidia/lib64/libcuda.so.1");
            p.exists().then_some(p)
        });
        if let Some(libcuda) = found {
            let lib_dir = libcuda.parent().map(Path::to_path_buf).unwrap_or_default();
            return Ok(Driver {
                libcuda,
                lib_dir,
                real: true,
            });
        }
        eprintln!("demo: nvidia-smi works but libcuda.so.1 was not found; using the simulated GPU");
    }
    let lib_dir = dist.join("sim");
    Ok(Driver {
        libcuda: lib_dir.join("libcuda.so.1"),
        lib_dir,
        real: false,
    })
}

fn compile_workload(driver: &Driver, work: &Path) -> Result<PathBuf> {
    let c_dir = util::root().join("tests/c");
    let exe = work.join("demo_workload");
    util::run(
        Command::new("cc")
            .args(["-O1", "-Wall", "-o"])
            .arg(&exe)
            .arg(c_dir.join("demo_workload.c"))
            .arg("-I")
            .arg(&c_dir)
            .arg(format!("-L{}", driver.lib_dir.display()))
            .arg("-l:libcuda.so.1"),
    )?;
    Ok(exe)
}

struct Trace {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

fn start_trace(dist: &Path, driver: &Driver) -> Result<Trace> {
    let mut child = Command::new(dist.join("vgpu"))
        .args(["trace", "--json", "--libcuda"])
        .arg(&driver.libcuda)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("start vgpu trace")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().context("trace stdout")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Ready once it reports its attachments on stderr.
    let stderr = child.stderr.take().context("trace stderr")?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("  [trace] {line}");
            // `vgpu trace: N probes on <libcuda> ...` once attached.
            if line.contains("probes on") {
                let _ = ready_tx.send(());
            }
        }
    });
    if ready_rx.recv_timeout(Duration::from_secs(20)).is_err() {
        eprintln!("demo: vgpu trace did not report its probes within 20 s; going on");
    }
    Ok(Trace { child, lines: rx })
}

/// Stops the tracer and counts its events by function.
fn stop_trace(t: &mut Trace) -> Result<BTreeMap<String, u64>> {
    // SAFETY-free: a plain SIGINT through kill(1), so the tracer detaches cleanly.
    let _ = Command::new("kill")
        .args(["-INT", &t.child.id().to_string()])
        .status();
    let _ = t.child.wait();
    let mut counts = BTreeMap::new();
    while let Ok(line) = t.lines.try_recv() {
        if let Some(func) = json_str_field(&line, "func") {
            *counts.entry(func).or_insert(0) += 1;
        }
    }
    Ok(counts)
}

/// The string value of `"key":"value"` in a JSON line; enough for the
/// demo's flat event records without pulling serde into xtask.
fn json_str_field(line: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let start = line.find(&pat)? + pat.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].to_owned())
}
