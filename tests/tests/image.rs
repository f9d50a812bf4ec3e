//! The vgpu image (root; buildah and podman, no daemon, no registry): built
//! from scratch by deploy/image/build.sh from target/dist, it runs
//! `vgpu --version` (with the commit), ships the completions and man
//! pages, and `install-hook --hami` into a host directory
//! mounted into it installs the hook there.
//!
//! podman runs it with runc (crun refuses hybrid-cgroup hosts such as CI's)
//! and with rlimits no higher than the caller's (raising them needs
//! CAP_SYS_RESOURCE, which CI's root lacks), without a network.

use std::process::{Command, Output};

use vgpu_tests::dist::{dist_dir, hook_lib, vgpu_bin, workspace_root};

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

#[test]
fn image_builds_from_scratch_runs_and_installs_the_hook() {
    let dir = tempfile::tempdir().unwrap();
    let image = Image(format!("localhost/vgpu-test:{}", std::process::id()));
    let out = Command::new("sh")
        .arg(workspace_root().join("deploy/image/build.sh"))
        .arg(dist_dir())
        .arg(&image.0)
        .arg(dir.path().join("stage"))
        .output()
        .expect("run build.sh");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

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
