//! `cargo xtask gpu-check`: the real-GPU checks of `scripts/gpu-check.sh`.
//!
//! The GPU machine has no Rust toolchain, so this task builds here and
//! stages the artifacts in `.device/` (ignored by git, carried to the GPU
//! machine). When a GPU is present locally it runs the script directly.

use std::process::Command;

use anyhow::{Context, Result};

use crate::{build, util};

#[derive(clap::Args)]
pub struct Args {
    /// Only stage the artifacts, even when a GPU is present.
    #[arg(long)]
    pub stage_only: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let dist = build::run(&build::Args::default())?;
    let stage = util::root().join(".device/dist");
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(util::root().join(".device")).context("create .device")?;
    util::run(Command::new("cp").arg("-a").arg(&dist).arg(&stage))
        .context("stage target/dist into .device/dist")?;
    let script = util::root().join("scripts/gpu-check.sh");
    if !args.stage_only && util::real_gpu_present() {
        return util::run(Command::new("bash").arg(&script).env("VGPU_DIST", &stage));
    }
    eprintln!(
        "gpu-check: artifacts staged in {}; on the GPU machine run: bash scripts/gpu-check.sh",
        stage.display()
    );
    Ok(())
}
