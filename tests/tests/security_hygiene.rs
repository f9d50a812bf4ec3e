//! The smaller attacks of a hostile tenant, on the
//! simulated GPU, as root: labels a tenant chooses through its paths, lines
//! it forges in the daemon's text log, terminal escapes it writes into its
//! region for `vgpu inspect` and `vgpu top`, and `vgpu install-hook` fed a
//! symlink, an executable or a FIFO. Each test is an attack, and passes
//! only while the attack fails.

use std::ffi::OsStr;
use std::os::unix::fs::{symlink, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::container::Cgroup;
use vgpu_tests::daemon::Workdir;
use vgpu_tests::dist;
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::poll_until;

/// The victim pod: its kubelet log directory names it, HAMi's directory
/// under the regions root is its own.
const VICTIM_UID: &str = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
/// The attacker's pod, as its cgroup (the kernel) says.
const ATTACKER_UID: &str = "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9";

/// A sample line's name and labels (`name{k="v",…} value`).
fn parse_sample(line: &str) -> Option<(&str, Vec<(&str, &str)>)> {
    let (name, rest) = line.split_once('{')?;
    let (labels, _) = rest.rsplit_once("} ")?;
    let labels = labels
        .split("\",")
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k, v.trim_matches('"')))
        })
        .collect();
    Some((name, labels))
}

/// Waits up to 20 s until `name`'s program reports its allocation.
fn allocated(fx: &Workdir, name: &str) {
    let read = || std::fs::read_to_string(fx.out(name)).unwrap_or_default();
    let done = poll_until(Duration::from_secs(20), || read().contains("allocated"));
    assert!(
        done.is_some(),
        "{name}: not allocated within 20 s: {:?}",
        read()
    );
}

/// A tenant names its region inside a directory it called
/// `<victim pod UID>_<victim container>`, as HAMi names the directories it
/// creates. Its series must carry its own pod (from its cgroup: the kernel's
/// view) and never the victim's namespace, pod, container or UID; a tenant
/// whose cgroup names no pod gets no pod labels at all.
#[test]
fn a_forged_directory_name_never_gives_another_pods_labels() {
    let gpu = SimGpu::new();
    let fx = Workdir::new("vgpu-hyg-label-", &["root", "out", "pods", "state"]);
    let logs = fx.path("pods");
    for (ns, pod, uid) in [
        ("victim-ns", "victim-pod", VICTIM_UID),
        ("attacker-ns", "attacker-pod", ATTACKER_UID),
    ] {
        std::fs::create_dir_all(logs.join(format!("{ns}_{pod}_{uid}"))).unwrap();
    }
    // The victim's real directory under the regions root (the device
    // plugin's), empty: its pod has no process here.
    std::fs::create_dir_all(fx.path(&format!("root/{VICTIM_UID}_victim"))).unwrap();
    let forged = |who: &str| {
        let d = fx.path(&format!("{who}/{VICTIM_UID}_victim"));
        std::fs::create_dir_all(&d).unwrap();
        d.join("r.cache")
    };
    let cid = "4f1b3c0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";
    let cg_pod = Cgroup::create(&format!(
        "vgpu-test/kubepods/burstable/pod{ATTACKER_UID}/{cid}"
    ));
    let cg_bare = Cgroup::unique("hyg-label-bare");
    let mut d = fx.start_daemon(
        &gpu,
        &fx.path("state"),
        &fx.path("root"),
        &["--no-nvml", "--pods-log-dir", logs.to_str().unwrap()],
    );
    let mut procs = [
        fx.spawn_allocating(&gpu, &cg_pod, &fx.prog, "pod", &forged("forge-a"), true),
        fx.spawn_allocating(&gpu, &cg_bare, &fx.prog, "bare", &forged("forge-b"), true),
    ];
    allocated(&fx, "pod");
    allocated(&fx, "bare");

    let (pod_cg, bare_cg) = (cg_pod.rel(), cg_bare.rel());
    let text = poll_until(Duration::from_secs(15), || {
        d.assert_alive();
        let body = d.metrics();
        let seen = |cg: &str| {
            body.lines()
                .any(|l| l.starts_with("hami_vgpu_memory_used_bytes{") && l.contains(cg))
        };
        (seen(&pod_cg) && seen(&bare_cg)).then_some(body)
    })
    .unwrap_or_else(|| {
        panic!(
            "the tenants' series did not appear within 15 s:\n{}\n{}",
            d.metrics(),
            d.log_text()
        )
    });
    let mut checked = 0;
    for line in text.lines().filter(|l| l.starts_with("hami_vgpu_")) {
        let Some((_, labels)) = parse_sample(line) else {
            continue;
        };
        let get = |k: &str| labels.iter().find(|(l, _)| *l == k).map_or("", |(_, v)| *v);
        for (k, v) in [
            ("pod_uid", VICTIM_UID),
            ("namespace", "victim-ns"),
            ("pod", "victim-pod"),
            ("container", "victim"),
        ] {
            assert_ne!(get(k), v, "the victim's {k} on another's series: {line}");
        }
        let want = if get("cgroup") == pod_cg {
            [
                ("namespace", "attacker-ns"),
                ("pod", "attacker-pod"),
                ("container", ""),
                ("pod_uid", ATTACKER_UID),
                ("container_id", cid),
            ]
        } else if get("cgroup") == bare_cg {
            [
                ("namespace", ""),
                ("pod", ""),
                ("container", ""),
                ("pod_uid", ""),
                ("container_id", ""),
            ]
        } else {
            continue;
        };
        for (k, v) in want {
            assert_eq!(get(k), v, "label {k} of a tenant's series: {line}");
        }
        checked += 1;
    }
    assert!(checked >= 4, "{checked} series checked:\n{text}");
    for p in &mut procs {
        p.send_line("done");
    }
}

/// A process name (`comm`, from its executable's file name) and a region
/// path holding a newline must not start lines of their own in the
/// daemon's default text log.
#[test]
fn a_newline_in_a_process_name_or_region_path_forges_no_log_line() {
    let gpu = SimGpu::new();
    let fx = Workdir::new("vgpu-hyg-log-", &["root", "out", "state"]);
    // comm is the executable's name, at most 15 bytes.
    let exe = fx.path("x\nFORGED-COMM");
    std::fs::copy(&fx.prog, &exe).unwrap();
    let cg = Cgroup::unique("hyg-log");
    let mut d = fx.start_daemon(&gpu, &fx.path("state"), &fx.path("root"), &["--no-nvml"]);
    let region = PathBuf::from("/nonexistent\nFORGED-PATH here/r.cache");
    let mut p = fx.spawn_allocating(&gpu, &cg, &exe, "unhooked", &region, false);
    allocated(&fx, "unhooked");
    let logged = poll_until(Duration::from_secs(15), || {
        d.assert_alive();
        d.log_text().contains("no region")
    });
    assert!(
        logged.is_some(),
        "no `no region` finding logged within 15 s:\n{}",
        d.log_text()
    );
    // The line is written whole; give it a moment anyway.
    std::thread::sleep(Duration::from_millis(200));
    let log = d.log_text();
    let forged: Vec<&str> = log.lines().filter(|l| l.starts_with("FORGED")).collect();
    assert!(forged.is_empty(), "forged log lines {forged:?} in:\n{log}");
    let line = log
        .lines()
        .find(|l| l.contains("no region"))
        .unwrap_or_default();
    assert!(
        line.contains(r"x\nFORGED-COMM") && line.contains(r"/nonexistent\nFORGED-PATH here"),
        "the finding's line shows neither name escaped: {line}"
    );
    p.send_line("done");
}

/// Runs `vgpu <args>`, stdout captured (not a terminal).
fn vgpu(args: &[&OsStr]) -> Output {
    Command::new(dist::vgpu_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Every byte of `out` a terminal would act on, other than a newline.
fn control_bytes(out: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(out);
    text.chars()
        .filter(|c| *c != '\n' && (c.is_control() || ('\u{2028}'..='\u{2029}').contains(c)))
        .map(|c| c as u32 as u8)
        .collect()
}

/// A tenant writes a UUID holding `ESC ]0;…BEL` (set the window title) and
/// `ESC [2J` (clear the screen) into its region, and names region files
/// with escapes and newlines: `vgpu inspect` and `vgpu top` show them
/// escaped, never raw to the admin's terminal.
#[test]
fn inspect_and_top_print_no_terminal_escapes_from_a_region() {
    let gpu = SimGpu::new();
    let fx = Workdir::new("vgpu-hyg-term-", &["root", "out"]);
    let dir = fx.path(&format!("root/{VICTIM_UID}_ctr"));
    std::fs::create_dir_all(&dir).unwrap();
    let region = dir.join("r.cache");
    let exe = dist::compile_c("demo_workload", fx.root(), false);
    let out = Command::new(&exe)
        .envs(gpu.envs())
        .env("LD_PRELOAD", dist::hook_lib())
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    {
        let f = RegionFile::open(&region, Access::ReadWrite).unwrap();
        f.region()
            .set_uuid(0, b"GPU-\x1b]0;pwned\x07\x1b[2J\x1b[31mred\r\nFAKE");
    }
    // The same region under a name of the tenant's choosing, and a file that
    // is no region at all (its error names it).
    std::fs::copy(&region, dir.join("e\x1b]0;title\x07\n.cache")).unwrap();
    std::fs::write(dir.join("j\x1b[2J.cache"), b"junk").unwrap();
    // Directly in the root (no HAMi directory): `top` names it by its path.
    std::fs::copy(&region, fx.path("root/t\x1b]0;x\x07.cache")).unwrap();
    let root = fx.path("root");
    let inspect = vgpu(&[
        OsStr::new("inspect"),
        OsStr::new("--root"),
        root.as_os_str(),
    ]);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(text.contains("GPU-"), "no region shown: {text}");
    assert_eq!(
        control_bytes(&inspect.stdout),
        Vec::<u8>::new(),
        "vgpu inspect wrote control bytes:\n{text:?}"
    );
    assert!(
        text.contains(r"GPU-\x1b]0;pwned\x07"),
        "the UUID is not shown escaped:\n{text}"
    );
    let top = vgpu(&[
        OsStr::new("top"),
        OsStr::new("--root"),
        root.as_os_str(),
        OsStr::new("--count"),
        OsStr::new("1"),
    ]);
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "{top:?}");
    assert!(text.contains("CONTAINER"), "{text}");
    assert_eq!(
        control_bytes(&top.stdout),
        Vec::<u8>::new(),
        "vgpu top wrote control bytes:\n{text:?}"
    );
}

/// A stand-in hook whose `version()` returns 1.
fn shared_lib(dir: &Path) -> PathBuf {
    dist::stand_in_hook(dir, "lib", "int version(void) { return 1; }\n")
}

/// `vgpu install-hook --host-dir host --from from extra…`, killed (and the
/// test failed) if it runs for more than 10 s.
fn install_hook(host: &Path, from: &Path, extra: &[&str]) -> Output {
    let mut child = Command::new(dist::vgpu_bin())
        .arg("install-hook")
        .arg("--host-dir")
        .arg(host)
        .arg("--from")
        .arg(from)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "install-hook {extra:?} hung for 10 s (killed): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Every regular file below `dir` (symlinks not followed) holding `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file()
                && std::fs::read(e.path())
                    .unwrap()
                    .windows(needle.len())
                    .any(|w| w == needle)
            {
                hits.push(e.path());
            }
        }
    }
    hits
}

/// `ld.so.preload` in the host directory is a symlink to a root-only file:
/// install-hook refuses (never copies the target into a world-readable
/// backup), leaves the link alone, and `--uninstall` has nothing of it to
/// put back.
#[test]
fn install_hook_refuses_a_symlinked_preload() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("vgpu");
    std::fs::create_dir_all(&host).unwrap();
    let secret = dir.path().join("shadow");
    std::fs::write(&secret, b"root:SECRET-HASH:19000::::::\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    symlink(&secret, host.join("ld.so.preload")).unwrap();
    let lib = shared_lib(dir.path());

    let o = install_hook(&host, &lib, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "a symlinked ld.so.preload was accepted"
    );
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one clear sentence: {err}");
    assert_eq!(files_holding(&host, b"SECRET-HASH"), Vec::<PathBuf>::new());
    assert!(std::fs::symlink_metadata(host.join("ld.so.preload"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!host.join("libvgpu.so").exists(), "nothing is installed");
    let un = install_hook(&host, &lib, &["--uninstall"]);
    assert!(un.status.success(), "{un:?}");
    assert_eq!(mode(&secret), 0o600);
    assert_eq!(files_holding(&host, b"SECRET-HASH"), Vec::<PathBuf>::new());
}

/// A root-only `ld.so.preload` (mode 0600, a regular file) is backed up
/// and restored with its mode: the backup is never readable by others.
#[test]
fn install_hook_backups_keep_the_original_mode() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("vgpu");
    std::fs::create_dir_all(&host).unwrap();
    let preload = host.join("ld.so.preload");
    std::fs::write(&preload, b"/opt/private/libpriv.so\n").unwrap();
    std::fs::set_permissions(&preload, std::fs::Permissions::from_mode(0o600)).unwrap();
    let lib = shared_lib(dir.path());
    let o = install_hook(&host, &lib, &[]);
    assert!(o.status.success(), "{o:?}");
    let backups = files_holding(&host, b"libpriv");
    assert!(!backups.is_empty(), "no backup of ld.so.preload");
    for f in backups {
        assert_eq!(mode(&f), 0o600, "{} is readable by others", f.display());
    }
    let un = install_hook(&host, &lib, &["--uninstall"]);
    assert!(un.status.success(), "{un:?}");
    assert_eq!(
        std::fs::read(&preload).unwrap(),
        b"/opt/private/libpriv.so\n"
    );
    assert_eq!(mode(&preload), 0o600, "restored with another mode");
}

/// A PIE executable (`/bin/true`: `ET_DYN` with an interpreter) is not a
/// library to preload into every process: install-hook refuses it, and
/// `--check` never reports it as the hook.
#[test]
fn install_hook_refuses_an_executable() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("vgpu");
    let exe = dir.path().join("true");
    std::fs::copy("/bin/true", &exe).unwrap();
    let o = install_hook(&host, &exe, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "an executable was installed");
    assert!(err.contains("not a shared library"), "{err}");
    assert!(!host.join("libvgpu.so").exists());
    assert!(!host.join("ld.so.preload").exists());
    // Put there by something else: --check does not call it vgpu's hook.
    std::fs::create_dir_all(&host).unwrap();
    std::fs::copy(&exe, host.join("libvgpu.so")).unwrap();
    let c = install_hook(&host, &exe, &["--check"]);
    assert!(
        !c.status.success(),
        "--check accepted an executable: {}",
        String::from_utf8_lossy(&c.stdout)
    );
}

/// A FIFO as `--from`, or in the host directory, never makes install-hook
/// (or `--check`) wait for a writer: it is refused at once.
#[test]
fn install_hook_never_blocks_on_a_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("vgpu");
    std::fs::create_dir_all(&host).unwrap();
    let fifo = dir.path().join("fifo.so");
    let mkfifo = |p: &Path| {
        assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
    };
    mkfifo(&fifo);
    let o = install_hook(&host, &fifo, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("FIFO"), "{err}");
    let lib = shared_lib(dir.path());
    mkfifo(&host.join("ld.so.preload"));
    let o = install_hook(&host, &lib, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("FIFO"), "{err}");
    std::fs::remove_file(host.join("ld.so.preload")).unwrap();
    mkfifo(&host.join("libvgpu.so"));
    let c = install_hook(&host, &lib, &["--check"]);
    assert!(!c.status.success());
}
