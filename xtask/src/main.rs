//! `cargo xtask <task>`: every developer and CI task, one module each.

mod abi;
mod arch;
mod bench;
mod build;
mod demo;
mod doc_paths;
mod docs_map;
mod driver_seam;
mod gpu_check;
mod image;
mod lint;
mod release;
mod setup;
mod share;
mod test;
mod unsafe_free;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "vgpu developer tasks", long_about = None)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the build needs (Debian toolchain for eBPF, bpf-linker); idempotent.
    Setup(setup::Args),
    /// Build everything into target/dist/ (hook, loader with embedded eBPF, simulated GPU);
    /// `--arch aarch64` cross-builds the same into target/dist-aarch64/.
    Build(build::Args),
    /// Build the vgpu image from scratch with buildah (needs root; no registry); with
    /// `--arch` twice (or `--all-arches`), one image per architecture under one manifest list.
    Image(image::Args),
    /// A versioned bundle per architecture under target/release-bundle/: the
    /// binaries, completions and man pages, the image as an archive, the
    /// manifests naming it, an SBOM and SHA256SUMS, and a .tar.gz of it all
    /// (needs root, for buildah).
    Release(release::Args),
    /// Run every test, the root and eBPF ones included (needs root).
    Test(test::Args),
    /// Every static gate: rustfmt, clippy -D warnings (host and eBPF crates),
    /// [lints] opt-in, cargo deny, typos, the ABI snapshots, no unsafe in the
    /// hook's policy code.
    Lint,
    /// Check the ABI snapshots of every cross-process layout, or rewrite them.
    Abi(abi::Args),
    /// A sample CUDA workload under the hook while `vgpu trace` watches it.
    Demo(demo::Args),
    /// Overhead of the hook against the bare (simulated or real) driver.
    Bench(bench::Args),
    /// Stage artifacts for the GPU machine, or run the GPU checks when a GPU is here.
    GpuCheck(gpu_check::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Setup(a) => setup::run(&a),
        Task::Build(a) => build::run(&a).map(drop),
        Task::Image(a) => image::run(&a),
        Task::Release(a) => release::run(&a),
        Task::Test(a) => test::run(&a),
        Task::Lint => lint::run(),
        Task::Abi(a) => abi::run(&a),
        Task::Demo(a) => demo::run(&a),
        Task::Bench(a) => bench::run(&a),
        Task::GpuCheck(a) => gpu_check::run(&a),
    }
}
