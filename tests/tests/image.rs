//! The vgpu image (root; buildah and podman, no daemon, no registry): built
//! from scratch by deploy/image/build.sh from target/dist, it runs
//! `vgpu --version`, and `install-hook --hami` into a host directory
//! mounted into it installs the hook there.
//!
//! podman runs it with runc (crun refuses hybrid-cgroup hosts such as CI's)
//! and with rlimits no higher than the caller's (raising them needs
//! CAP_SYS_RESOURCE, which CI's root lacks), without a network.

use std::process::{Command, Output};

use vgpu_tests::dist::{dist_dir, hook_lib, workspace_root};

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
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("vgpu {}", env!("CARGO_PKG_VERSION"))
    );

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
