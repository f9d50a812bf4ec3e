//! The vgpu image (root; buildah and podman, no daemon, no registry): built
//! from scratch by deploy/image/build.sh from target/dist, it runs
//! `vgpu --version` (with the commit), ships the completions and man
//! pages, and `install-hook --hami` into a host directory
//! mounted into it installs the hook there. The hami overlay's keeper,
//! run as the DaemonSet runs it, puts HAMi's library back when it is
//! stopped (`kubectl delete -k` is the whole uninstall). The daemon, run
//! as the DaemonSet's container runs it with the runtime's default seccomp
//! profile named explicitly, attaches its probes to this test's own copy of
//! the simulated libcuda.
//!
//! podman runs it with runc (crun refuses hybrid-cgroup hosts such as CI's)
//! and with rlimits no higher than the caller's (raising them needs
//! CAP_SYS_RESOURCE, which CI's root lacks), without a network.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use vgpu_tests::dist::{dist_dir, hook_lib, vgpu_bin, workspace_root};
use vgpu_tests::wait::eventually;

struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("podman").args(["rmi", "-f", &self.0]).output();
    }
}

/// `podman run`; with a volume, as the DaemonSet's installer runs: no
/// capabilities, read-only root.
fn podman_run(image: &str, volume: Option<String>, args: &[&str]) -> Output {
    let mut c = Command::new("podman");
    c.args([
        "--runtime",
        "runc",
        "run",
        "--rm",
        "--network",
        "none",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
    ]);
    if let Some(v) = volume {
        c.arg("-v")
            .arg(v)
            .args(["--cap-drop", "ALL", "--read-only"]);
    }
    let out = c.arg(image).args(args).output().expect("run podman");
    assert!(
        out.status.success(),
        "podman run {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Builds the image from target/dist, staged under `stage`.
fn build_image(tag: &str, stage: &Path) -> Image {
    let image = Image(format!("localhost/vgpu-test-{tag}:{}", std::process::id()));
    let out = Command::new("sh")
        .arg(workspace_root().join("deploy/image/build.sh"))
        .arg(dist_dir())
        .arg(&image.0)
        .arg(stage)
        .output()
        .expect("run build.sh");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    image
}

#[test]
fn image_builds_from_scratch_runs_and_installs_the_hook() {
    let dir = tempfile::tempdir().unwrap();
    let image = build_image("run", &dir.path().join("stage"));

    let out = podman_run(&image.0, None, &["--version"]);
    let built = Command::new(vgpu_bin()).arg("--version").output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with(&format!("vgpu {} (", env!("CARGO_PKG_VERSION"))),
        "the version names the commit: {said}"
    );
    assert_eq!(said, String::from_utf8_lossy(&built.stdout));
    // Completions and man pages ship, as `cargo xtask build` made them.
    let share = dir.path().join("stage/rootfs/usr/local/share");
    for f in [
        "man/man1/vgpu.1",
        "man/man1/vgpu-daemon.1",
        "bash-completion/completions/vgpu",
        "zsh/site-functions/_vgpu",
        "fish/vendor_completions.d/vgpu.fish",
    ] {
        assert_eq!(
            std::fs::read(share.join(f)).ok(),
            std::fs::read(dist_dir().join("share").join(f)).ok(),
            "{f} in the image"
        );
        assert!(share.join(f).exists(), "{f} missing from the image");
    }

    let host = dir.path().join("host-vgpu");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("libvgpu.so.v2.10.0"), b"HAMi's library").unwrap();
    let out = podman_run(
        &image.0,
        Some(format!("{}:/usr/local/vgpu", host.display())),
        &[
            "install-hook",
            "--hami",
            "--host-dir",
            "/usr/local/vgpu",
            "--from",
            "/opt/vgpu/libvgpu.so",
        ],
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("installed the vgpu hook"), "{said}");
    assert_eq!(
        std::fs::read(host.join("libvgpu.so")).unwrap(),
        std::fs::read(hook_lib()).unwrap(),
        "the image's hook is the built one, now on the host"
    );
    assert_eq!(
        std::fs::read_to_string(host.join("ld.so.preload")).unwrap(),
        "/usr/local/vgpu/libvgpu.so\n"
    );
    assert!(!host.join("libvgpu.so.v2.10.0").exists());
}

/// A detached container, removed at the end.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.0])
            .output();
    }
}

/// Every entry of `dir` (recursively): its bytes (or `dir/`) and mode.
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    let mut all = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let meta = std::fs::symlink_metadata(e.path()).unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() {
            all.insert(format!("{name}/"), (Vec::new(), mode));
            for (k, v) in snapshot(&e.path()) {
                all.insert(format!("{name}/{k}"), v);
            }
        } else {
            all.insert(name, (std::fs::read(e.path()).unwrap(), mode));
        }
    }
    all
}

/// A snapshot in words: each entry, its mode, and its bytes when short.
fn listing(files: &BTreeMap<String, (Vec<u8>, u32)>) -> String {
    let ours = std::fs::read(hook_lib()).unwrap();
    files
        .iter()
        .map(|(name, (bytes, mode))| {
            let what = if *bytes == ours {
                "vgpu's hook".to_owned()
            } else if bytes.len() <= 64 {
                format!("{:?}", String::from_utf8_lossy(bytes))
            } else {
                format!("{} bytes", bytes.len())
            };
            format!("  {name} {mode:o} {what}\n")
        })
        .collect()
}

/// The hami overlay's pod on one node, as the kubelet runs it: the init
/// container installs, the keeper keeps the hook in place (it moves aside
/// the file a device-plugin restart copies back), and deleting the pod
/// (SIGTERM, then SIGKILL after the grace period: `podman stop`) leaves
/// the directory as HAMi had it, byte for byte and mode for mode.
#[test]
fn the_keeper_puts_hamis_library_back_when_its_container_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let image = build_image("keeper", &dir.path().join("stage"));
    let host = dir.path().join("host-vgpu");
    std::fs::create_dir_all(&host).unwrap();
    let hami_lib = host.join("libvgpu.so.v2.10.0");
    std::fs::write(&hami_lib, b"HAMi's library, v2.10.0").unwrap();
    std::fs::set_permissions(&hami_lib, std::fs::Permissions::from_mode(0o755)).unwrap();
    // HAMi 2.5 to 2.9 ship theirs without the newline.
    std::fs::write(host.join("ld.so.preload"), b"/usr/local/vgpu/libvgpu.so").unwrap();
    let before = snapshot(&host);
    let volume = format!("{}:/usr/local/vgpu", host.display());
    let hook_args = [
        "install-hook",
        "--hami",
        "--host-dir",
        "/usr/local/vgpu",
        "--from",
        "/opt/vgpu/libvgpu.so",
    ];

    // The init container.
    podman_run(&image.0, Some(volume.clone()), &hook_args);
    let ours = std::fs::read(hook_lib()).unwrap();
    let vgpus_in_place = || {
        !hami_lib.exists() && std::fs::read(host.join("libvgpu.so")).ok().as_ref() == Some(&ours)
    };
    assert!(vgpus_in_place());

    // The keeper, as deploy/overlays/hami/install-hook.yaml runs it.
    let keeper = Container(format!("vgpu-test-keeper-{}", std::process::id()));
    let out = Command::new("podman")
        .args(["--runtime", "runc", "run", "-d", "--name", &keeper.0])
        .args(["--network", "none", "--ulimit", "nofile=1024:1024"])
        .args([
            "--ulimit",
            "nproc=1024:1024",
            "--cap-drop",
            "ALL",
            "--read-only",
        ])
        .arg("-v")
        .arg(&volume)
        .arg(&image.0)
        .args(hook_args)
        .args(["--watch", "2"])
        .output()
        .expect("run podman");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let logs = || {
        let out = Command::new("podman")
            .args(["logs", &keeper.0])
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    eventually(
        Duration::from_secs(30),
        "the keeper's first install",
        || logs().contains("already up to date"),
    );
    // A device-plugin restart copies HAMi's file back; the keeper moves it
    // aside again.
    let copy = dir.path().join("copy");
    std::fs::write(&copy, b"HAMi's library, v2.10.0").unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&copy, &hami_lib).unwrap();
    eventually(
        Duration::from_secs(30),
        "the keeper to move HAMi's copy aside",
        vgpus_in_place,
    );

    // The pod is deleted: SIGTERM, SIGKILL 20 s later.
    let t = Instant::now();
    let out = Command::new("podman")
        .args(["stop", "-t", "20", &keeper.0])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let took = t.elapsed();
    let said = logs();
    let after = snapshot(&host);
    assert!(
        after == before,
        "the directory as HAMi had it after the keeper stopped:\n{}\nbut it is:\n{}\nthe keeper said:\n{said}",
        listing(&before),
        listing(&after)
    );
    assert!(
        said.contains("SIGTERM: restored /usr/local/vgpu to its state before vgpu; put back HAMi's libvgpu.so.v2.10.0"),
        "{said}"
    );
    assert!(
        took < Duration::from_secs(15),
        "stopped on SIGTERM, not killed: {took:?}"
    );
    let out = Command::new("podman")
        .args(["inspect", "--format", "{{.State.ExitCode}}", &keeper.0])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0", "{said}");
}

/// The manifest list and its images, removed at the end.
struct Manifest(String);

impl Drop for Manifest {
    fn drop(&mut self) {
        let _ = Command::new("buildah")
            .args(["manifest", "rm", &self.0])
            .output();
        for arch in ["amd64", "arm64"] {
            let _ = Command::new("podman")
                .args(["rmi", "-f", &format!("{}-{arch}", self.0)])
                .output();
        }
    }
}

/// deploy/image/manifest.sh builds an image per architecture, each labelled
/// with it, under one manifest list; the arm64 image's files (the aarch64
/// `vgpu`, its dynamic loader and libraries from Debian's arm64 C library)
/// run by themselves: under qemu-user with the staged root as its root
/// (this machine has no arm64 library where that loader looks).
#[cfg(target_arch = "x86_64")]
#[test]
fn manifest_lists_an_amd64_and_an_arm64_image_and_the_arm64_one_runs() {
    let dir = tempfile::tempdir().unwrap();
    let list = Manifest(format!("localhost/vgpu-test-list:{}", std::process::id()));
    let stage = dir.path().join("stage");
    let out = Command::new("sh")
        .arg(workspace_root().join("deploy/image/manifest.sh"))
        .arg(&list.0)
        .arg(&stage)
        .arg(format!("x86_64={}", dist_dir().display()))
        .arg(format!(
            "aarch64={}",
            vgpu_tests::aarch64::dist_dir().display()
        ))
        .output()
        .expect("run manifest.sh");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let out = Command::new("buildah")
        .args(["manifest", "inspect", &list.0])
        .output()
        .unwrap();
    assert!(out.status.success());
    let index: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut arches: Vec<String> = index["manifests"]
        .as_array()
        .expect("a manifest list")
        .iter()
        .map(|m| {
            m["platform"]["architecture"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    arches.sort();
    assert_eq!(arches, ["amd64", "arm64"], "{index}");
    for arch in ["amd64", "arm64"] {
        let out = Command::new("buildah")
            .args(["inspect", "--format", "{{.OCIv1.Architecture}}"])
            .arg(format!("{}-{arch}", list.0))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), arch);
    }

    let rootfs = stage.join("aarch64/rootfs");
    let out = Command::new("qemu-aarch64-static")
        .arg("-L")
        .arg(&rootfs)
        .arg(rootfs.join("usr/local/bin/vgpu"))
        .arg("--version")
        .output()
        .expect("run qemu-aarch64-static");
    let built = Command::new(vgpu_bin()).arg("--version").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, built.stdout);
    assert_eq!(
        std::fs::read(rootfs.join("opt/vgpu/libvgpu.so")).unwrap(),
        std::fs::read(vgpu_tests::aarch64::dist_dir().join("libvgpu.so")).unwrap()
    );
}

/// The daemon container's `securityContext` in deploy/base/daemonset.yaml,
/// as `podman run` flags: root, no privilege escalation, read-only root,
/// every capability dropped but the listed ones (`without` left out too),
/// and its seccomp profile, which must be `RuntimeDefault`: podman's own
/// default profile (the one CRI-O uses), named explicitly.
fn daemon_security_flags(without: &str) -> Vec<String> {
    let path = workspace_root().join("deploy/base/daemonset.yaml");
    let ds: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let daemon = ds["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some("daemon"))
        .expect("the daemon container");
    let sc = &daemon["securityContext"];
    assert_eq!(
        sc["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault"),
        "the daemon container's seccompProfile: {sc:?}"
    );
    assert_eq!(sc["runAsUser"].as_u64(), Some(0), "{sc:?}");
    assert_eq!(
        sc["allowPrivilegeEscalation"].as_bool(),
        Some(false),
        "{sc:?}"
    );
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true), "{sc:?}");
    let info = Command::new("podman")
        .args(["info", "--format", "{{.Host.Security.SECCOMPProfilePath}}"])
        .output()
        .expect("podman info");
    let profile = String::from_utf8_lossy(&info.stdout).trim().to_owned();
    assert!(
        Path::new(&profile).is_file(),
        "podman's default seccomp profile: {profile:?}"
    );
    let caps: Vec<&str> = sc["capabilities"]["add"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str())
        .filter(|c| *c != without)
        .collect();
    let mut flags: Vec<String> = ["--user", "0", "--read-only", "--cap-drop", "ALL"]
        .map(String::from)
        .into();
    flags.push("--security-opt".into());
    flags.push("no-new-privileges".into());
    flags.push("--security-opt".into());
    flags.push(format!("seccomp={profile}"));
    flags.push("--cap-add".into());
    flags.push(caps.join(","));
    flags
}

/// The daemon in the image, as the DaemonSet's daemon container runs it
/// (host PID namespace, its capabilities, read-only root, the runtime's
/// default seccomp profile named explicitly), probing this test's own copy
/// of the simulated libcuda: it loads and attaches its probes, and on
/// `podman stop` detaches them and exits 0. Without CAP_SYS_ADMIN the same
/// run fails to load with EPERM: the profile admits `bpf` and
/// `perf_event_open` only with it, so the profile is really applied (the
/// kernel itself refuses only the attach without it, with EACCES).
#[test]
fn the_daemon_attaches_its_probes_under_the_runtime_default_seccomp_profile() {
    let dir = tempfile::tempdir().unwrap();
    let image = build_image("seccomp", &dir.path().join("stage"));
    let sim = dir.path().join("sim");
    std::fs::create_dir_all(&sim).unwrap();
    std::fs::copy(
        dist_dir().join("sim/libcuda.so.1"),
        sim.join("libcuda.so.1"),
    )
    .unwrap();
    for d in ["state", "regions"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    let run = |name: &str, without: &str| {
        let c = Container(format!("vgpu-test-{name}-{}", std::process::id()));
        let out = Command::new("podman")
            .args(["--runtime", "runc", "run", "-d", "--name", &c.0])
            .args(["--network", "none", "--pid", "host"])
            .args([
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ])
            .args(daemon_security_flags(without))
            .arg("-v")
            .arg(format!("{}:/sim:ro", sim.display()))
            .arg("-v")
            .arg(format!("{}:/run/vgpu", dir.path().join("state").display()))
            .arg("-v")
            .arg(format!(
                "{}:/regions:ro",
                dir.path().join("regions").display()
            ))
            .arg(&image.0)
            .args(["daemon", "--libcuda", "/sim/libcuda.so.1", "--no-nvml"])
            .args(["--listen", "127.0.0.1:9396"])
            .args(["--regions-root", "/regions", "--pods-log-dir", "/regions"])
            .output()
            .expect("run podman");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        c
    };
    let logs = |c: &Container| {
        let out = Command::new("podman")
            .args(["logs", &c.0])
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let exit_code = |c: &Container| {
        let out = Command::new("podman")
            .args(["wait", &c.0])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };

    let daemon = run("seccomp", "");
    eventually(Duration::from_secs(30), "the probes attached", || {
        logs(&daemon).contains("vgpu daemon: 1 libcuda file(s) probed")
    });
    let out = Command::new("podman")
        .args([
            "inspect",
            "--format",
            "{{.HostConfig.SecurityOpt}}",
            &daemon.0,
        ])
        .output()
        .unwrap();
    let opts = String::from_utf8_lossy(&out.stdout);
    assert!(opts.contains("seccomp=/"), "{opts}");
    let out = Command::new("podman")
        .args(["stop", "-t", "30", &daemon.0])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = logs(&daemon);
    assert!(said.contains("probes detached"), "{said}");
    assert_eq!(exit_code(&daemon), "0", "{said}");

    let refused = run("seccomp-nosysadmin", "SYS_ADMIN");
    let code = exit_code(&refused);
    let said = logs(&refused);
    assert_eq!(code, "1", "{said}");
    assert!(
        said.contains("loading eBPF programs failed with EPERM"),
        "{said}"
    );
}
