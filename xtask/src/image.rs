//! `cargo xtask image`: the release build, then the vgpu image built from
//! scratch by deploy/image/build.sh (buildah, as root, no registry); for
//! several architectures, one image each under one manifest list
//! (deploy/image/manifest.sh).

use std::process::Command;

use anyhow::{bail, Result};

use crate::arch::Arch;
use crate::{build, util};

#[derive(clap::Args)]
pub struct Args {
    /// Image name and tag (with several architectures, the manifest list's;
    /// the images are <name>-amd64 and <name>-arm64).
    #[arg(long, default_value = "localhost/vgpu:dev")]
    pub name: String,
    /// An architecture to build the image for; repeat it for a manifest list
    /// (default: this machine's).
    #[arg(long = "arch", value_enum)]
    pub arches: Vec<Arch>,
    /// Every architecture (x86_64 and aarch64), under one manifest list.
    #[arg(long, conflicts_with = "arches")]
    pub all_arches: bool,
}

pub fn run(args: &Args) -> Result<()> {
    if !util::is_root() {
        bail!("cargo xtask image builds with buildah as root; run it as root");
    }
    let arches = Arch::selected(&args.arches, args.all_arches);
    let stage = util::target_dir().join("image");
    let mut dists = Vec::new();
    for arch in &arches {
        let dist = build::run(&build::Args {
            arch: Some(*arch),
            ..build::Args::default()
        })?;
        dists.push((*arch, dist));
    }
    let mut cmd = Command::new("sh");
    match dists.as_slice() {
        [(arch, dist)] => {
            cmd.arg(util::root().join("deploy/image/build.sh"))
                .arg(dist)
                .arg(&args.name)
                .arg(&stage)
                .arg(arch.name());
        }
        _ => {
            cmd.arg(util::root().join("deploy/image/manifest.sh"))
                .arg(&args.name)
                .arg(&stage);
            for (arch, dist) in &dists {
                cmd.arg(format!("{}={}", arch.name(), dist.display()));
            }
        }
    }
    util::run(&mut cmd)?;
    eprintln!(
        "image: {} (run it with `podman run --rm {} --version`)",
        args.name, args.name
    );
    Ok(())
}
