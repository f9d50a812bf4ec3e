//! The root daemon and the admin commands against a hostile tenant (issue
//! 17 items 1, 2, 4, 6, 8), on the simulated GPU, as root: every byte of a
//! region, every path a container names and everything in its directory is
//! attacker-controlled. Each test is an attack that worked before the
//! daemon stopped mapping, following and trusting those files.

use std::ffi::OsStr;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use vgpu_common::region::{status, MAGIC, MAJOR_VERSION};
use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::container::{Cgroup, ContainerProcess};
use vgpu_tests::daemon::{Running, Workdir};
use vgpu_tests::dist;
use vgpu_tests::http::{get, get_on, loopback};
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::eventually;

/// A `vgpu daemon` probing this fixture's own libcuda copy, the HAMi
/// directory at `root`, without NVML.
fn start_daemon(fx: &Fixture, gpu: &SimGpu, root: &Path) -> Running {
    fx.start_daemon(gpu, &fx.path("state"), root, &["--no-nvml"])
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
        Fixture(Workdir::new("vgpu-secd-", &["regions", "out", "root"]))
    }

    /// Starts `daemon_prog` in a new container naming `region`, and lets it
    /// allocate 64 MiB.
    fn spawn(
        &self,
        gpu: &SimGpu,
        cg: &Cgroup,
        name: &str,
        region: &Path,
        hooked: bool,
    ) -> ContainerProcess {
        self.spawn_allocating(gpu, cg, &self.prog, name, region, hooked)
    }

    /// Waits until `name`'s program reports its allocation.
    fn allocated(&self, name: &str) {
        let t = Instant::now();
        let out = self.path("out").join(name);
        loop {
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            if text.contains("allocated") {
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "{name}: {text:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A minimal HTTP/1.1 GET from `from` (a loopback source address): (status,
/// body).
fn get_from(from: [u8; 4], port: u16, path: &str) -> Option<(u16, String)> {
    let sock = socket_from(from)?;
    get_on(connect(sock, loopback(port))?, path)
}

/// A TCP socket bound to `from` (so a probe can come from another
/// loopback address than a flood).
fn socket_from(from: [u8; 4]) -> Option<i32> {
    // SAFETY: plain socket syscalls on a descriptor this function owns; the
    // sockaddr is a fully initialised sockaddr_in.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_addr.s_addr = u32::from_ne_bytes(from);
        let rc = libc::bind(
            fd,
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        if rc != 0 {
            libc::close(fd);
            return None;
        }
        Some(fd)
    }
}

fn connect(fd: i32, addr: SocketAddr) -> Option<TcpStream> {
    use std::os::fd::FromRawFd as _;
    let SocketAddr::V4(v4) = addr else {
        return None;
    };
    // SAFETY: `fd` is an open socket this function takes ownership of (the
    // TcpStream closes it); the sockaddr is fully initialised.
    unsafe {
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_port = v4.port().to_be();
        sa.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
        let s = TcpStream::from_raw_fd(fd);
        let rc = libc::connect(
            fd,
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        (rc == 0).then_some(s)
    }
}

/// A valid, initialised region file with `proc_num` slots in use.
fn make_region(path: &Path, proc_num: i32) -> RegionFile {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let f = RegionFile::create_or_open(path).expect("create region");
    let r = f.region();
    r.major_version.store(MAJOR_VERSION, SeqCst);
    r.minor_version.store(2, SeqCst);
    r.device_num.store(1, SeqCst);
    r.limit[0].store(1 << 30, SeqCst);
    r.proc_num.store(proc_num, SeqCst);
    r.initialized_flag.store(MAGIC, SeqCst);
    f
}

/// Host PID the daemon wrote into the live slot of `pid` in `path`.
fn hostpid_in(path: &Path, pid: i32) -> Option<i32> {
    let f = RegionFile::open(path, Access::ReadOnly).ok()?;
    let r = f.region();
    r.active_slots()
        .iter()
        .find(|s| s.pid.load(SeqCst) == pid && s.status.load(SeqCst) != status::EXITED)
        .map(|s| s.hostpid.load(SeqCst))
        .filter(|h| *h > 0)
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

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Runs `vgpu args…`, killing it after `limit`: (finished in time, exit
/// success, stderr).
fn vgpu_bounded(args: &[&OsStr], limit: Duration) -> (bool, bool, String) {
    let mut c = Command::new(dist::vgpu_bin())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vgpu");
    let t = Instant::now();
    loop {
        if let Ok(Some(st)) = c.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = c.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return (true, st.success(), err);
        }
        if t.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            return (false, false, String::new());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Item 1: a tenant truncates its region (found under the regions root,
/// and named by a process) once the daemon has it. The daemon lives on,
/// keeps serving, and still exports the untouched container.
#[test]
fn truncating_a_region_never_crashes_the_daemon() {
    let fx = Fixture::new();
    let gpu = SimGpu::new();
    let root = fx.path("root");
    let a = root.join("podA_main/r.cache");
    let b = fx.path("regions/b.cache");
    let c = fx.path("regions/c.cache");
    std::fs::create_dir_all(a.parent().unwrap()).unwrap();
    let mut daemon = start_daemon(&fx, &gpu, &root);
    let cgs: Vec<Cgroup> = ["a", "b", "c"]
        .iter()
        .map(|n| Cgroup::unique(&format!("secd-trunc-{n}")))
        .collect();
    let _procs: Vec<ContainerProcess> = [(&a, "a"), (&b, "b"), (&c, "c")]
        .iter()
        .zip(&cgs)
        .map(|((path, name), cg)| fx.spawn(&gpu, cg, name, path, true))
        .collect();
    for (path, name) in [(&a, "a"), (&b, "b"), (&c, "c")] {
        fx.allocated(name);
        eventually(
            Duration::from_secs(10),
            &format!("{name}'s host pid"),
            || hostpid_in(path, 1).is_some(),
        );
    }
    // Let a scan read all three (the series exist).
    eventually(Duration::from_secs(5), "c exported", || {
        daemon
            .metrics()
            .contains(&format!("region=\"{}\"", c.display()))
    });
    // The owners are frozen first: a hooked process re-attaches and refills
    // its truncated region within a second (its background look reads its
    // slot), and this test is about the daemon meeting the truncated file.
    let freeze = |cg: &Cgroup, on: &str| {
        std::fs::write(cg.path().join("cgroup.freeze"), on).expect("cgroup.freeze");
    };
    for cg in &cgs[..2] {
        freeze(cg, "1");
    }
    for p in [&a, &b] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .unwrap()
            .set_len(0)
            .unwrap();
    }
    // Several polls (100 ms) and scans (500 ms) go by.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        daemon.assert_serving();
        std::thread::sleep(Duration::from_millis(100));
    }
    daemon.assert_serving();
    let m = daemon.metrics();
    assert!(m.contains(&format!("region=\"{}\"", c.display())), "{m}");
    for p in [&a, &b] {
        assert!(
            !m.contains(&format!("region=\"{}\"", p.display())),
            "a truncated region is still exported: {m}"
        );
    }
    for cg in &cgs[..2] {
        freeze(cg, "0");
    }
}

/// inotify watch on `path` for opens and reads: what would show the daemon
/// touching a host file.
struct OpenWatch(i32);

impl OpenWatch {
    fn new(path: &Path) -> OpenWatch {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: inotify calls with a valid NUL-terminated path.
        unsafe {
            let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
            assert!(fd >= 0);
            let wd = libc::inotify_add_watch(
                fd,
                c.as_ptr(),
                libc::IN_OPEN | libc::IN_ACCESS | libc::IN_MODIFY,
            );
            assert!(wd >= 0);
            OpenWatch(fd)
        }
    }

    /// Bytes of events queued so far (0: nobody opened the file).
    fn events(&self) -> isize {
        let mut buf = [0u8; 4096];
        // SAFETY: reading into a local buffer of the stated length.
        let n = unsafe { libc::read(self.0, buf.as_mut_ptr().cast(), buf.len()) };
        n.max(0)
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        // SAFETY: closing the descriptor this watch owns.
        unsafe { libc::close(self.0) };
    }
}

/// Item 2: symlinks (absolute, relative with `..`, a directory link, a
/// regular file swapped for a link) named by a process or found under the
/// regions root never make the daemon open the host file they point at.
#[test]
fn symlinked_regions_never_open_the_target() {
    let fx = Fixture::new();
    let gpu = SimGpu::new();
    let root = fx.path("root");
    // The host file: a valid region (so nothing but the path refuses it),
    // mode 600, with one slot the attacker wants filled.
    let secret = fx.path("secret/host.cache");
    let victim = make_region(&secret, 1);
    victim.region().procs[0].pid.store(1, SeqCst);
    victim.region().procs[0]
        .status
        .store(status::RUNNING, SeqCst);
    drop(victim);
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let regions = fx.path("regions");
    symlink(&secret, regions.join("abs.cache")).unwrap();
    symlink("../secret/host.cache", regions.join("rel.cache")).unwrap();
    symlink(fx.path("secret"), regions.join("dir")).unwrap();
    std::fs::create_dir_all(root.join("podL_main")).unwrap();
    symlink(&secret, root.join("podL_main/ln.cache")).unwrap();
    symlink(fx.path("secret"), root.join("podD_main")).unwrap();

    let mut daemon = start_daemon(&fx, &gpu, &root);
    // The swap: a real region, in use and filled, then replaced by a link.
    let swap = regions.join("swap.cache");
    let cg_s = Cgroup::unique("secd-link-s");
    let _owner = fx.spawn(&gpu, &cg_s, "s", &swap, true);
    fx.allocated("s");
    eventually(Duration::from_secs(10), "swap's host pid", || {
        hostpid_in(&swap, 1).is_some()
    });
    let watch = OpenWatch::new(&secret);
    symlink(&secret, regions.join("swap.tmp")).unwrap();
    std::fs::rename(regions.join("swap.tmp"), &swap).unwrap();

    // Unhooked CUDA processes naming each link: the daemon looks their
    // regions up (hooked ones would open the link themselves).
    let names = ["abs.cache", "rel.cache", "dir/host.cache", "swap.cache"];
    let cgs: Vec<Cgroup> = (0..names.len())
        .map(|i| Cgroup::unique(&format!("secd-link-{i}")))
        .collect();
    let _procs: Vec<ContainerProcess> = names
        .iter()
        .enumerate()
        .map(|(i, n)| fx.spawn(&gpu, &cgs[i], &format!("l{i}"), &regions.join(n), false))
        .collect();
    for i in 0..names.len() {
        fx.allocated(&format!("l{i}"));
    }
    // Many polls and scans.
    std::thread::sleep(Duration::from_secs(3));
    daemon.assert_alive();
    let opened = watch.events();
    let fd_links: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect();
    let findings = get(daemon.port, "/findings")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let log = daemon.log_text();
    assert_eq!(opened, 0, "the daemon opened the host file; log:\n{log}");
    assert!(!fd_links.iter().any(|l| l == &secret), "{fd_links:?}");
    let v = RegionFile::open(&secret, Access::ReadOnly).unwrap();
    assert_eq!(
        v.region().procs[0].hostpid.load(SeqCst),
        0,
        "victim slot written"
    );
    assert!(
        !findings.contains("magic") && !log.contains("magic 0x"),
        "{findings}\n{log}"
    );
}

/// Items 2 and 6: a FIFO named as a region hangs no admin command, nor one
/// in place of the daemon's `turns.json` `vgpu turns`.
#[test]
fn a_fifo_hangs_no_command() {
    let dir = tempfile::Builder::new()
        .prefix("vgpu-secd-fifo-")
        .tempdir()
        .unwrap();
    let fifo = dir.path().join("r.cache");
    let table = dir.path().join("turns.json");
    for p in [&fifo, &table] {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    }
    let f = fifo.as_os_str();
    // A scan of the directory skips the FIFO (not a regular file): it only
    // has to finish.
    let scan: [&OsStr; 3] = [
        "inspect".as_ref(),
        "--json".as_ref(),
        dir.path().as_os_str(),
    ];
    assert!(
        vgpu_bounded(&scan, Duration::from_secs(5)).0,
        "vgpu inspect DIR hung on a FIFO"
    );
    let cmds: Vec<Vec<&OsStr>> = vec![
        vec!["inspect".as_ref(), f],
        vec![
            "turns".as_ref(),
            "--state-dir".as_ref(),
            dir.path().as_os_str(),
        ],
        vec!["set-mem-limit".as_ref(), f, "--all".as_ref(), "1g".as_ref()],
        vec!["set-sm-limit".as_ref(), f, "--all".as_ref(), "50".as_ref()],
        vec!["cleanup".as_ref(), f],
        vec!["unlock".as_ref(), f],
        vec!["suspend".as_ref(), f, "--timeout".as_ref(), "1".as_ref()],
        vec!["resume".as_ref(), f, "--timeout".as_ref(), "1".as_ref()],
    ];
    for args in cmds {
        let (done, ok, err) = vgpu_bounded(&args, Duration::from_secs(5));
        assert!(done, "vgpu {args:?} hung on a FIFO");
        assert!(!ok, "vgpu {args:?} succeeded on a FIFO: {err}");
    }
}

/// Item 6: admin commands refuse a region reached through a symlink (the
/// tenant's link to another container's region).
#[test]
fn admin_commands_refuse_symlinks() {
    let dir = tempfile::Builder::new()
        .prefix("vgpu-secd-adm-")
        .tempdir()
        .unwrap();
    let other = dir.path().join("other/r.cache");
    let r = make_region(&other, 0);
    let link = dir.path().join("mine.cache");
    symlink(&other, &link).unwrap();
    let l = link.as_os_str();
    for args in [
        vec![
            "set-mem-limit".as_ref(),
            l,
            "--all".as_ref(),
            "64g".as_ref(),
        ],
        vec!["set-sm-limit".as_ref(), l, "--all".as_ref(), "100".as_ref()],
        vec!["cleanup".as_ref(), l],
        vec!["unlock".as_ref(), l],
        vec!["inspect".as_ref(), l],
    ] {
        let args: Vec<&OsStr> = args;
        let (done, ok, err) = vgpu_bounded(&args, Duration::from_secs(10));
        assert!(done && !ok, "vgpu {args:?} followed a symlink: {err}");
        assert!(err.contains("symbolic link"), "{args:?}: {err}");
    }
    assert_eq!(r.region().limit[0].load(SeqCst), 1 << 30, "limit unchanged");
}

/// A child killed and reaped when dropped (also when a test panics).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Item 6: `suspend`/`resume` do not signal a host process that a slot's
/// forged `hostpid` names, even one that catches the signals.
#[test]
fn suspend_never_signals_a_forged_hostpid() {
    let dir = tempfile::Builder::new()
        .prefix("vgpu-secd-sig-")
        .tempdir()
        .unwrap();
    let got = dir.path().join("got");
    // A host daemon that would act on SIGUSR1/2.
    let decoy = Reaped(
        Command::new("sh")
        .arg("-c")
        .arg(r#"trap 'echo usr2 >> "$0"' USR2; trap 'echo usr1 >> "$0"' USR1; echo up >> "$0"; while :; do sleep 0.05; done"#)
        .arg(&got)
        .spawn()
        .expect("spawn decoy"),
    );
    eventually(Duration::from_secs(5), "decoy up", || {
        std::fs::read_to_string(&got).is_ok_and(|s| s.contains("up"))
    });
    // Give the shell time to install its traps.
    std::thread::sleep(Duration::from_millis(200));
    let path = dir.path().join("r.cache");
    let r = make_region(&path, 1);
    let slot = &r.region().procs[0];
    slot.pid.store(1, SeqCst);
    slot.status.store(status::RUNNING, SeqCst);
    slot.hostpid.store(decoy.0.id() as i32, SeqCst);
    for verb in ["suspend", "resume"] {
        let args: Vec<&OsStr> = vec![
            verb.as_ref(),
            path.as_os_str(),
            "--timeout".as_ref(),
            "1".as_ref(),
        ];
        let (done, ok, err) = vgpu_bounded(&args, Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(300));
        let seen = std::fs::read_to_string(&got).unwrap_or_default();
        assert_eq!(seen.trim(), "up", "{verb} signalled the decoy: {err}");
        assert!(done && !ok, "vgpu {verb} accepted a forged host pid: {err}");
        assert!(err.contains("not trusted"), "{verb}: {err}");
    }
    drop(decoy);
}

/// Item 4: a request whose headers never finish is dropped within seconds,
/// and `/metrics` answers meanwhile.
#[test]
fn a_half_sent_request_is_dropped_within_seconds() {
    let fx = Fixture::new();
    let gpu = SimGpu::new();
    let daemon = start_daemon(&fx, &gpu, &fx.path("root"));
    let mut slow = TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    write!(slow, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let t = Instant::now();
    let (code, _) = get(daemon.port, "/metrics").expect("metrics while a request hangs");
    assert_eq!(code, 200);
    let mut buf = [0u8; 256];
    // The server closes (0, or an error response then 0); a timeout of the
    // read is the failure.
    loop {
        match slow.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) => panic!("half-sent request still open after {:?}: {e}", t.elapsed()),
        }
    }
    let held = t.elapsed();
    assert!(held < Duration::from_secs(8), "held {held:?}");
}

/// Item 4: a flood of connections with large, never-finished headers keeps
/// the daemon's memory and CPU bounded, and `/healthz` (from another
/// address, as the kubelet's probe comes) answers in under 100 ms.
#[test]
fn a_connection_flood_stays_bounded() {
    let fx = Fixture::new();
    let gpu = SimGpu::new();
    let mut daemon = start_daemon(&fx, &gpu, &fx.path("root"));
    let rss0 = rss_kib(daemon.pid());
    let cpu0 = cpu_secs(daemon.pid());
    let t0 = Instant::now();
    let header = format!("X-Fill: {}\r\n", "a".repeat(8000));
    let mut flood = Vec::new();
    for _ in 0..600 {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", daemon.port)) else {
            continue;
        };
        let _ = s.set_nonblocking(true);
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
        for _ in 0..40 {
            if s.write_all(header.as_bytes()).is_err() {
                break;
            }
        }
        flood.push(s);
    }
    std::thread::sleep(Duration::from_secs(1));
    daemon.assert_alive();
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        let r = get_from([127, 0, 0, 2], daemon.port, "/healthz");
        worst = worst.max(t.elapsed());
        assert_eq!(r.map(|(s, _)| s), Some(200), "healthz during the flood");
        std::thread::sleep(Duration::from_millis(50));
    }
    let rss = rss_kib(daemon.pid());
    let cpu = cpu_secs(daemon.pid()) - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    drop(flood);
    eprintln!(
        "flood: rss {rss0} -> {rss} KiB, cpu {cpu:.2} s over {wall:.1} s, worst healthz {worst:?}"
    );
    assert!(worst < Duration::from_millis(100), "healthz took {worst:?}");
    assert!(rss < rss0 + 64 * 1024, "rss grew from {rss0} to {rss} KiB");
    assert!(cpu < wall, "cpu {cpu:.2} s over {wall:.1} s");
}

/// Item 8: a thousand sparse valid region files in one container directory
/// cost little, crowd no other container out, and a value above i64::MAX
/// and a deleted region are exported right.
#[test]
fn a_thousand_sparse_regions_stay_cheap() {
    let fx = Fixture::new();
    let gpu = SimGpu::new();
    let root = fx.path("root");
    let flood = root.join("podF_main");
    std::fs::create_dir_all(&flood).unwrap();
    let mut template = vec![0u8; 12];
    template[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    template[4..8].copy_from_slice(&MAJOR_VERSION.to_le_bytes());
    for i in 0..1000 {
        let p = flood.join(format!("{i:04}.cache"));
        std::fs::write(&p, &template).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(vgpu_common::region::FILE_SIZE).unwrap();
        // proc_num = 1024: every slot would be read; one device with a
        // limit: every file would export its series.
        use std::os::unix::fs::FileExt as _;
        f.write_all_at(&1024i32.to_le_bytes(), 2_008_896).unwrap();
        f.write_all_at(&1u64.to_le_bytes(), 56).unwrap();
        f.write_all_at(&(1u64 << 30).to_le_bytes(), 1600).unwrap();
    }
    let other = root.join("podO_main/r.cache");
    let o = make_region(&other, 0);
    o.region().limit[0].store(u64::MAX - 5, SeqCst);
    let mut daemon = start_daemon(&fx, &gpu, &root);
    let cpu0 = cpu_secs(daemon.pid());
    let t0 = Instant::now();
    let mut worst = Duration::ZERO;
    while t0.elapsed() < Duration::from_secs(3) {
        let t = Instant::now();
        assert_eq!(get(daemon.port, "/healthz").map(|(s, _)| s), Some(200));
        worst = worst.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    let cpu = cpu_secs(daemon.pid()) - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    let m = daemon.metrics();
    eprintln!(
        "1000 regions: cpu {cpu:.2} s over {wall:.1} s, worst healthz {worst:?}, metrics {} bytes",
        m.len()
    );
    assert!(worst < Duration::from_millis(100), "healthz took {worst:?}");
    assert!(cpu < 0.5 * wall, "cpu {cpu:.2} s over {wall:.1} s");
    assert!(m.len() < 1 << 20, "metrics {} bytes", m.len());
    // 4 of the flood's 1000 files are read; the rest is counted.
    assert!(
        m.lines().any(|l| l == "vgpu_region_files_skipped 996"),
        "{}",
        m.lines()
            .filter(|l| l.contains("skipped"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let limit_line = m
        .lines()
        .find(|l| l.starts_with("hami_vgpu_memory_limit_bytes{") && l.contains("podO"))
        .unwrap_or_else(|| panic!("no limit series for podO: {m}"));
    let v = limit_line.rsplit(' ').next().unwrap_or("");
    assert_eq!(v, (u64::MAX - 5).to_string(), "{limit_line}");
    // Deleted: gone from the next scan's metrics, not a minute later.
    drop(o);
    std::fs::remove_file(&other).unwrap();
    let t = Instant::now();
    eventually(
        Duration::from_millis(1500),
        "deleted region dropped",
        || !daemon.metrics().contains("podO"),
    );
    eprintln!("deleted region dropped after {:?}", t.elapsed());
    daemon.assert_alive();
}
