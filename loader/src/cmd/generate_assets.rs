//! `vgpu generate-assets` (for the build, outside the CLI's clap tree:
//! `crate::cli::Invocation`): shell completions and man pages from the clap
//! definitions, so they can never describe another CLI than the binary's.
//! The CLI hands its clap tree in: this module knows nothing of it.
//! `cargo xtask build` runs it into `target/dist/share/`; the image ships
//! that tree under `/usr/local/share/`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap_complete::Shell;

/// The word that selects it: `vgpu generate-assets DIR`.
pub const SUBCOMMAND: &str = "generate-assets";

/// Write completions (bash, zsh, fish) and man pages under DIR.
///
/// Layout, as under /usr/share: `bash-completion/completions/vgpu`,
/// `zsh/site-functions/_vgpu`, `fish/vendor_completions.d/vgpu.fish`,
/// `man/man1/vgpu.1` and one `man/man1/vgpu-<subcommand>.1` each.
#[derive(clap::Parser, Debug)]
#[command(name = "vgpu-generate-assets", bin_name = "vgpu generate-assets", version = env!("VGPU_VERSION"))]
pub struct Args {
    /// The directory to write into (created if missing).
    #[arg(value_name = "DIR")]
    out: PathBuf,
}

/// Where each shell looks for a completion file of `vgpu`, under a share dir.
const SHELLS: &[(Shell, &str)] = &[
    (Shell::Bash, "bash-completion/completions"),
    (Shell::Zsh, "zsh/site-functions"),
    (Shell::Fish, "fish/vendor_completions.d"),
];

/// Runs `vgpu generate-assets` for the CLI `cli`.
pub fn run(args: Args, cli: &clap::Command) -> anyhow::Result<ExitCode> {
    for (shell, dir) in SHELLS {
        let dir = create(&args.out.join(dir))?;
        let mut cmd = cli.clone();
        let written =
            clap_complete::generate_to(*shell, &mut cmd, "vgpu", &dir).with_context(|| {
                format!(
                    "cannot write the {shell} completions into {}",
                    dir.display()
                )
            })?;
        // bash-completion loads `completions/<command>` on demand: no suffix.
        if *shell == Shell::Bash {
            let named = dir.join("vgpu");
            std::fs::rename(&written, &named).with_context(|| {
                format!("cannot rename {} to {}", written.display(), named.display())
            })?;
        }
    }
    let man = create(&args.out.join("man/man1"))?;
    clap_mangen::generate_to(cli.clone(), &man)
        .with_context(|| format!("cannot write the man pages into {}", man.display()))?;
    Ok(ExitCode::SUCCESS)
}

fn create(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir.to_owned())
}
