//! Builds the eBPF programs (`ebpf/`, package `vgpu-ebpf`) for bpfel-unknown-none
//! and leaves the object in `OUT_DIR/vgpu-ebpf`, embedded by `src/ebpf.rs`.
//!
//! - `AYA_BUILD_SKIP=1` skips it (host-only `cargo clippy`); the loader then
//!   embeds an empty object and `vgpu trace` says so.
//! - `VGPU_EBPF_TOOLCHAIN` names the rustup toolchain for the nested build
//!   (default `debian-1.96`: Debian's `rustc-web` with its prebuilt `core`
//!   for bpfel, linked by `cargo xtask setup`; docs/trace.md).

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
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
