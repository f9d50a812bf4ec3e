//! The CPU architectures vgpu ships for, and how this machine builds and
//! runs the other one's binaries.
//!
//! The build machine's own architecture builds into `target/dist`; the other
//! one is cross-built with zig (old glibc symbol versions: `crate::build`)
//! into `target/dist-<arch>` and run under `qemu-<arch>-static` with
//! Debian's cross C library (`libc6-<deb>-cross`, `/usr/<arch>-linux-gnu`)
//! as its root for the dynamic loader.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Arch {
    /// x86-64 (amd64).
    #[value(name = "x86_64", alias = "amd64")]
    X86_64,
    /// AArch64 (arm64): Grace (GH200, GB200) and other Arm GPU nodes.
    #[value(name = "aarch64", alias = "arm64")]
    Aarch64,
}

impl Arch {
    /// The architectures a command was asked for: every one with `all`,
    /// else those named (the host's when none), each once, in order.
    pub fn selected(named: &[Arch], all: bool) -> Vec<Arch> {
        let mut arches = if all {
            Arch::ALL.to_vec()
        } else if named.is_empty() {
            vec![Arch::host()]
        } else {
            named.to_vec()
        };
        arches.sort();
        arches.dedup();
        arches
    }

    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// The architecture of the machine running xtask.
    pub fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            Arch::X86_64
        }
    }

    /// The GNU/Rust name: `x86_64`, `aarch64`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The Rust target of every shipped file for this architecture.
    pub fn gnu_target(self) -> String {
        format!("{}-unknown-linux-gnu", self.name())
    }

    pub fn is_host(self) -> bool {
        self == Arch::host()
    }

    /// `target/dist` for the host, `target/dist-<arch>` for the other one.
    pub fn dist_dir(self) -> PathBuf {
        if self.is_host() {
            util::dist_dir()
        } else {
            util::target_dir().join(format!("dist-{}", self.name()))
        }
    }

    /// Debian's cross C library for this architecture (`libc6-arm64-cross`
    /// installs `/usr/aarch64-linux-gnu`): the dynamic loader and libc the
    /// cross-built programs run on under qemu, and the image's libraries.
    pub fn sysroot(self) -> PathBuf {
        PathBuf::from(format!("/usr/{}-linux-gnu", self.name()))
    }

    /// A command that runs `program` (built for this architecture) here:
    /// directly on the host's own, under qemu-user otherwise.
    pub fn command(self, program: &Path) -> Command {
        if self.is_host() {
            return Command::new(program);
        }
        let mut c = Command::new(format!("qemu-{}-static", self.name()));
        c.arg("-L").arg(self.sysroot()).arg(program);
        c
    }
}
