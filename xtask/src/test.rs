//! `cargo xtask test`: every test. Builds the artifacts, lints, runs the unit
//! tests, then the integration tests (`tests/`), which need root: they load
//! eBPF programs, create cgroups and PID namespaces. They are never skipped;
//! without root this task stops and says how to run it.

use anyhow::{bail, Result};

use crate::{build, lint, util};

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
    util::run(
        util::cargo()
            .args(["test", "-p", "vgpu-tests", "--no-fail-fast", "--"])
            .args(&filter)
            .env("VGPU_DIST", &dist),
    )?;
    eprintln!("test: all passed");
    Ok(())
}
