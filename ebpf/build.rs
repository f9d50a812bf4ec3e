//! Rebuild the eBPF object when bpf-linker changes (it is not a cargo input),
//! and declare/emit the `bpf_target_arch` cfg (aya-build passes it when it
//! drives the build; a direct `cargo build`/`clippy` gets the host's).

fn main() -> aya_build::Result<()> {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(e) => println!("cargo:warning=bpf-linker not found on PATH: {e}"),
    }
    aya_build::emit_bpf_target_arch_cfg()
}
