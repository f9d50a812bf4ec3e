//! `simgpu-server [--dir DIR]`: the simulated GPU's background server.
//! Clients start it on demand; see `docs/simgpu.md`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let mut dir = None;
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("--dir") => dir = args.next().map(PathBuf::from),
            Some("-h" | "--help") => {
                println!("usage: simgpu-server [--dir DIR]   (default $SIMGPU_DIR or /tmp/simgpu)");
                return ExitCode::SUCCESS;
            }
            _ => {
                eprintln!("simgpu-server: unknown argument {a:?}");
                return ExitCode::from(2);
            }
        }
    }
    // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let opts = simgpu::server::Options::from_env(dir);
    match simgpu::server::run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("simgpu-server: {e}");
            ExitCode::FAILURE
        }
    }
}
