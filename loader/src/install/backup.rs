//! The pre-install state of the host directory, kept for `--uninstall`.
//!
//! `state` lists each managed file as `present` or `absent`; a present
//! file's bytes sit beside it. It is written once, by the first install, so
//! reinstalls and upgrades never overwrite the original.

use std::fs;
use std::path::Path;

use super::{io_err, write_atomic, InstallError};

const STATE: &str = "state";

/// Has a first install recorded the state?
pub fn exists(dir: &Path) -> bool {
    dir.join(STATE).exists()
}

pub fn save_once(dir: &Path, files: &[&Path]) -> Result<(), InstallError> {
    if dir.join(STATE).exists() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let mut state = String::new();
    for f in files {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match fs::read(f) {
            Ok(bytes) => {
                write_atomic(&dir.join(&name), &bytes, 0o644)?;
                state.push_str(&format!("{name} present\n"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                state.push_str(&format!("{name} absent\n"));
            }
            Err(e) => return Err(io_err("read", f)(e)),
        }
    }
    // The state file last: a backup without it is incomplete and redone.
    write_atomic(&dir.join(STATE), state.as_bytes(), 0o644)
}

pub fn restore(dir: &Path, host_dir: &Path, names: &[&str]) -> Result<(), InstallError> {
    let state_path = dir.join(STATE);
    let state = fs::read_to_string(&state_path).map_err(io_err("read", &state_path))?;
    for name in names {
        let line = state
            .lines()
            .find_map(|l| l.strip_prefix(name).map(str::trim))
            .ok_or_else(|| InstallError::Backup(dir.to_owned(), format!("no entry for {name}")))?;
        let dst = host_dir.join(name);
        match line {
            "present" => {
                let src = dir.join(name);
                let bytes = fs::read(&src).map_err(io_err("read", &src))?;
                let mode = if *name == super::LIB_NAME {
                    0o755
                } else {
                    0o644
                };
                write_atomic(&dst, &bytes, mode)?;
            }
            "absent" => match fs::remove_file(&dst) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &dst)(e)),
            },
            other => {
                return Err(InstallError::Backup(
                    dir.to_owned(),
                    format!("unknown state {other:?} for {name}"),
                ))
            }
        }
    }
    Ok(())
}
