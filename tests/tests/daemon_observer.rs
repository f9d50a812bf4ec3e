//! `vgpu daemon` end to end (root, simulated GPU): real uprobes on a
//! per-test copy of the simulated libcuda (its own inode, so parallel tests
//! do not see each other), "containers" made of a child cgroup and a PID
//! namespace, each with its own region file.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use serde_json::Value;
use vgpu_common::region::status;
use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::container::{Cgroup, ContainerProcess};
use vgpu_tests::daemon::{Running, Workdir};
use vgpu_tests::dist;
use vgpu_tests::http::{get, now_ns};
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::poll_until;

const MIB: u64 = 1 << 20;

/// A daemon probing the fixture's own libcuda copy, its state in
/// `state`, with `extra` arguments.
fn start_daemon(fx: &Fixture, gpu: &SimGpu, extra: &[&str]) -> Running {
    fx.start_daemon(gpu, &fx.path("state"), &fx.path("no-hami-dir"), extra)
}

/// `/findings` as a whole JSON document.
fn findings_doc(d: &Running) -> Value {
    let (code, body) = get(d.port, "/findings").expect("findings");
    assert_eq!(code, 200);
    serde_json::from_str(&body).expect("findings json")
}

/// The current finding about `pid`, if there is one.
fn finding_of(d: &Running, pid: u32) -> Option<Value> {
    findings_doc(d)["findings"]
        .as_array()
        .and_then(|l| l.iter().find(|x| x["pid"] == pid).cloned())
}

/// The test's working directory (`vgpu_tests::daemon::Workdir`).
struct Fixture(Workdir);

impl std::ops::Deref for Fixture {
    type Target = Workdir;
    fn deref(&self) -> &Workdir {
        &self.0
    }
}

impl Fixture {
    fn new() -> Fixture {
        Fixture(Workdir::new("vgpu-daemon-", &["regions", "out"]))
    }

    /// Starts `daemon_prog` in a new container; it waits for "go".
    fn spawn(
        &self,
        gpu: &SimGpu,
        cg: &Cgroup,
        name: &str,
        hooked: bool,
        args: &[&str],
    ) -> ContainerProcess {
        self.spawn_on(gpu, cg, name, name, hooked, args)
    }

    /// [`Fixture::spawn`] with region `region` (shared between containers
    /// that name the same one).
    fn spawn_on(
        &self,
        gpu: &SimGpu,
        cg: &Cgroup,
        name: &str,
        region: &str,
        hooked: bool,
        args: &[&str],
    ) -> ContainerProcess {
        let envs = self.envs(gpu);
        let hook = dist::hook_lib();
        let region = self.region(region);
        let mut env: Vec<(&str, &OsStr)> = envs
            .iter()
            .map(|(k, v)| (k.as_str(), OsStr::new(v)))
            .collect();
        env.push(("CUDA_DEVICE_MEMORY_SHARED_CACHE", region.as_os_str()));
        env.push(("CUDA_DEVICE_MEMORY_LIMIT", OsStr::new("2g")));
        if hooked {
            env.push(("LD_PRELOAD", hook.as_os_str()));
        }
        let out = self.out(name);
        let mut argv: Vec<&OsStr> = vec![self.prog.as_os_str(), out.as_os_str()];
        argv.extend(args.iter().map(OsStr::new));
        cg.spawn(&argv, &env)
    }
}

/// Value of the sample whose name is `name` and whose labels include all of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let (lab, val) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        let ok = labels
            .iter()
            .all(|(k, v)| lab.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
        ok.then(|| val.trim().parse().ok())?
    })
}

/// The slot of namespace pid `pid`: (hostpid, total, data) on device 0.
fn slot_of(path: &Path, pid: i32) -> Option<(i32, u64, u64)> {
    let f = RegionFile::open(path, Access::ReadOnly).ok()?;
    let r = f.region();
    r.active_slots()
        .iter()
        .find(|s| s.pid.load(SeqCst) == pid && s.status.load(SeqCst) != status::EXITED)
        .map(|s| {
            (
                s.hostpid.load(SeqCst),
                s.used[0].total.load(SeqCst),
                s.used[0].data_size.load(SeqCst),
            )
        })
}

#[test]
fn sixteen_containers_get_host_pids_within_a_second() {
    const N: usize = 16;
    let fx = Fixture::new();
    let gpu = SimGpu::new();
    let daemon = start_daemon(&fx, &gpu, &[]);

    // No launch entry point is probed; allocation, free and context ones are.
    let m = daemon.metrics();
    let attached: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("vgpu_probe_attached{"))
        .collect();
    assert!(!attached.is_empty(), "{m}");
    for l in &attached {
        assert!(
            !l.contains("cuLaunch") && !l.contains("cuGraphLaunch"),
            "{l}"
        );
    }
    for f in [
        "cuInit",
        "cuDevicePrimaryCtxRetain",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemCreate",
    ] {
        assert!(
            attached
                .iter()
                .any(|l| l.contains(&format!("function=\"{f}\""))),
            "{f}: {m}"
        );
    }

    let cgroups: Vec<Cgroup> = (0..N)
        .map(|i| Cgroup::unique(&format!("daemon-c{i}")))
        .collect();
    let mut procs: Vec<ContainerProcess> = (0..N)
        .map(|i| fx.spawn(&gpu, &cgroups[i], &format!("c{i}"), true, &["64"]))
        .collect();
    let host: Vec<u32> = procs.iter().map(ContainerProcess::host_pid).collect();
    for p in &mut procs {
        p.send_line("go");
    }
    let mut filled: Vec<Option<u64>> = vec![None; N];
    let t = Instant::now();
    while filled.iter().any(Option::is_none) && t.elapsed() < Duration::from_secs(30) {
        for i in 0..N {
            if filled[i].is_none() {
                if let Some((hp, _, _)) = slot_of(&fx.region(&format!("c{i}")), 1) {
                    if hp == host[i] as i32 {
                        filled[i] = Some(now_ns());
                    } else {
                        assert!(
                            hp == 0,
                            "c{i}: slot has host pid {hp}, expected {}",
                            host[i]
                        );
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut lat = Vec::new();
    for i in 0..N {
        let first = fx.mark(&format!("c{i}"), "first_call", Duration::from_secs(1));
        let at = filled[i].unwrap_or_else(|| {
            panic!(
                "c{i} (host pid {}): host pid never filled; slot {:?}\n{}",
                host[i],
                slot_of(&fx.region(&format!("c{i}")), 1),
                daemon.log_text()
            )
        });
        lat.push(Duration::from_nanos(at.saturating_sub(first)));
    }
    lat.sort();
    eprintln!(
        "host-PID fill latency over {N} containers: min {:?} median {:?} max {:?}",
        lat[0],
        lat[N / 2],
        lat[N - 1]
    );
    assert!(
        lat[N - 1] <= Duration::from_secs(1),
        "slowest fill {:?}",
        lat[N - 1]
    );

    // Metrics match the regions (every program holds its 64 MiB now).
    for i in 0..N {
        fx.mark(&format!("c{i}"), "allocated", Duration::from_secs(10));
    }
    std::thread::sleep(Duration::from_millis(1200));
    let m = daemon.metrics();
    for (i, cgroup) in cgroups.iter().enumerate() {
        let path = fx.region(&format!("c{i}"));
        let (_, total, data) = slot_of(&path, 1).expect("slot");
        assert!(data >= 64 * MIB, "c{i} data {data}");
        let shown = path.display().to_string();
        let labels = [("region", shown.as_str()), ("vdevice_index", "0")];
        assert_eq!(
            sample(&m, "hami_vgpu_memory_used_bytes", &labels),
            Some(total as f64),
            "c{i}\n{m}"
        );
        assert_eq!(
            sample(&m, "hami_container_device_memory_bytes", &labels),
            Some(total as f64)
        );
        assert_eq!(
            sample(&m, "hami_vgpu_memory_buffer_bytes", &labels),
            Some(data as f64)
        );
        assert_eq!(
            sample(&m, "hami_vgpu_memory_limit_bytes", &labels),
            Some((2u64 << 30) as f64)
        );
        // No SM limit set: the whole GPU.
        assert_eq!(
            sample(&m, "vgpu_sm_limit_percent", &labels),
            Some(100.0),
            "c{i}\n{m}"
        );
        assert!(
            m.contains(&format!("cgroup=\"{}\"", cgroup.rel())),
            "c{i}: no series with cgroup {}",
            cgroup.rel()
        );
    }
    // The daemon found every process: it either wrote its host PID or found
    // the slot already right (the hook learns its own host PID when it can,
    // during its context measurement). Wrong values are rewritten, so the
    // slots checked above are right either way.
    let fills = sample(&m, "vgpu_hostpid_fills_total", &[]).unwrap_or(0.0);
    let verified = sample(&m, "vgpu_hostpid_verified_total", &[]).unwrap_or(0.0);
    assert!(
        fills + verified >= N as f64,
        "fills {fills} verified {verified}"
    );
    assert_eq!(
        sample(&m, "vgpu_probe_events_total", &[("kind", "launch")]),
        None
    );
    assert!(sample(&m, "vgpu_probe_events_total", &[("kind", "alloc")]).unwrap_or(0.0) >= N as f64);
    // Hooked programs whose accounting is right are not findings.
    let f = findings_doc(&daemon);
    assert_eq!(f["findings"].as_array().map(Vec::len), Some(0), "{f:#}");
    assert_eq!(
        sample(&m, "vgpu_findings", &[("kind", "untracked_allocation")]),
        Some(0.0)
    );

    for p in procs {
        p.wait();
    }
    daemon.stop();
}

#[test]
fn allocations_behind_the_hook_are_findings() {
    let fx = Fixture::new();
    let gpu = SimGpu::new();
    let daemon = start_daemon(&fx, &gpu, &["--slot-grace", "1"]);
    let cg_hidden = Cgroup::unique("daemon-hidden");
    let cg_bare = Cgroup::unique("daemon-bare");
    // Hooked, 64 MiB through the hook and 256 MiB through a dlmopen'd libcuda.
    let mut hidden = fx.spawn(&gpu, &cg_hidden, "hidden", true, &["64", "256"]);
    // No hook at all: no region, 128 MiB.
    let mut bare = fx.spawn(&gpu, &cg_bare, "bare", false, &["128"]);
    let hidden_pid = hidden.host_pid();
    let bare_pid = bare.host_pid();
    hidden.send_line("go");
    bare.send_line("go");
    let t_alloc = fx.mark("hidden", "allocated", Duration::from_secs(10));
    fx.mark("bare", "allocated", Duration::from_secs(10));

    // The findings endpoint, within 2 s of the allocation.
    let found = poll_until(Duration::from_secs(10), || {
        findings_doc(&daemon)["findings"].as_array().and_then(|l| {
            l.iter()
                .find(|x| x["kind"] == "untracked_allocation" && x["pid"] == hidden_pid)
                .cloned()
        })
    })
    .unwrap_or_else(|| {
        panic!(
            "no finding within 10 s: {:#}\n{}",
            findings_doc(&daemon),
            daemon.log_text()
        )
    });
    let after = Duration::from_nanos(now_ns().saturating_sub(t_alloc));
    eprintln!("untracked allocation reported {after:?} after it was made: {found:#}");
    assert!(after <= Duration::from_secs(2), "took {after:?}");
    let bytes = found["untracked_bytes"].as_u64().unwrap();
    assert!(bytes >= 256 * MIB, "{found:#}");
    assert_eq!(found["ns_pid"], 1);
    assert_eq!(found["cgroup"], cg_hidden.rel());
    assert_eq!(found["region"], fx.region("hidden").display().to_string());
    assert!(found["tracked_data_bytes"].as_u64().unwrap() >= 64 * MIB);

    // The unhooked process: no region (after the 1 s grace).
    let bare_f = poll_until(Duration::from_secs(10), || finding_of(&daemon, bare_pid))
        .unwrap_or_else(|| {
            panic!(
                "no finding for the bare process within 10 s: {:#}",
                findings_doc(&daemon)
            )
        });
    assert_eq!(bare_f["kind"], "no_region", "{bare_f:#}");
    assert!(
        bare_f["untracked_bytes"].as_u64().unwrap() >= 128 * MIB,
        "{bare_f:#}"
    );

    // Metrics.
    let m = daemon.metrics();
    assert_eq!(
        sample(&m, "vgpu_findings", &[("kind", "untracked_allocation")]),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "vgpu_findings", &[("kind", "no_region")]),
        Some(1.0),
        "{m}"
    );
    let rel = cg_hidden.rel();
    let ub = sample(&m, "vgpu_untracked_bytes", &[("cgroup", rel.as_str())])
        .expect("untracked bytes series");
    assert_eq!(ub as u64, bytes);
    // The state file and `vgpu findings`.
    let out = Command::new(dist::vgpu_bin())
        .args(["findings", "--json", "--state-dir"])
        .arg(fx.path("state"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: HashMap<u64, String> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["pid"].as_u64().unwrap(),
                x["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        kinds.get(&(hidden_pid as u64)).map(String::as_str),
        Some("untracked_allocation")
    );
    assert_eq!(
        kinds.get(&(bare_pid as u64)).map(String::as_str),
        Some("no_region")
    );
    // … and `vgpu inspect --json` carries them.
    let out = Command::new(dist::vgpu_bin())
        .args(["inspect", "--json", "--state-dir"])
        .arg(fx.path("state"))
        .arg(fx.dir.path().join("regions"))
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).expect("inspect json");
    let listed = v["daemon_findings"]["findings"]
        .as_array()
        .expect("daemon_findings");
    assert!(
        listed
            .iter()
            .any(|x| x["pid"] == hidden_pid && x["kind"] == "untracked_allocation"),
        "{v:#}"
    );

    hidden.wait();
    bare.wait();
    // The log has one line per finding with pid, container and bytes, at
    // the daemon's default level (the fixture passes no -v, as the
    // DaemonSet does not), which shows INFO events.
    let log = daemon.stop();
    assert!(log.contains(" INFO "), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("untracked allocation: pid") && l.contains(&hidden_pid.to_string()))
        .unwrap_or_else(|| panic!("no log line: {log}"));
    assert!(
        line.contains(&rel) && line.contains(&bytes.to_string()),
        "{line}"
    );
}

/// The host PID in the live slot of namespace PID 1 that records PID
/// namespace `pidns`.
fn host_pid_of_ns(path: &Path, pidns: u64) -> Option<i32> {
    let f = RegionFile::open(path, Access::ReadOnly).ok()?;
    let r = f.region();
    r.active_slots()
        .iter()
        .find(|s| {
            s.pid.load(SeqCst) == 1
                && s.pidns.load(SeqCst) == pidns
                && s.status.load(SeqCst) != status::EXITED
        })
        .map(|s| s.hostpid.load(SeqCst))
}

/// Two PID namespaces share one region, each with a PID 1: each slot gets
/// its own process's host PID and keeps it; a third PID 1, without the
/// hook, naming the same region, is `no_region`, never taken for one of
/// the hooked ones.
#[test]
fn pid_1_of_two_namespaces_sharing_a_region_each_get_their_own_host_pid() {
    let fx = Fixture::new();
    let gpu = SimGpu::new();
    let daemon = start_daemon(&fx, &gpu, &["--slot-grace", "1"]);
    let cgs: Vec<Cgroup> = (0..3)
        .map(|i| Cgroup::unique(&format!("daemon-ns{i}")))
        .collect();
    let names = ["ns-a", "ns-b", "ns-bare"];
    let mut procs: Vec<ContainerProcess> = (0..3)
        .map(|i| fx.spawn_on(&gpu, &cgs[i], names[i], "shared", i < 2, &["64"]))
        .collect();
    let hooked: Vec<(u32, u64)> = procs[..2]
        .iter()
        .map(|p| (p.host_pid(), p.pidns_inum()))
        .collect();
    let bare_pid = procs[2].host_pid();
    for p in &mut procs {
        p.send_line("go");
    }
    for n in names {
        fx.mark(n, "allocated", Duration::from_secs(10));
    }
    let region = fx.region("shared");
    let right = || {
        hooked
            .iter()
            .all(|&(host, ns)| host_pid_of_ns(&region, ns) == Some(host as i32))
    };
    let shown = || {
        hooked
            .iter()
            .map(|&(host, ns)| {
                format!(
                    "host pid {host}: slot has {:?}",
                    host_pid_of_ns(&region, ns)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    assert!(
        poll_until(Duration::from_secs(10), &right).is_some(),
        "host pids not right within 10 s: {}\n{}",
        shown(),
        daemon.log_text()
    );
    // … and they stay right (the daemon polls every 100 ms).
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(1) {
        assert!(right(), "a slot got another host pid: {}", shown());
        std::thread::sleep(Duration::from_millis(5));
    }
    let bare = poll_until(Duration::from_secs(10), || finding_of(&daemon, bare_pid))
        .unwrap_or_else(|| {
            panic!(
                "no finding for the process without the hook within 10 s: {:#}\n{}",
                findings_doc(&daemon),
                daemon.log_text()
            )
        });
    assert_eq!(bare["kind"], "no_region", "{bare:#}");
    assert_eq!(bare["ns_pid"], 1, "{bare:#}");
    let f = findings_doc(&daemon);
    for &(host, _) in &hooked {
        assert!(
            !f["findings"]
                .as_array()
                .is_some_and(|l| l.iter().any(|x| x["pid"] == host)),
            "hooked pid {host}: {f:#}"
        );
    }
    for p in procs {
        p.wait();
    }
}

/// A slot's (pid, status, hostpid, total on device 0) by index.
fn slot_at(path: &Path, i: usize) -> (i32, i32, i32, u64) {
    let f = RegionFile::open(path, Access::ReadOnly).expect("open region");
    let s = &f.region().procs[i];
    (
        s.pid.load(SeqCst),
        s.status.load(SeqCst),
        s.hostpid.load(SeqCst),
        s.used[0].total.load(SeqCst),
    )
}

/// Index of the live slot of namespace PID 1 recording PID namespace `pidns`.
fn slot_index_of_ns(path: &Path, pidns: u64) -> Option<usize> {
    let f = RegionFile::open(path, Access::ReadOnly).ok()?;
    f.region().active_slots().iter().position(|s| {
        s.pid.load(SeqCst) == 1
            && s.pidns.load(SeqCst) == pidns
            && s.status.load(SeqCst) != status::EXITED
    })
}

/// The hook keeps a slot until its process is dead, so after a container's
/// last process exits normally nobody in it frees the slot: the daemon
/// does, within a few seconds. The slot of a live process (another PID
/// namespace sharing the region, which the hook there does not judge)
/// keeps its host PID and usage all along.
#[test]
fn a_dead_process_slot_is_freed_and_a_live_one_never_is() {
    let fx = Fixture::new();
    let gpu = SimGpu::new();
    let daemon = start_daemon(&fx, &gpu, &[]);
    let cgs: Vec<Cgroup> = (0..2)
        .map(|i| Cgroup::unique(&format!("daemon-reclaim{i}")))
        .collect();
    let names = ["exits", "lives"];
    let mut procs: Vec<ContainerProcess> = (0..2)
        .map(|i| fx.spawn_on(&gpu, &cgs[i], names[i], "shared", true, &["64"]))
        .collect();
    let ids: Vec<(u32, u64)> = procs
        .iter()
        .map(|p| (p.host_pid(), p.pidns_inum()))
        .collect();
    for p in &mut procs {
        p.send_line("go");
    }
    for n in names {
        fx.mark(n, "allocated", Duration::from_secs(10));
    }
    let region = fx.region("shared");
    let filled = poll_until(Duration::from_secs(10), || {
        ids.iter()
            .all(|&(host, ns)| host_pid_of_ns(&region, ns) == Some(host as i32))
    });
    assert!(
        filled.is_some(),
        "host pids not filled within 10 s\n{}",
        daemon.log_text()
    );
    let dead = slot_index_of_ns(&region, ids[0].1).expect("slot of the exiting process");
    let live = slot_index_of_ns(&region, ids[1].1).expect("slot of the live process");
    assert!(slot_at(&region, dead).3 >= 64 * MIB);
    let live_slot = slot_at(&region, live);
    assert!(live_slot.3 >= 64 * MIB, "{live_slot:?}");

    let st = procs.remove(0).wait();
    assert!(st.success(), "exiting process: {st}");
    let t = Instant::now();
    loop {
        let s = slot_at(&region, dead);
        if s == (0, status::EXITED, 0, 0) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the dead process's slot {dead} is still {s:?} after 5 s\n{}",
            daemon.log_text()
        );
        assert_eq!(slot_at(&region, live), live_slot, "the live slot changed");
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "slot of a normal exit freed {:?} after the process was reaped",
        t.elapsed()
    );
    // The live one stays as it was, scan after scan.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        assert_eq!(slot_at(&region, live), live_slot, "the live slot changed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let m = daemon.metrics();
    assert_eq!(
        sample(&m, "vgpu_slots_reclaimed_total", &[]),
        Some(1.0),
        "{m}"
    );
    assert!(
        daemon.log_text().contains(&format!(
            "freed slot {dead} of {}: pid 1 (host pid {}) is dead",
            region.display(),
            ids[0].0
        )),
        "{}",
        daemon.log_text()
    );
    for p in procs {
        p.wait();
    }
}

/// The programs' rare diagnostics (aya-log) reach the daemon's log: with
/// room for one process, a second one's calls find the per-process maps
/// full; that is counted, and its first occurrence is logged.
#[test]
fn a_full_probe_map_is_logged_by_the_daemon() {
    let fx = Fixture::new();
    let gpu = SimGpu::new();
    let daemon = start_daemon(&fx, &gpu, &["--max-procs", "1"]);
    assert!(!daemon.log_text().contains("procs_full"));
    let cgroups = [
        Cgroup::unique("daemon-full-a"),
        Cgroup::unique("daemon-full-b"),
    ];
    let mut procs: Vec<ContainerProcess> = (0..2)
        .map(|i| fx.spawn(&gpu, &cgroups[i], &format!("full{i}"), false, &["8"]))
        .collect();
    for (i, p) in procs.iter_mut().enumerate() {
        p.send_line("go");
        fx.mark(&format!("full{i}"), "allocated", Duration::from_secs(30));
    }
    let want = "procs_full (first time on this CPU";
    // 10 s for the log line and the counter together.
    let t = Instant::now();
    let logged = poll_until(Duration::from_secs(10), || daemon.log_text().contains(want));
    assert!(
        logged.is_some(),
        "no diagnostic in the daemon's log within 10 s: {}",
        daemon.log_text()
    );
    // The counter behind it is exported at the next scan.
    let lost = || {
        sample(
            &daemon.metrics(),
            "vgpu_probe_lost_events_total",
            &[("reason", "procs_full")],
        )
        .unwrap_or(0.0)
    };
    let left = Duration::from_secs(10).saturating_sub(t.elapsed());
    let counted = poll_until(left, || lost() >= 1.0);
    assert!(
        counted.is_some(),
        "procs_full not counted within 10 s: {}",
        daemon.metrics()
    );
    for p in procs {
        p.wait();
    }
    let log = daemon.stop();
    let line = log.lines().find(|l| l.contains(want)).unwrap();
    eprintln!("{line}");
    assert!(line.contains("WARN"), "{line}");
    // Once per CPU at most, though every call of the second process missed.
    // SAFETY: sysconf has no memory arguments.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
    assert!(log.matches(want).count() <= cpus, "{log}");
}
