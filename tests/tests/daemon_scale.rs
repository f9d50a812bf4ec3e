//! The node daemon at node scale, on the simulated GPU, as root: what one
//! region costs it, what a tenant naming long region paths from many
//! processes costs it, and the per-container bounds. These hold the shape
//! (per-region cost, bounded growth), never a timing; the timings are
//! `cargo xtask bench daemon`, which runs [`bench_daemon`] here.

use std::ffi::OsStr;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vgpu_common::region::{ProcSlot, SharedRegion, FILE_SIZE, MAGIC, MAJOR_VERSION};
use vgpu_tests::container::{Cgroup, ContainerProcess};
use vgpu_tests::daemon::{Running, Workdir};
use vgpu_tests::dist;
use vgpu_tests::http::get;
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::poll_until;

/// The bound the daemon holds per region it reads (issue target).
const PER_REGION_KIB: u64 = 64;

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// utime + stime of `pid`, seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// (pid namespace inode, start time in ticks) of host process `pid`.
fn identity_of(pid: u32) -> (u64, u64) {
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/pid")).map_or(0, |m| m.ino());
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let start = rest
        .split_whitespace()
        .nth(19)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (ns, start)
}

/// Writes an initialised v1.2 region at `path` (parents created) with one
/// device, a 1 GiB limit and one slot per process of `live`, each naming
/// that host process as a hook on the host would (pid = hostpid, its PID
/// namespace and start time), 64 MiB used. `proc_num` says `claimed`
/// slots (at least `live.len()`).
fn write_region(path: &Path, live: &[u32], claimed: usize) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let f = std::fs::File::create(path).expect("create region");
    f.set_len(FILE_SIZE).expect("size region");
    let put = |at: usize, b: &[u8]| f.write_all_at(b, at as u64).expect("write region");
    let procs = std::mem::offset_of!(SharedRegion, procs);
    let slot = std::mem::size_of::<ProcSlot>();
    put(4, &MAJOR_VERSION.to_le_bytes());
    put(8, &2u32.to_le_bytes());
    put(56, &1u64.to_le_bytes());
    put(64, b"GPU-sim-0");
    put(1600, &(1u64 << 30).to_le_bytes());
    for (i, &pid) in live.iter().enumerate() {
        let at = procs + i * slot;
        let (ns, start) = identity_of(pid);
        put(at, &(pid as i32).to_le_bytes());
        put(at + 4, &(pid as i32).to_le_bytes());
        // used[0]: context 32 MiB, data 32 MiB, total 64 MiB.
        put(at + 8, &(32u64 << 20).to_le_bytes());
        put(at + 8 + 16, &(32u64 << 20).to_le_bytes());
        put(at + 8 + 32, &(64u64 << 20).to_le_bytes());
        put(at + 1928, &1i32.to_le_bytes());
        put(at + 1944, &ns.to_le_bytes());
        put(at + 1952, &start.to_le_bytes());
    }
    for i in live.len()..claimed {
        // A slot in use by a process that never existed (pid only).
        put(procs + i * slot, &(100_000 + i as i32).to_le_bytes());
        put(procs + i * slot + 1928, &1i32.to_le_bytes());
    }
    let proc_num = std::mem::offset_of!(SharedRegion, proc_num);
    put(proc_num, &(claimed.max(live.len()) as i32).to_le_bytes());
    put(0, &MAGIC.to_le_bytes());
}

/// Cheap live processes for slots to name: `sleep`, killed on drop.
struct Sleepers(Vec<Child>);

impl Sleepers {
    fn spawn(n: usize) -> Sleepers {
        Sleepers(
            (0..n)
                .map(|_| {
                    Command::new("sleep")
                        .arg("100000")
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("spawn sleep")
                })
                .collect(),
        )
    }

    fn pids(&self) -> Vec<u32> {
        self.0.iter().map(Child::id).collect()
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// `containers` HAMi container directories `pod<i>_main` under `root`, each
/// with `regions` region files whose slots name `live_per_region` of
/// `sleepers`' processes.
fn populate(root: &Path, containers: usize, regions: usize, live: &[u32], per_region: usize) {
    let mut next = 0;
    for c in 0..containers {
        for r in 0..regions {
            let mine: Vec<u32> = (0..per_region)
                .map(|_| {
                    let p = live[next % live.len().max(1)];
                    next += 1;
                    p
                })
                .collect();
            let path = root.join(format!("pod{c:04}_main/r{r}.cache"));
            write_region(&path, &mine, mine.len());
        }
    }
}

/// Lines of `text` that start with `prefix`.
fn count_series(text: &str, prefix: &str) -> usize {
    text.lines().filter(|l| l.starts_with(prefix)).count()
}

/// Waits until the daemon exports `want` regions (one `vgpu_dead_slots`
/// series each), up to `timeout`.
fn wait_regions(d: &mut Running, want: usize, timeout: Duration) -> String {
    let mut n = 0;
    poll_until(timeout, || {
        d.assert_alive();
        let m = d.metrics();
        n = count_series(&m, "vgpu_dead_slots{");
        (n >= want).then_some(m)
    })
    .unwrap_or_else(|| panic!("{n} of {want} regions exported after {timeout:?}"))
}

fn start(fx: &Workdir, gpu: &SimGpu, root: &Path) -> Running {
    fx.start_daemon(gpu, &fx.path("state"), root, &["--no-nvml"])
}

/// Value of the sample `name` (with its labels) in `text`.
fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

/// RSS the daemon settles at: the median of a few readings a scan apart.
fn settled_rss(d: &Running) -> u64 {
    let mut v: Vec<u64> = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(600));
            rss_kib(d.child.id())
        })
        .collect();
    v.sort_unstable();
    v[2]
}

/// 300 regions (100 containers × 3, 2 live processes each) cost the daemon
/// at most 64 KiB each: it reads what a region holds, not the 2 MB file.
#[test]
fn rss_per_region_stays_small_at_300_regions() {
    let fx = Workdir::new("vgpu-scale-", &["root"]);
    let gpu = SimGpu::new();
    let root = fx.path("root");
    let sleepers = Sleepers::spawn(20);
    let mut d = start(&fx, &gpu, &root);
    // Warm: the first scans allocate what every scan reuses.
    std::thread::sleep(Duration::from_secs(2));
    let before = settled_rss(&d);
    populate(&root, 100, 3, &sleepers.pids(), 2);
    wait_regions(&mut d, 300, Duration::from_secs(30));
    let after = settled_rss(&d);
    let per = after.saturating_sub(before) / 300;
    eprintln!("daemon RSS {before} KiB empty, {after} KiB with 300 regions: {per} KiB per region");
    assert!(
        per <= PER_REGION_KIB,
        "{per} KiB per region ({before} -> {after} KiB)"
    );
    d.assert_alive();
}

/// A directory of 3800 bytes: nested names of at most 250 bytes.
fn long_dir(base: &Path, tag: &str) -> PathBuf {
    let mut p = base.join(tag);
    while p.as_os_str().len() < 3800 {
        p.push("x".repeat(250));
    }
    p
}

/// A directory under `base` whose region files (`r000.cache`) have paths of
/// 256 bytes, the longest label value the daemon shows whole.
fn at_the_bound(base: &Path) -> PathBuf {
    let pad = 256 - "/r000.cache".len() - base.as_os_str().len() - 1;
    base.join("p".repeat(pad))
}

/// Runs `n` hooked processes in one container (cgroup), each naming its own
/// region under `dir`, and returns the daemon's (RSS KiB, /metrics) once
/// it has seen them all, and the metrics.
fn tenant_run(tag: &str, n: usize, long: bool) -> (u64, String) {
    let fx = Workdir::new("vgpu-scale-", &["root", "out"]);
    let gpu = SimGpu::new();
    let dir = if long {
        long_dir(fx.root(), tag)
    } else {
        at_the_bound(&fx.path(tag))
    };
    std::fs::create_dir_all(&dir).expect("mkdir region dir");
    let mut d = start(&fx, &gpu, &fx.path("root"));
    let cg = Cgroup::unique(&format!("scale-{tag}"));
    let envs = fx.envs(&gpu);
    let hook = dist::hook_lib();
    let mut procs: Vec<ContainerProcess> = (0..n)
        .map(|i| {
            let region = dir.join(format!("r{i:03}.cache"));
            let out = fx.out(&format!("{tag}{i}"));
            let mut env: Vec<(&str, &OsStr)> = envs
                .iter()
                .map(|(k, v)| (k.as_str(), OsStr::new(v)))
                .collect();
            env.push(("CUDA_DEVICE_MEMORY_SHARED_CACHE", region.as_os_str()));
            env.push(("CUDA_DEVICE_MEMORY_LIMIT", OsStr::new("1g")));
            env.push(("LD_PRELOAD", hook.as_os_str()));
            let argv: Vec<&OsStr> = vec![fx.prog.as_os_str(), out.as_os_str(), OsStr::new("1")];
            cg.spawn(&argv, &env)
        })
        .collect();
    for p in &mut procs {
        p.send_line("go");
    }
    for i in 0..n {
        let out = fx.out(&format!("{tag}{i}"));
        let allocated = poll_until(Duration::from_secs(60), || {
            std::fs::read_to_string(&out).is_ok_and(|s| s.contains("allocated"))
        });
        assert!(
            allocated.is_some(),
            "process {i} did not allocate within 60 s: {:?}",
            std::fs::read_to_string(&out)
        );
    }
    // Every process found (filled or refused), a few scans done.
    std::thread::sleep(Duration::from_secs(4));
    d.assert_alive();
    let rss = settled_rss(&d);
    let m = d.metrics();
    if let Ok(keep) = std::env::var("VGPU_SCALE_KEEP") {
        let _ = std::fs::write(Path::new(&keep).join(format!("{tag}.metrics")), &m);
    }
    drop(procs);
    (rss, m)
}

/// One tenant, 24 processes each naming its own region: with paths of
/// 3.8 KB it costs the daemon what it costs with paths at the label bound,
/// 256 bytes (metrics within 10 %, RSS within 10 % or 2 MiB), and past the
/// per-container bound its regions are refused and reported, not tracked.
#[test]
fn a_long_path_tenant_costs_what_one_at_the_label_bound_does_and_is_capped() {
    const N: usize = 24;
    let (rss_bound, bound) = tenant_run("bound", N, false);
    let (rss_long, long) = tenant_run("long", N, true);
    eprintln!(
        "paths at the bound: RSS {rss_bound} KiB, /metrics {} bytes; long paths: RSS {rss_long} KiB, \
         /metrics {} bytes",
        bound.len(),
        long.len()
    );
    for (what, m) in [("at the bound", &bound), ("long", &long)] {
        let regions = count_series(m, "vgpu_dead_slots{");
        assert!(
            (1..=8).contains(&regions),
            "{what}: {regions} regions tracked for one container of {N}"
        );
        assert_eq!(
            sample(m, r#"vgpu_containers_over_bound{bound="regions"}"#),
            Some(1.0),
            "{what}: the container past its region bound is reported\n{}",
            m.lines()
                .filter(|l| l.contains("over_bound"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(
        long.lines().all(|l| l.len() < 1024),
        "a metric line carries a long path"
    );
    let ratio = long.len() as f64 / bound.len() as f64;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "/metrics {} bytes with long paths, {} with paths at the bound",
        long.len(),
        bound.len()
    );
    let slack = (rss_bound / 10).max(2048);
    assert!(
        rss_long <= rss_bound + slack,
        "RSS {rss_long} KiB with long paths, {rss_bound} KiB with paths at the bound"
    );
}

/// A container whose regions claim every slot (`proc_num` 1024, every pid
/// set) is read up to its slot bound and reported; one with more regions
/// in its directory than the scan reads is counted as before.
#[test]
fn a_tenant_claiming_every_slot_is_capped_and_reported() {
    let fx = Workdir::new("vgpu-scale-", &["root"]);
    let gpu = SimGpu::new();
    let root = fx.path("root");
    let sleepers = Sleepers::spawn(2);
    let mut d = start(&fx, &gpu, &root);
    std::thread::sleep(Duration::from_secs(2));
    let before = settled_rss(&d);
    for r in 0..4 {
        write_region(
            &root.join(format!("podgreedy_main/r{r}.cache")),
            &sleepers.pids(),
            1024,
        );
    }
    write_region(&root.join("podfair_main/r.cache"), &sleepers.pids(), 2);
    let m = wait_regions(&mut d, 5, Duration::from_secs(20));
    let after = settled_rss(&d);
    eprintln!("greedy tenant: daemon RSS {before} -> {after} KiB");
    // 4 × 1024 slots would be 8 MB; the bound is 128 slots, 250 KB.
    assert!(
        after.saturating_sub(before) < 2048,
        "RSS grew {before} -> {after} KiB"
    );
    let over = m
        .lines()
        .filter(|l| l.contains("over_bound"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        sample(&m, r#"vgpu_containers_over_bound{bound="slots"}"#),
        Some(1.0),
        "{over}"
    );
    // The fair container is untouched by its neighbour.
    assert!(
        m.lines()
            .any(|l| l.starts_with("hami_vgpu_memory_used_bytes{")
                && l.contains("podfair")
                && l.ends_with(&format!(" {}", 2u64 * (64 << 20)))),
        "{}",
        m.lines()
            .filter(|l| l.starts_with("hami_vgpu_memory_used_bytes{"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    d.assert_alive();
}

/// What the benchmark measures for one load.
struct Row {
    containers: usize,
    regions: usize,
    rss_kib: u64,
    hwm_kib: u64,
    scan_cpu_ms: f64,
    core_pct: f64,
    metrics_bytes: usize,
    scrape_ms: f64,
    render_ms: f64,
    scan_ms: f64,
    healthz_worst_ms: f64,
}

/// One load: `containers` × `regions` regions × `live` live processes.
fn bench_one(containers: usize, regions: usize, live: usize, window: Duration) -> Row {
    let fx = Workdir::new("vgpu-bench-daemon-", &["root"]);
    let gpu = SimGpu::new();
    let root = fx.path("root");
    let sleepers = Sleepers::spawn(containers * regions * live);
    populate(&root, containers, regions, &sleepers.pids(), live);
    let mut d = start(&fx, &gpu, &root);
    wait_regions(&mut d, containers * regions, Duration::from_secs(120));
    std::thread::sleep(Duration::from_secs(3));
    let port = d.port;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                let ok = get(port, "/healthz").map(|(s, _)| s) == Some(200);
                worst = worst.max(if ok { t.elapsed() } else { Duration::MAX });
                std::thread::sleep(Duration::from_millis(20));
            }
            worst
        })
    };
    let pid = d.child.id();
    let cpu0 = cpu_secs(pid);
    let t0 = Instant::now();
    let mut scrapes = Vec::new();
    let mut metrics = String::new();
    while t0.elapsed() < window {
        let t = Instant::now();
        metrics = d.metrics();
        scrapes.push(t.elapsed().as_secs_f64() * 1e3);
        std::thread::sleep(Duration::from_millis(1000));
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs(pid) - cpu0;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let worst = probe.join().unwrap_or(Duration::MAX);
    scrapes.sort_by(f64::total_cmp);
    let interval = 0.5;
    let phase = |p: &str| {
        sample(
            &metrics,
            &format!("vgpu_last_scan_seconds{{phase=\"{p}\"}}"),
        )
        .unwrap_or(f64::NAN)
            * 1e3
    };
    let row = Row {
        containers,
        regions: containers * regions,
        rss_kib: rss_kib(pid),
        hwm_kib: status_kib(pid, "VmHWM:"),
        scan_cpu_ms: cpu / (wall / interval) * 1e3,
        core_pct: cpu / wall * 100.0,
        metrics_bytes: metrics.len(),
        scrape_ms: scrapes[scrapes.len() / 2],
        render_ms: phase("render"),
        scan_ms: phase("scan"),
        healthz_worst_ms: worst.as_secs_f64() * 1e3,
    };
    d.assert_alive();
    drop(d);
    drop(sleepers);
    row
}

/// `cargo xtask bench daemon`: N containers × 3 regions × 2 live processes
/// for N in `VGPU_BENCH_N` (default 10,100,1000), the daemon at its default
/// interval; prints a Markdown table.
#[test]
#[ignore = "benchmark: cargo xtask bench daemon"]
fn bench_daemon() {
    let ns: Vec<usize> = std::env::var("VGPU_BENCH_N")
        .unwrap_or_else(|_| "10,100,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let window = Duration::from_secs(
        std::env::var("VGPU_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(15),
    );
    let rows: Vec<Row> = ns
        .iter()
        .map(|&n| {
            let r = bench_one(n, 3, 2, window);
            eprintln!("N={n} done");
            r
        })
        .collect();
    println!(
        "| containers | regions | RSS MiB (peak) | CPU per scan ms | % of a core | /metrics bytes \
         | scrape ms (median) | render ms | scan ms | /healthz worst ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.1} ({:.1}) | {:.1} | {:.1} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r.containers,
            r.regions,
            r.rss_kib as f64 / 1024.0,
            r.hwm_kib as f64 / 1024.0,
            r.scan_cpu_ms,
            r.core_pct,
            r.metrics_bytes,
            r.scrape_ms,
            r.render_ms,
            r.scan_ms,
            r.healthz_worst_ms
        );
    }
    if let (Some(a), Some(b)) = (rows.first(), rows.last()) {
        if b.regions > a.regions {
            let per = (b.rss_kib as f64 - a.rss_kib as f64) / (b.regions - a.regions) as f64;
            println!("\nRSS per added region: {per:.1} KiB");
        }
    }
}
