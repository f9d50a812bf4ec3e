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
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return logging::usage_error(&e),
    };
    logging::init(cli.log_format, cli.log_level());
    match cli.command.run() {
        Ok(code) => code,
        // `vgpu inspect | head`: the reader has what it wanted.
        Err(e) if logging::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // One sentence (with its causes), no backtrace; it may quote a
            // path a tenant named.
            logging::error(&logging::sentence(&e));
            ExitCode::FAILURE
        }
    }
}
