//! `vgpu`: the node daemon and CLI of vgpu (see `vgpu --help`).

mod cgroup;
mod cli;
mod cmd;
mod daemon;
mod install;
mod probes;
mod regions;

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("VGPU_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(cli.log_level()));
    // try_init also bridges `log` records (aya) into tracing.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    match cli.command.run() {
        Ok(code) => code,
        Err(e) => {
            // One sentence (with its causes), no backtrace.
            eprintln!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
