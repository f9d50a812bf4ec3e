//! `cargo xtask setup`: install what the build needs (the eBPF toolchain of
//! docs/trace.md, "Building and linting"). Every step checks first, so a second run does
//! nothing. Without root (or without a registry) it prints the exact
//! commands to run by hand.

use std::process::Command;

use anyhow::{bail, Result};

use crate::util::{self, output};

/// Debian packages: the Rust toolchain whose LLVM matches bpf-linker's, its
/// prebuilt `core` for bpfel, and the LLVM bpf-linker links against; then
/// objcopy and the image tools.
const DEB_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    // clippy for the eBPF crate's lint pass (same toolchain as rustc-web).
    "rust-web-clippy",
    // objcopy splits the debug info off the shipped files.
    "binutils",
    // The image: built from scratch and run without a daemon. runc, since
    // crun refuses hosts with hybrid cgroups (this CI's).
    "buildah",
    "podman",
    "runc",
    // The arm64 build's test run (`cargo xtask build --arch aarch64`):
    // qemu-user runs its programs, on Debian's arm64 C library.
    "qemu-user-static",
    "libc6-arm64-cross",
];
/// Rust targets beside the host's: the arm64 build links glibc programs.
const RUST_TARGETS: &[&str] = &["aarch64-unknown-linux-gnu"];
pub const LLVM_MAJOR: &str = "22";
const BPF_LINKER_VERSION: &str = "0.13.0";
/// Zig as the linker lets the hook link against glibc 2.17's symbol versions,
/// so it loads in every container image, not only ones as new as this
/// machine (the hook is preloaded into all of their processes).
const ZIGLANG_VERSION: &str = "0.17.1";
const ZIGBUILD_VERSION: &str = "0.24.1";
/// Lint gates (`cargo xtask lint`): the spell checker, from PyPI's prebuilt
/// wheel, and the dependency policy checker.
const TYPOS_VERSION: &str = "1.52.0";
const CARGO_DENY_VERSION: &str = "0.20.2";
/// The SBOM of `cargo xtask release`: CycloneDX's own cargo plugin, which
/// reads `cargo metadata` (no network, about 3 minutes to build on 2 cores).
const CARGO_CYCLONEDX_VERSION: &str = "0.5.9";
/// Validates the rendered manifests against Kubernetes' schemas, which it
/// bundles: tests/tests/deploy_manifests.rs runs it offline.
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";
/// The rustup name of Debian's toolchain, used by loader/build.rs.
pub const EBPF_TOOLCHAIN: &str = "debian-1.96";

#[derive(clap::Args)]
pub struct Args {
    /// Only report what is missing; install nothing.
    #[arg(long)]
    pub check: bool,
}

/// One missing piece and the command that installs it.
struct Step {
    what: String,
    command: Vec<String>,
    env: Vec<(&'static str, String)>,
}

impl Step {
    fn shell(&self) -> String {
        let env: String = self.env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        format!("{env}{}", self.command.join(" "))
    }
}

pub fn run(args: &Args) -> Result<()> {
    let steps = missing_steps();
    if steps.is_empty() {
        check_drift()?;
        eprintln!("setup: everything the build needs is present");
        return Ok(());
    }
    if args.check || !util::is_root() {
        eprintln!("setup: missing pieces; run these as root:");
        for s in &steps {
            eprintln!("  # {}\n  {}", s.what, s.shell());
        }
        bail!("setup incomplete ({} step(s) missing)", steps.len());
    }
    for s in &steps {
        eprintln!("setup: installing {}", s.what);
        let mut cmd = Command::new(&s.command[0]);
        cmd.args(&s.command[1..]);
        for (k, v) in &s.env {
            cmd.env(k, v);
        }
        if let Err(e) = util::run(&mut cmd) {
            bail!(
                "{e}\nsetup could not install {}; run by hand as root:\n  {}",
                s.what,
                s.shell()
            );
        }
    }
    check_drift()?;
    eprintln!("setup: done");
    Ok(())
}

fn missing_steps() -> Vec<Step> {
    let mut steps = Vec::new();
    let missing: Vec<&str> = DEB_PACKAGES
        .iter()
        .copied()
        .filter(|p| !deb_installed(p))
        .collect();
    if !missing.is_empty() {
        steps.push(Step {
            what: "the package lists".into(),
            command: vec!["apt-get".into(), "update".into()],
            env: vec![],
        });
        let mut cmd: Vec<String> = ["apt-get", "install", "-y", "--no-install-recommends"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        cmd.extend(missing.iter().map(|s| s.to_string()));
        steps.push(Step {
            what: format!("Debian packages {}", missing.join(", ")),
            command: cmd,
            env: vec![("DEBIAN_FRONTEND", "noninteractive".into())],
        });
    }
    let linker = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if !linker.contains(BPF_LINKER_VERSION) {
        steps.push(Step {
            what: format!("bpf-linker {BPF_LINKER_VERSION} (llvm-{LLVM_MAJOR})"),
            command: [
                "cargo",
                "install",
                "--locked",
                "--root",
                "/usr/local",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--no-default-features",
                "--features",
                &format!("llvm-{LLVM_MAJOR}"),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            env: vec![("LLVM_PREFIX", format!("/usr/lib/llvm-{LLVM_MAJOR}"))],
        });
    }
    if output(Command::new("python3").args(["-m", "ziglang", "version"])).as_deref()
        != Some(ZIGLANG_VERSION)
    {
        steps.push(Step {
            what: format!("zig {ZIGLANG_VERSION} (PyPI ziglang), the hook's linker"),
            command: ["python3", "-m", "pip", "install", "--quiet"]
                .iter()
                .map(|s| s.to_string())
                .chain([format!("ziglang=={ZIGLANG_VERSION}")])
                .collect(),
            env: vec![("PIP_ROOT_USER_ACTION", "ignore".into())],
        });
    }
    // `cargo install --list`: what cargo installed, for the cargo tools below.
    let installed = output(Command::new("cargo").args(["install", "--list"])).unwrap_or_default();
    if !installed.contains(&format!("cargo-zigbuild v{ZIGBUILD_VERSION}")) {
        steps.push(Step {
            what: format!("cargo-zigbuild {ZIGBUILD_VERSION}"),
            command: ["cargo", "install", "--locked"]
                .iter()
                .map(|s| s.to_string())
                .chain([format!("cargo-zigbuild@{ZIGBUILD_VERSION}")])
                .collect(),
            env: vec![],
        });
    }
    if output(Command::new("typos").arg("--version")).as_deref()
        != Some(&format!("typos-cli {TYPOS_VERSION}"))
    {
        steps.push(Step {
            what: format!("typos {TYPOS_VERSION} (PyPI), the spell check of `cargo xtask lint`"),
            command: ["python3", "-m", "pip", "install", "--quiet"]
                .iter()
                .map(|s| s.to_string())
                .chain([format!("typos=={TYPOS_VERSION}")])
                .collect(),
            env: vec![("PIP_ROOT_USER_ACTION", "ignore".into())],
        });
    }
    if output(Command::new("python3").args(["-m", "kubernetes_validate", "--version"]))
        .is_none_or(|v| !v.contains(KUBERNETES_VALIDATE_VERSION))
    {
        steps.push(Step {
            what: format!(
                "kubernetes-validate {KUBERNETES_VALIDATE_VERSION} (PyPI), the manifests' schema check"
            ),
            command: ["python3", "-m", "pip", "install", "--quiet"]
                .iter()
                .map(|s| s.to_string())
                .chain([format!("kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}")])
                .collect(),
            env: vec![("PIP_ROOT_USER_ACTION", "ignore".into())],
        });
    }
    if !installed.contains(&format!("cargo-deny v{CARGO_DENY_VERSION}")) {
        steps.push(Step {
            what: format!(
                "cargo-deny {CARGO_DENY_VERSION}, the dependency policy of `cargo xtask lint`"
            ),
            command: ["cargo", "install", "--locked"]
                .iter()
                .map(|s| s.to_string())
                .chain([format!("cargo-deny@{CARGO_DENY_VERSION}")])
                .collect(),
            env: vec![],
        });
    }
    if !installed.contains(&format!("cargo-cyclonedx v{CARGO_CYCLONEDX_VERSION}")) {
        steps.push(Step {
            what: format!(
                "cargo-cyclonedx {CARGO_CYCLONEDX_VERSION}, the SBOM of `cargo xtask release`"
            ),
            command: ["cargo", "install", "--locked"]
                .iter()
                .map(|s| s.to_string())
                .chain([format!("cargo-cyclonedx@{CARGO_CYCLONEDX_VERSION}")])
                .collect(),
            env: vec![],
        });
    }
    let targets =
        output(Command::new("rustup").args(["target", "list", "--installed"])).unwrap_or_default();
    let missing: Vec<&str> = RUST_TARGETS
        .iter()
        .copied()
        .filter(|t| !targets.lines().any(|l| l.trim() == *t))
        .collect();
    if !missing.is_empty() {
        steps.push(Step {
            what: format!("the Rust targets {}", missing.join(", ")),
            command: ["rustup", "target", "add"]
                .iter()
                .copied()
                .chain(missing.iter().copied())
                .map(str::to_string)
                .collect(),
            env: vec![],
        });
    }
    let rustup = output(Command::new("rustup").args(["toolchain", "list"]));
    if let Some(list) = rustup {
        if !list.lines().any(|l| l.starts_with(EBPF_TOOLCHAIN)) {
            steps.push(Step {
                what: format!("the rustup link {EBPF_TOOLCHAIN} -> /usr"),
                command: ["rustup", "toolchain", "link", EBPF_TOOLCHAIN, "/usr"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                env: vec![],
            });
        }
    }
    steps
}

fn deb_installed(pkg: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
        .is_some_and(|s| s.contains("install ok installed"))
}

/// Debian's security archive may move rustc-web to a newer LLVM; then
/// bpf-linker (built for llvm-22) no longer matches. Say so plainly instead
/// of failing deep inside the eBPF build.
fn check_drift() -> Result<()> {
    let vv = output(Command::new("/usr/bin/rustc").arg("-vV")).unwrap_or_default();
    let llvm = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .unwrap_or("unknown");
    if !llvm.starts_with(&format!("{LLVM_MAJOR}.")) {
        bail!(
            "Debian's rustc uses LLVM {llvm}, but bpf-linker is built for llvm-{LLVM_MAJOR}: \
             install llvm-<major>-dev for the new LLVM and rebuild bpf-linker with \
             --features llvm-<major>, then update LLVM_MAJOR in xtask/src/setup.rs"
        );
    }
    Ok(())
}
