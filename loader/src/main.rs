//! `vgpu`: the node daemon and CLI of vgpu (see `vgpu --help`).

mod cgroup;
mod cli;
mod cmd;
mod daemon;
mod dra;
mod host_pidns;
mod install;
mod logging;
mod printable;
mod probes;
mod regions;

use std::process::ExitCode;

fn main() -> ExitCode {
    let run = match cli::Invocation::parse(std::env::args_os().collect()) {
        Ok(run) => run,
        Err(e) => return logging::usage_error(&e),
    };
    let (format, level) = run.logging();
    logging::init(format, level);
    match run.run() {
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
