//! `cargo xtask image`: the release build, then the vgpu image built from
//! scratch by deploy/image/build.sh (buildah, as root, no registry).

use std::process::Command;

use anyhow::{bail, Result};

use crate::{build, util};

#[derive(clap::Args)]
pub struct Args {
    /// Image name and tag.
    #[arg(long, default_value = "localhost/vgpu:dev")]
    pub name: String,
}

pub fn run(args: &Args) -> Result<()> {
    if !util::is_root() {
        bail!("cargo xtask image builds with buildah as root; run it as root");
    }
    let dist = build::run(&build::Args::default())?;
    let stage = util::target_dir().join("image");
    util::run(
        Command::new("sh")
            .arg(util::root().join("deploy/image/build.sh"))
            .arg(&dist)
            .arg(&args.name)
            .arg(&stage),
    )?;
    eprintln!(
        "image: {} (run it with `podman run --rm {} --version`)",
        args.name, args.name
    );
    Ok(())
}
