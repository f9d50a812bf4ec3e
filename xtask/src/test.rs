//! `cargo xtask test`: every test. Builds the artifacts (this machine's and,
//! on x86-64, the aarch64 ones the `arch_aarch64` suite runs under
//! qemu-user), lints, runs the unit tests, then the integration tests
//! (`tests/`), which need root: they load eBPF programs, create cgroups and
//! PID namespaces. They are never skipped; without root this task stops and
//! says how to run it. Last, `cargo xtask demo` on the simulated GPU.

use anyhow::{bail, Result};

use crate::arch::Arch;
use crate::{build, demo, lint, util};

#[derive(clap::Args)]
pub struct Args {
    /// Skip rustfmt/clippy.
    #[arg(long)]
    pub no_lint: bool,
    /// Only run tests whose name contains this (passed to the test harness).
    pub filter: Option<String>,
}

pub fn run(args: &Args) -> Result<()> {
    if !util::is_root() {
        bail!(
            "cargo xtask test runs root-only tests (eBPF, cgroups, PID namespaces); \
             run it as root: sudo -E cargo xtask test"
        );
    }
    let dist = build::run(&build::Args::default())?;
    // The aarch64 suite runs on x86-64 hosts, where qemu-user stands in.
    let foreign: Vec<(Arch, std::path::PathBuf)> = [Arch::Aarch64]
        .into_iter()
        .filter(|a| !a.is_host())
        .map(|arch| {
            let dist = build::run(&build::Args {
                arch: Some(arch),
                ..build::Args::default()
            })?;
            Ok((arch, dist))
        })
        .collect::<Result<_>>()?;
    if !args.no_lint {
        lint::run()?;
    }
    let filter: Vec<String> = args.filter.iter().cloned().collect();
    // Unit tests of every crate but the integration suite.
    util::run(
        util::cargo()
            .args([
                "test",
                "--workspace",
                "--exclude",
                "vgpu-tests",
                "--exclude",
                "vgpu-ebpf",
            ])
            .arg("--")
            .args(&filter),
    )?;
    // Integration tests against the built artifacts; every suite runs even
    // after a failure, so one run reports all of them.
    let mut suites = util::cargo();
    suites
        .args(["test", "-p", "vgpu-tests", "--no-fail-fast", "--"])
        .args(&filter)
        .env("VGPU_DIST", &dist);
    for (arch, dist) in &foreign {
        suites.env(format!("VGPU_DIST_{}", arch.name().to_uppercase()), dist);
    }
    util::run(&mut suites)?;
    // The demo, to the end: share::run fails unless each tenant's limit
    // decided its allocation and the daemon's metrics show both tenants.
    if args.filter.is_none() {
        demo::run(&demo::Args {
            limit: "1g".into(),
            sim: true,
        })?;
    }
    eprintln!("test: all passed");
    Ok(())
}
