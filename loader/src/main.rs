//! `vgpu`: the node daemon and CLI of vgpu (see `vgpu --help`).

mod cgroup;
mod cli;
mod cmd;
mod daemon;
mod host_pidns;
mod install;
mod logging;
mod printable;
mod probes;
mod regions;

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    logging::init(cli.log_format, cli.log_level());
    match cli.command.run() {
        Ok(code) => code,
        Err(e) => {
            // One sentence (with its causes), no backtrace; it may quote a
            // path a tenant named.
            eprintln!("{}", printable::escape_controls(&logging::sentence(&e)));
            ExitCode::FAILURE
        }
    }
}
