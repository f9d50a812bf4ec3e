//! `cargo xtask abi [--bless]`: checks (or rewrites) the ABI snapshots,
//! `common/abi.snapshot`: every cross-process layout
//! with its size and field offsets (`vgpu_common::abi`). A layout change
//! that nobody blessed fails the check, and so `cargo xtask lint` and CI.

use anyhow::Result;

use crate::util;

#[derive(clap::Args, Default)]
pub struct Args {
    /// Rewrite the snapshots from the code instead of comparing.
    #[arg(long)]
    pub bless: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let mut cmd = util::cargo();
    cmd.args(["test", "-p", "vgpu-common", "--lib"])
        .args(["--", "--exact", "abi::tests::abi_snapshot"])
        .env("AYA_BUILD_SKIP", "1");
    if args.bless {
        cmd.env("VGPU_ABI_BLESS", "1");
    }
    util::run(&mut cmd)?;
    if args.bless {
        eprintln!("abi: snapshot rewritten; review and commit common/abi.snapshot");
    }
    Ok(())
}
