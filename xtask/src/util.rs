//! Small helpers shared by the tasks.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Cargo's target directory, honouring `CARGO_TARGET_DIR`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => {
            let t = PathBuf::from(t);
            if t.is_absolute() {
                t
            } else {
                root().join(t)
            }
        }
        None => root().join("target"),
    }
}

/// `target/dist`.
pub fn dist_dir() -> PathBuf {
    target_dir().join("dist")
}

/// Runs `cmd`, echoing it first; fails with its exit status.
pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {}", describe(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed with {status}", describe(cmd));
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its trimmed stdout, or None if it could not
/// run or failed.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Runs `cmd` quietly and returns its stdout (trailing newlines trimmed);
/// fails with its stderr.
pub fn output_checked(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {}", describe(cmd)))?;
    if !out.status.success() {
        bail!(
            "{} failed with {}: {}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut s = String::from_utf8(out.stdout)
        .with_context(|| format!("{} printed non-UTF-8", describe(cmd)))?;
    s.truncate(s.trim_end().len());
    Ok(s)
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// A `cargo` command run from the workspace root.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    c
}

pub fn is_root() -> bool {
    output(Command::new("id").arg("-u")).as_deref() == Some("0")
}

/// Whether a working NVIDIA GPU is present (nvidia-smi runs and lists one).
pub fn real_gpu_present() -> bool {
    output(Command::new("nvidia-smi").arg("-L"))
        .map(|s| s.contains("GPU"))
        .unwrap_or(false)
}

/// Files git knows of or would add (tracked, or untracked and not ignored),
/// relative to `root`.
pub fn git_files(root: &Path) -> Result<Vec<String>> {
    let out = Command::new("git")
        .current_dir(root)
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .output()
        .context("running git ls-files")?;
    if !out.status.success() {
        bail!(
            "git ls-files failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect())
}

/// `base/rel` for repository-relative paths (`rel` alone when `base` is
/// the root, "").
pub fn join_rel(base: &str, rel: &str) -> String {
    if base.is_empty() {
        rel.to_owned()
    } else {
        format!("{base}/{rel}")
    }
}
