//! One module per subcommand.

mod bounds;
pub mod cleanup;
pub mod daemon;
pub mod dra_plugin;
pub mod generate_assets;
pub mod inspect;
pub mod install_hook;
mod regions_arg;
pub mod set_limit;
pub mod suspend;
pub mod top;
mod top_keys;
pub mod trace;
pub mod turns;
pub mod unlock;

/// Writes a read-only command's result to stdout: `out` as pretty JSON, or
/// `text`'s rendering of it; exit 1 when some input could not be read
/// (`failed`).
fn report<T: serde::Serialize>(
    json: bool,
    out: &T,
    failed: bool,
    text: impl FnOnce(&mut std::io::StdoutLock<'static>, &T) -> std::io::Result<()>,
) -> anyhow::Result<std::process::ExitCode> {
    use anyhow::Context as _;
    use std::io::Write as _;
    let mut w = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut w, out).context("writing JSON")?;
        writeln!(w)?;
    } else {
        text(&mut w, out)?;
    }
    Ok(if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    })
}
