//! Builds the eBPF programs (`ebpf/`, package `vgpu-ebpf`) for bpfel-unknown-none
//! and leaves the object in `OUT_DIR/vgpu-ebpf`, embedded by `src/probes/mod.rs`.
//!
//! - `AYA_BUILD_SKIP=1` skips it (host-only `cargo clippy`); the loader then
//!   embeds an empty object and `vgpu trace` says so.
//! - `VGPU_EBPF_TOOLCHAIN` names the rustup toolchain for the nested build
//!   (default `debian-1.96`: Debian's `rustc-web` with its prebuilt `core`
//!   for bpfel, linked by `cargo xtask setup`; docs/trace.md).
//!
//! It also sets `VGPU_VERSION`, what `vgpu --version` prints: the crate
//! version and the commit, `0.1.0 (abc1234)`. The commit comes from
//! `VGPU_COMMIT` (a build from a tarball can name it), else from git; with
//! neither, the version alone. `VGPU_COMMIT_ID` (the commit or empty) and
//! `VGPU_RUSTC` (the compiler's version) label the daemon's
//! `vgpu_build_info`.
//!
//! And it compiles `proto/*.proto` (kubelet's DRA and plugin-registration
//! services, served by `vgpu dra-plugin`) with protox, a protobuf compiler
//! in Rust, so no `protoc` is needed: `OUT_DIR/<package>.rs`.

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    version();
    protos()?;
    println!("cargo:rerun-if-env-changed=VGPU_EBPF_TOOLCHAIN");
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    let out_dir = std::env::var("OUT_DIR").context("OUT_DIR not set")?;
    let skip =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        // An empty placeholder so include_bytes_aligned! compiles.
        std::fs::write(format!("{out_dir}/vgpu-ebpf"), b"").context("write placeholder")?;
        return Ok(());
    }
    let toolchain = std::env::var("VGPU_EBPF_TOOLCHAIN").unwrap_or_else(|_| "debian-1.96".into());
    // aya-ebpf needs #![feature(asm_experimental_arch)]: allow unstable features
    // for that crate only (RUSTC_BOOTSTRAP=1 would make aya-build ask for -Zbuild-std).
    std::env::set_var("RUSTC_BOOTSTRAP", "aya_ebpf");
    let meta = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("loader has no parent dir")?
        .join("ebpf");
    let root_dir = meta.to_str().context("non-UTF-8 path to ebpf/")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "vgpu-ebpf",
            root_dir,
            no_default_features: false,
            features: &[],
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
}

/// Generates the servers of `proto/` into `OUT_DIR`.
fn protos() -> anyhow::Result<()> {
    let files = ["proto/dra_v1.proto", "proto/pluginregistration_v1.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"]).context("compiling proto/")?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .compile_fds(fds)
        .context("generating the gRPC servers of proto/")
}

/// Sets `VGPU_VERSION` for the crate.
fn version() {
    println!("cargo:rerun-if-env-changed=VGPU_COMMIT");
    let pkg = env!("CARGO_PKG_VERSION");
    let commit = std::env::var("VGPU_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_commit);
    let version = match &commit {
        Some(c) => format!("{pkg} ({})", c.trim()),
        None => pkg.to_owned(),
    };
    println!("cargo:rustc-env=VGPU_VERSION={version}");
    // The parts apart, for the daemon's vgpu_build_info labels.
    let commit = commit.as_deref().map_or("", str::trim);
    println!("cargo:rustc-env=VGPU_COMMIT_ID={commit}");
    println!(
        "cargo:rustc-env=VGPU_RUSTC={}",
        rustc_version().unwrap_or_default()
    );
}

/// The compiler's version (`1.95.0`) from `$RUSTC --version`, `None` if it
/// cannot be asked.
fn rustc_version() -> Option<String> {
    let rustc = std::env::var_os("RUSTC")?;
    let out = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.split_whitespace().nth(1).map(str::to_owned)
}

/// The short commit of the checkout this crate is in, `None` without git or
/// outside a repository. Asks cargo to run this again when HEAD moves (the
/// HEAD file, the branch it names, packed refs), found through git because
/// a worktree keeps them apart from `.git`.
fn git_commit() -> Option<String> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short=7", "HEAD"])?;
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    Some(commit)
}
