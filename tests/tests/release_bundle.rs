//! `cargo xtask release` (root: buildah), run once here with `--no-build` on
//! the dists `cargo xtask test` built (target/dist and, on x86-64, the
//! cross-built target/dist-aarch64): each architecture's bundle has the
//! documented layout and its `.tar.gz`, `sha256sum -c SHA256SUMS` passes
//! over every file, the rendered manifests name the bundle's image and are
//! what `kubectl kustomize` makes of the bundle's overlays and valid against
//! Kubernetes' schemas, the SBOM is CycloneDX JSON listing the shipped
//! crates, and the image archive loads with `podman load` and runs
//! `vgpu --version` printing the bundle's version (the arm64 image's files
//! under qemu-user, as image.rs does).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::Deserialize as _;
use serde_yaml::Value;
use vgpu_tests::dist::{dist_dir, vgpu_bin, workspace_root};
use vgpu_tests::manifests::images_in;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const REGISTRY: &str = "localhost/vgpu-release-test";
const OVERLAYS: [&str; 3] = ["hami", "standalone", "dra"];
const SHIPPED_CRATES: [&str; 4] = ["vgpu-loader", "vgpu-hook", "vgpu-ebpf", "vgpu-common"];

fn image() -> String {
    format!("{REGISTRY}/vgpu:{VERSION}")
}

/// (architecture name, OCI name, its dist)
fn arches() -> Vec<(&'static str, &'static str, PathBuf)> {
    let mut v = vec![("x86_64", "amd64", dist_dir())];
    if cfg!(target_arch = "x86_64") {
        v.push(("aarch64", "arm64", vgpu_tests::aarch64::dist_dir()));
    }
    v
}

/// The output directory, filled by one `cargo xtask release` for all tests.
fn bundles() -> &'static Path {
    static OUT: OnceLock<PathBuf> = OnceLock::new();
    OUT.get_or_init(|| {
        let out = dist_dir()
            .parent()
            .expect("dist has a parent")
            .join("release-bundle-test");
        let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.current_dir(workspace_root())
            .args([
                "run",
                "--quiet",
                "-p",
                "xtask",
                "--",
                "release",
                "--no-build",
            ])
            .args(["--registry", REGISTRY, "--out"])
            .arg(&out);
        for (arch, _, _) in arches() {
            cmd.args(["--arch", arch]);
        }
        let run = cmd.output().expect("run cargo xtask release");
        assert!(
            run.status.success(),
            "cargo xtask release: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        out
    })
}

fn bundle(arch: &str) -> PathBuf {
    bundles().join(format!("vgpu-{VERSION}-{arch}"))
}

fn files(root: &Path, dir: &Path, into: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(root, &p, into);
        } else {
            into.push(p.strip_prefix(root).unwrap().display().to_string());
        }
    }
}

#[test]
fn each_bundle_has_its_layout_a_tarball_and_checksums_that_verify() {
    for (arch, _, dist) in arches() {
        let b = bundle(arch);
        for f in [
            "bin/vgpu",
            "lib/libvgpu.so",
            "share/man/man1/vgpu.1",
            "share/bash-completion/completions/vgpu",
            "share/zsh/site-functions/_vgpu",
            "share/fish/vendor_completions.d/vgpu.fish",
            "deploy/base/kustomization.yaml",
            "deploy/overlays/hami/kustomization.yaml",
            "deploy/components/servicemonitor/kustomization.yaml",
            "manifests/hami.yaml",
            "manifests/standalone.yaml",
            &format!("image/vgpu-{VERSION}-{arch}.tar"),
            "sbom.cdx.json",
            "LICENSE-MIT",
            "LICENSE-APACHE",
            "LICENSE-GPL-2.0",
            "README.md",
            "CHANGELOG.md",
            "docs/runbooks.md",
            "SHA256SUMS",
        ] {
            assert!(b.join(f).is_file(), "{arch}: {f} missing");
        }
        for (shipped, built) in [("bin/vgpu", "vgpu"), ("lib/libvgpu.so", "libvgpu.so")] {
            assert!(
                std::fs::read(b.join(shipped)).unwrap() == std::fs::read(dist.join(built)).unwrap(),
                "{arch}: {shipped} is not the built {built}"
            );
        }

        let out = Command::new("sha256sum")
            .args(["--check", "--strict", "SHA256SUMS"])
            .current_dir(&b)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{arch}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut all = Vec::new();
        files(&b, &b, &mut all);
        let sums = std::fs::read_to_string(b.join("SHA256SUMS")).unwrap();
        let listed: Vec<&str> = sums
            .lines()
            .filter_map(|l| l.split_once("  "))
            .map(|(_, f)| f)
            .collect();
        for f in &all {
            assert!(
                f == "SHA256SUMS" || listed.contains(&f.as_str()),
                "{arch}: {f} is not in SHA256SUMS"
            );
        }

        let tarball = bundles().join(format!("vgpu-{VERSION}-{arch}.tar.gz"));
        let out = Command::new("tar")
            .arg("-tzf")
            .arg(&tarball)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", tarball.display());
        let names = String::from_utf8_lossy(&out.stdout);
        for f in &all {
            assert!(
                names
                    .lines()
                    .any(|n| n == format!("vgpu-{VERSION}-{arch}/{f}")),
                "{arch}: {f} is not in {}",
                tarball.display()
            );
        }
    }
}

fn kubectl_kustomize(dir: &Path) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl (with kustomize) is needed");
    assert!(
        out.status.success(),
        "{}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn manifests_name_the_bundle_image_and_are_schema_valid() {
    for (arch, _, _) in arches() {
        let b = bundle(arch);
        for o in OVERLAYS {
            let file = b.join("manifests").join(format!("{o}.yaml"));
            let text = std::fs::read_to_string(&file).unwrap();
            assert_eq!(
                text.trim_end(),
                kubectl_kustomize(&b.join("deploy/overlays").join(o)).trim_end(),
                "{arch} {o}: the rendered file is the bundle's overlay"
            );
            let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
                .map(|d| Value::deserialize(d).unwrap())
                .collect();
            let mut named = Vec::new();
            for d in &docs {
                images_in(d, &mut named);
                assert_eq!(
                    d["metadata"]["labels"]["app.kubernetes.io/version"].as_str(),
                    Some(VERSION),
                    "{arch} {o}: {:?}",
                    d["metadata"]["name"]
                );
            }
            // The daemon, the hook installer (and HAMi's keeper).
            assert!(named.len() >= 2, "{arch} {o}: {named:?}");
            assert!(
                named.iter().all(|i| *i == image()),
                "{arch} {o}: every container runs {}: {named:?}",
                image()
            );
            // DRA's resource.k8s.io/v1 is GA from 1.34.
            let oldest = if o == "dra" { "1.34.0" } else { "1.29.0" };
            for k8s in [oldest, "1.37.0"] {
                let out = Command::new("python3")
                    .args(["-m", "kubernetes_validate", "--strict", "--quiet"])
                    .args(["-k", k8s])
                    .arg(&file)
                    .output()
                    .expect("kubernetes-validate is needed: run `cargo xtask setup`");
                assert!(
                    out.status.success() && out.stdout.is_empty(),
                    "{arch} {o} for Kubernetes {k8s}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

#[test]
fn sbom_is_cyclonedx_json_listing_the_shipped_crates() {
    for (arch, _, _) in arches() {
        let text = std::fs::read_to_string(bundle(arch).join("sbom.cdx.json")).unwrap();
        let sbom: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(sbom["bomFormat"], "CycloneDX", "{arch}");
        let mut names: Vec<&str> = sbom["components"]
            .as_array()
            .expect("components")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        names.extend(sbom["metadata"]["component"]["name"].as_str());
        for c in SHIPPED_CRATES.iter().chain(&["aya", "libc", "clap"]) {
            assert!(names.contains(c), "{arch}: {c} not in the SBOM: {names:?}");
        }
        for c in ["vgpu-tests", "xtask", "simgpu"] {
            assert!(!names.contains(&c), "{arch}: {c} does not ship");
        }
    }
}

struct Loaded;

impl Drop for Loaded {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rmi", "-f", &image()])
            .output();
    }
}

fn podman(args: &[&str]) -> String {
    let out = Command::new("podman")
        .args(args)
        .output()
        .expect("run podman");
    assert!(
        out.status.success(),
        "podman {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `podman load` names the image as the manifests do; it runs (amd64 with
/// podman; arm64's files, exported from the loaded image, under qemu-user:
/// this machine runs no arm64 container) and says the bundle's version,
/// as the built `vgpu` does.
#[test]
fn image_archive_loads_under_the_bundle_name_and_runs_its_version() {
    let expected = Command::new(vgpu_bin()).arg("--version").output().unwrap();
    let expected = String::from_utf8_lossy(&expected.stdout).into_owned();
    assert!(
        expected.starts_with(&format!("vgpu {VERSION} (")),
        "{expected}"
    );
    for (arch, oci, _) in arches() {
        let _loaded = Loaded;
        let archive = bundle(arch).join(format!("image/vgpu-{VERSION}-{arch}.tar"));
        // A docker-archive naming the bundle's image, and nothing else.
        let out = Command::new("tar")
            .arg("-xOf")
            .arg(&archive)
            .arg("manifest.json")
            .output()
            .unwrap();
        assert!(out.status.success(), "{arch}: not a docker-archive");
        let manifest: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            manifest[0]["RepoTags"],
            serde_json::json!([image()]),
            "{arch}"
        );
        let said = podman(&["load", "-i", archive.to_str().unwrap()]);
        assert_eq!(said.trim(), format!("Loaded image: {}", image()), "{arch}");
        let inspected = podman(&[
            "image",
            "inspect",
            "--format",
            "{{.Architecture}}",
            &image(),
        ]);
        assert_eq!(inspected.trim(), oci);
        let said = if oci == "amd64" {
            podman(&[
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
                &image(),
                "--version",
            ])
        } else {
            let dir = tempfile::tempdir().unwrap();
            let ctr = podman(&["create", "--arch", oci, &image()]);
            let tar = dir.path().join("rootfs.tar");
            podman(&["export", "-o", tar.to_str().unwrap(), ctr.trim()]);
            podman(&["rm", ctr.trim()]);
            let rootfs = dir.path().join("rootfs");
            std::fs::create_dir(&rootfs).unwrap();
            let out = Command::new("tar")
                .arg("-xf")
                .arg(&tar)
                .arg("-C")
                .arg(&rootfs)
                .output()
                .unwrap();
            assert!(out.status.success());
            let out = Command::new("qemu-aarch64-static")
                .arg("-L")
                .arg(&rootfs)
                .arg(rootfs.join("usr/local/bin/vgpu"))
                .arg("--version")
                .output()
                .expect("run qemu-aarch64-static");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        // The arm64 dist may be of another commit than this machine's one
        // (the bundle's files are the dist's: checked above); the version
        // is the bundle's either way.
        assert!(
            said.starts_with(&format!("vgpu {VERSION} (")),
            "{arch}: the image's vgpu says {said}"
        );
        if oci == "amd64" {
            assert_eq!(said, expected, "{arch}: the image's vgpu is the built one");
        }
    }
}
