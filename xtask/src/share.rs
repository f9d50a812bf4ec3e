//! The second half of `cargo xtask demo`: what vgpu is for. Two tenants
//! share one simulated GPU with different memory and SM limits, each in
//! its own "container" (as root: a child cgroup and a PID namespace, as
//! `tests/src/container.rs` builds them; otherwise plain processes), with
//! its own region file in a HAMi-style containers directory. `vgpu daemon`
//! watches them (its own `--libcuda` copy of the simulated driver,
//! `--state-dir` and loopback port, never the machine's);
//! the demo prints one `vgpu top` frame and the daemon's metric lines for
//! the two, then stops and removes everything.

use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::util;

/// One tenant: its pod, limits, and what it allocates.
struct Tenant {
    pod: &'static str,
    uid: &'static str,
    mem_limit: &'static str,
    sm_limit: u32,
    hold_mib: u32,
    more_mib: u32,
}

/// The same request past its hold: refused under 1 GiB, granted under 3.
const TENANTS: [Tenant; 2] = [
    Tenant {
        pod: "notebook",
        uid: "0b1c2d3e-0000-4000-8000-000000000001",
        mem_limit: "1g",
        sm_limit: 30,
        hold_mib: 512,
        more_mib: 768,
    },
    Tenant {
        pod: "trainer",
        uid: "0b1c2d3e-0000-4000-8000-000000000002",
        mem_limit: "3g",
        sm_limit: 60,
        hold_mib: 1536,
        more_mib: 768,
    },
];

/// A started tenant: its process (or `unshare`), its cgroup, its output.
struct Running {
    child: Child,
    cgroup: Option<PathBuf>,
    lines: mpsc::Receiver<String>,
    said: Vec<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(cg) = &self.cgroup {
            let _ = std::fs::write(cg.join("cgroup.kill"), "1");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(cg) = &self.cgroup {
            let t = Instant::now();
            while std::fs::remove_dir(cg).is_err() && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The daemon, killed on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the sharing demo in `work` (removed by the caller) with the
/// artifacts in `dist`.
pub fn run(dist: &Path, work: &Path) -> Result<()> {
    let sim = dist.join("sim");
    // The demo's own copy of the simulated driver: the daemon probes this
    // file only, never a libcuda other programs on the machine load.
    let lib = work.join("share-lib");
    std::fs::create_dir_all(&lib)?;
    std::fs::copy(sim.join("libcuda.so.1"), lib.join("libcuda.so.1"))
        .context("copy the simulated libcuda")?;
    let exe = compile_tenant(&lib, work)?;
    let containers = work.join("containers");
    let pods = work.join("pods");
    let stop = work.join("stop");
    let env: Vec<(&str, String)> = vec![
        (
            "LD_LIBRARY_PATH",
            format!("{}:{}", lib.display(), sim.display()),
        ),
        ("SIMGPU_DIR", work.join("share-sim").display().to_string()),
        (
            "SIMGPU_SERVER",
            sim.join("simgpu-server").display().to_string(),
        ),
        ("SIMGPU_MEMORY", "8g".into()),
        ("SIMGPU_CONTEXT_BYTES", "64m".into()),
        ("SIMGPU_IDLE_EXIT_MS", "2000".into()),
    ];
    let root = util::is_root();
    println!("\n=== vgpu demo: two tenants share one simulated GPU (8 GiB, 132 SMs) ===");
    if !root {
        println!(
            "(not root: the tenants are plain processes, not cgroups with PID namespaces, and \
             vgpu daemon, which needs root or CAP_BPF+CAP_PERFMON for its eBPF probes, does \
             not run: no metrics; vgpu top reads the tenants' regions itself)"
        );
    }

    let daemon = if root {
        Some(start_daemon(dist, work, &lib, &containers, &pods, &env)?)
    } else {
        None
    };

    let mut tenants = Vec::new();
    for t in &TENANTS {
        let dir = containers.join(format!("{}_main", t.uid));
        std::fs::create_dir_all(&dir)?;
        std::fs::create_dir_all(pods.join(format!("demo_{}_{}", t.pod, t.uid)).join("main"))?;
        let region = dir.join("6f9619ff-8b86-4d01-b42d-00c04fc964ff.cache");
        let (mut cmd, cgroup) = if root {
            let mut c = Command::new("sh");
            c.arg("-c").arg(
                r#"echo $$ > "$0/cgroup.procs" && exec unshare --pid --fork --mount-proc "$@""#,
            );
            let cg = cgroup_root()?.join(format!("vgpu-demo-{}-{}", std::process::id(), t.pod));
            std::fs::create_dir_all(&cg).with_context(|| format!("mkdir {}", cg.display()))?;
            c.arg(&cg).arg(&exe);
            (c, Some(cg))
        } else {
            (Command::new(&exe), None)
        };
        cmd.args([t.hold_mib.to_string(), t.more_mib.to_string()])
            .arg(&stop)
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .env("LD_PRELOAD", dist.join("libvgpu.so"))
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
            .env("CUDA_DEVICE_MEMORY_LIMIT", t.mem_limit)
            .env("CUDA_DEVICE_SM_LIMIT", t.sm_limit.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().context("start a tenant")?;
        let out = child.stdout.take().context("tenant stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        tenants.push(Running {
            child,
            cgroup,
            lines,
            said: Vec::new(),
        });
    }
    for (t, r) in TENANTS.iter().zip(tenants.iter_mut()) {
        println!(
            "{} (CUDA_DEVICE_MEMORY_LIMIT={}, CUDA_DEVICE_SM_LIMIT={}):",
            t.pod, t.mem_limit, t.sm_limit
        );
        loop {
            let line = r
                .lines
                .recv_timeout(Duration::from_secs(20))
                .with_context(|| format!("{} did not get ready", t.pod))?;
            if line == "ready" {
                break;
            }
            println!("  {}: {line}", t.pod);
            r.said.push(line);
        }
    }

    // Two scans of usage (1 s apart) for a utilization over a window.
    std::thread::sleep(Duration::from_millis(2500));
    for (t, r) in TENANTS.iter().zip(&tenants) {
        let said = &r.said;
        let refused = said.iter().any(|l| l.contains("more: refused"));
        if said.is_empty() || refused != (t.hold_mib + t.more_mib > mib(t.mem_limit)) {
            bail!("{}: its limit was not what decided: {said:?}", t.pod);
        }
    }

    let top = Command::new(dist.join("vgpu"))
        .arg("top")
        .arg("--root")
        .arg(&containers)
        .arg("--state-dir")
        .arg(work.join("state"))
        .arg("--pods-log-dir")
        .arg(&pods)
        .args(["--count", "1"])
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .output()
        .context("run vgpu top")?;
    println!("\nvgpu top (one frame):");
    for line in String::from_utf8_lossy(&top.stdout).lines() {
        println!("  {line}");
    }

    if let Some((_, port)) = &daemon {
        // The series appear at the daemon's next region pass (at most a
        // second after it first sees a region): scrape until both pods have
        // theirs, for up to 5 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let metrics = loop {
            let (_, m) = get(*port, "/metrics").context("scrape the daemon")?;
            let all = TENANTS.iter().all(|t| {
                let pod = format!("pod=\"{}\"", t.pod);
                m.lines()
                    .any(|l| l.starts_with("hami_vgpu_memory_used_bytes{") && l.contains(&pod))
            });
            if all || std::time::Instant::now() >= deadline {
                break m;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        println!("\nits /metrics, the two tenants' lines (labels cut to the pod):");
        for name in [
            "hami_vgpu_memory_used_bytes",
            "hami_vgpu_memory_limit_bytes",
            "hami_container_device_utilization_ratio",
            "vgpu_sm_limit_percent",
        ] {
            for t in &TENANTS {
                let pod = format!("pod=\"{}\"", t.pod);
                let line = metrics
                    .lines()
                    .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&pod))
                    .with_context(|| format!("no {name} line for {} in /metrics", t.pod))?;
                let value = line.rsplit(' ').next().unwrap_or("");
                println!("  {name}{{namespace=\"demo\",{pod},container=\"main\",…}} {value}");
            }
        }
    }

    std::fs::write(&stop, b"")?;
    println!("\nthe tenants stop; what they ran, side by side on one GPU:");
    for (t, r) in TENANTS.iter().zip(&tenants) {
        if let Ok(line) = r.lines.recv_timeout(Duration::from_secs(10)) {
            println!("  {}: {line} (SM limit {} %)", t.pod, t.sm_limit);
        }
    }
    drop(daemon);
    drop(tenants);
    // The daemon's NVML started the simulator's server outside the
    // tenants' cgroups; it would outlive the demo (and write in its
    // directory after the demo removed it) until its idle timeout.
    stop_sim_server(&work.join("share-sim"));
    println!("\nstopped the daemon and both tenants; removed their cgroups and files");
    Ok(())
}

/// Starts `vgpu daemon` on the demo's own files and a free loopback port;
/// returns once it is ready.
fn start_daemon(
    dist: &Path,
    work: &Path,
    lib: &Path,
    containers: &Path,
    pods: &Path,
    env: &[(&str, String)],
) -> Result<(Daemon, u16)> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let log = work.join("daemon.log");
    let daemon = Command::new(dist.join("vgpu"))
        .arg("daemon")
        .arg("--libcuda")
        .arg(lib.join("libcuda.so.1"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--state-dir")
        .arg(work.join("state"))
        .arg("--regions-root")
        .arg(containers)
        .arg("--pods-log-dir")
        .arg(pods)
        .args(["--node-name", "demo-node", "--interval", "1"])
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("start vgpu daemon")?;
    let mut daemon = Daemon(daemon);
    let t = Instant::now();
    while get(port, "/readyz").map(|(c, _)| c) != Some(200) {
        if let Ok(Some(st)) = daemon.0.try_wait() {
            bail!(
                "vgpu daemon exited {st}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if t.elapsed() > Duration::from_secs(20) {
            bail!("vgpu daemon not ready after 20 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "\nvgpu daemon --libcuda {} --state-dir {} --listen 127.0.0.1:{port} is serving",
        lib.join("libcuda.so.1").display(),
        work.join("state").display()
    );
    Ok((daemon, port))
}

/// Stops the `simgpu-server --dir <dir>` serving this demo's simulator
/// (that exact directory: no other), and waits for it to exit.
pub fn stop_sim_server(dir: &Path) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let want = dir.as_os_str().as_encoded_bytes();
    for p in procs.flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let ours = args.first().is_some_and(|a| a.ends_with(b"/simgpu-server"))
            && args.windows(2).any(|w| w[0] == b"--dir" && w[1] == want);
        if !ours {
            continue;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .stderr(Stdio::null())
            .status();
        let t = Instant::now();
        while p.path().exists() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// MiB in a HAMi size (`1g`, `512m`).
fn mib(size: &str) -> u32 {
    let (n, unit) = size.split_at(size.len() - 1);
    let n: u32 = n.parse().unwrap_or(0);
    if unit == "g" {
        n * 1024
    } else {
        n
    }
}

fn compile_tenant(lib: &Path, work: &Path) -> Result<PathBuf> {
    let c_dir = util::root().join("tests/c");
    let exe = work.join("demo_tenant");
    util::run(
        Command::new("cc")
            .args(["-O1", "-Wall", "-o"])
            .arg(&exe)
            .arg(c_dir.join("demo_tenant.c"))
            .arg("-I")
            .arg(&c_dir)
            .arg(format!("-L{}", lib.display()))
            .arg("-l:libcuda.so.1"),
    )?;
    Ok(exe)
}

/// The cgroup2 mount (`/sys/fs/cgroup`, or `…/unified` on hybrid hosts).
fn cgroup_root() -> Result<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    info.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            if post.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            pre.split_whitespace().nth(4).map(PathBuf::from)
        })
        .context("no cgroup2 mount")
}

/// A plain HTTP/1.0 GET on loopback: the status and the body.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}
