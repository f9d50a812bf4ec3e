//! The command line. Adding a subcommand: a module under `cmd/` with an
//! `Args` struct (doc comments become `--help`) and a `run(args)`, then one
//! variant and one match arm here.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cmd;

/// vgpu: share one NVIDIA GPU between containers safely. This is the node
/// daemon and CLI; it observes libcuda with eBPF uprobes (needs root or
/// CAP_BPF+CAP_PERFMON).
#[derive(Parser, Debug)]
#[command(name = "vgpu", version, propagate_version = true)]
pub struct Cli {
    /// More logging on stderr (-v info, -vv debug, -vvv trace); `VGPU_LOG` overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The tracing filter directive for `-v` count.
    pub fn log_level(&self) -> &'static str {
        match self.verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
    }
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    Trace(cmd::trace::Args),
}

impl Command {
    /// Runs the subcommand.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            Command::Trace(a) => cmd::trace::run(a),
        }
    }
}
