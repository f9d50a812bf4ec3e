//! The command line. Adding a subcommand: a module under `cmd/` with an
//! `Args` struct (doc comments become `--help`; the first paragraph, one
//! line of at most 80 characters, is its summary in `vgpu --help`) and a
//! `run(args)`, then one variant and one match arm here.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::cmd;
use crate::logging::LogFormat;

/// `vgpu --version`: the crate version and, when the build saw a git
/// checkout, its commit (`0.1.0 (abc1234)`), so two builds on a node can be
/// told apart (loader/build.rs).
pub const VERSION: &str = env!("VGPU_VERSION");

/// vgpu: share one NVIDIA GPU between containers safely. This is the node
/// daemon and CLI; it observes libcuda with eBPF uprobes (needs root or
/// CAP_BPF+CAP_PERFMON).
#[derive(Parser, Debug)]
#[command(name = "vgpu", version = VERSION, propagate_version = true)]
pub struct Cli {
    /// More logging on stderr (-v info, -vv debug, -vvv trace; `vgpu daemon`
    /// logs at info without it); `VGPU_LOG` overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,

    /// Log lines as text (coloured only when stderr is a terminal) or as one
    /// JSON object each, for log collectors.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The tracing filter directive for `-v` count. The daemon (and the
    /// DRA plugin) logs at `info` without one: what an operator follows (a finding raised at
    /// `warn`, cleared, a slot freed, a libcuda probed) must show in
    /// `kubectl logs` with the DaemonSet's arguments, which set no level;
    /// a command's own output is its result, so `warn` there.
    pub fn log_level(&self) -> &'static str {
        match self.verbose {
            0 if matches!(self.command, Command::Daemon(_) | Command::DraPlugin(_)) => "info",
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
    Daemon(cmd::daemon::Args),
    Findings(cmd::daemon::FindingsArgs),
    Trace(cmd::trace::Args),
    InstallHook(cmd::install_hook::Args),
    Inspect(cmd::inspect::Args),
    Top(cmd::top::Args),
    Turns(cmd::turns::Args),
    SetSmLimit(cmd::set_limit::SmArgs),
    SetMemLimit(cmd::set_limit::MemArgs),
    Cleanup(cmd::cleanup::Args),
    Unlock(cmd::unlock::Args),
    Suspend(cmd::suspend::SuspendArgs),
    Resume(cmd::suspend::ResumeArgs),
    DraPlugin(cmd::dra_plugin::Args),
}

impl Command {
    /// Runs the subcommand.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            Command::Daemon(a) => cmd::daemon::run(a),
            Command::Findings(a) => cmd::daemon::run_findings(a),
            Command::Trace(a) => cmd::trace::run(a),
            Command::InstallHook(a) => cmd::install_hook::run(a),
            Command::Inspect(a) => cmd::inspect::run(a),
            Command::Top(a) => cmd::top::run(a),
            Command::Turns(a) => cmd::turns::run(a),
            Command::SetSmLimit(a) => cmd::set_limit::run_sm(a),
            Command::SetMemLimit(a) => cmd::set_limit::run_mem(a),
            Command::Cleanup(a) => cmd::cleanup::run(a),
            Command::Unlock(a) => cmd::unlock::run(a),
            Command::Suspend(a) => cmd::suspend::run_suspend(a),
            Command::Resume(a) => cmd::suspend::run_resume(a),
            Command::DraPlugin(a) => cmd::dra_plugin::run(a),
        }
    }
}

/// One run of `vgpu`: the CLI, or the build's asset generator, which is
/// kept out of the clap tree so that `--help`, the completions and the man
/// pages never offer it (clap_complete lists hidden subcommands too).
#[derive(Debug)]
pub enum Invocation {
    Cli(Box<Cli>),
    GenerateAssets(cmd::generate_assets::Args),
}

impl Invocation {
    /// Parses `args` (the program name first).
    pub fn parse(args: Vec<OsString>) -> Result<Self, clap::Error> {
        if args
            .get(1)
            .is_some_and(|a| a == cmd::generate_assets::SUBCOMMAND)
        {
            return cmd::generate_assets::Args::try_parse_from(args.into_iter().skip(1))
                .map(Invocation::GenerateAssets);
        }
        Cli::try_parse_from(args).map(|c| Invocation::Cli(Box::new(c)))
    }

    /// The log format and tracing filter directive.
    pub fn logging(&self) -> (LogFormat, &'static str) {
        match self {
            Invocation::Cli(c) => (c.log_format, c.log_level()),
            Invocation::GenerateAssets(_) => (LogFormat::Text, "warn"),
        }
    }

    /// Runs it.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            Invocation::Cli(c) => c.command.run(),
            Invocation::GenerateAssets(a) => cmd::generate_assets::run(a, &Cli::command()),
        }
    }
}
