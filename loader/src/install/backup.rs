//! The pre-install state of the host directory, kept for `--uninstall`.
//!
//! `state` lists each managed file as `present <mode>` (octal permission
//! bits) or `absent`; a present file's bytes sit beside it, with its mode,
//! so a root-only file stays root-only in the backup and comes back as it
//! was. It is written once, by the first install, so reinstalls and
//! upgrades never overwrite the original. Everything here is read as the
//! host directory is: no symlink followed, nothing but a regular file
//! opened.

use std::fs;
use std::path::Path;

use super::{io_err, read_in, write_atomic, HostFile, InstallError};

const STATE: &str = "state";
/// Which `libvgpu.so` vgpu wrote last: its inode, modification time and
/// size. A rename over it changes the inode, an in-place `cp -f` (HAMi ≤
/// 2.4's and Volcano's device-plugin start) the time: then it is not
/// vgpu's any more, whatever its bytes.
const INSTALLED: &str = "installed";

/// `ino mtime_sec mtime_nsec size` of `path`, not followed.
fn identity(path: &Path) -> Result<Option<String>, InstallError> {
    use std::os::unix::fs::MetadataExt as _;
    match fs::symlink_metadata(path) {
        Ok(m) => Ok(Some(format!(
            "{} {} {} {}\n",
            m.ino(),
            m.mtime(),
            m.mtime_nsec(),
            m.size()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("stat", path)(e)),
    }
}

/// Records that vgpu has just written `lib`.
pub fn record_installed(dir: &Path, lib: &Path) -> Result<(), InstallError> {
    let Some(id) = identity(lib)? else {
        return Ok(());
    };
    write_atomic(&dir.join(INSTALLED), id.as_bytes(), 0o644)
}

/// Is `lib` the file vgpu wrote last? A backup without the record (an
/// install by a vgpu before it) vouches for the file as well.
pub fn installed_here(dir: &Path, lib: &Path) -> Result<bool, InstallError> {
    match read_in(dir, INSTALLED)? {
        Some(rec) => Ok(identity(lib)?.is_some_and(|id| id.as_bytes() == rec.bytes)),
        None => Ok(exists(dir)),
    }
}

/// Has a first install recorded the state?
pub fn exists(dir: &Path) -> bool {
    fs::symlink_metadata(dir.join(STATE)).is_ok()
}

/// Records `files` (each name and what the first install found there,
/// `None`: nothing) unless a state is recorded already.
pub fn save_once(dir: &Path, files: &[(&str, Option<&HostFile>)]) -> Result<(), InstallError> {
    if exists(dir) {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let mut state = String::new();
    for (name, found) in files {
        match found {
            Some(f) => {
                write_atomic(&dir.join(name), &f.bytes, f.mode)?;
                state.push_str(&format!("{name} present {:o}\n", f.mode));
            }
            None => state.push_str(&format!("{name} absent\n")),
        }
    }
    // The state file last: a backup without it is incomplete and redone.
    write_atomic(&dir.join(STATE), state.as_bytes(), 0o644)
}

/// The mode a file recorded without one (by an older vgpu) is restored with.
fn default_mode(name: &str) -> u32 {
    if name == super::LIB_NAME {
        0o755
    } else {
        0o644
    }
}

pub fn restore(dir: &Path, host_dir: &Path, names: &[&str]) -> Result<(), InstallError> {
    let damaged = |why: String| InstallError::Backup(dir.to_owned(), why);
    let state = read_in(dir, STATE)?.ok_or_else(|| damaged(format!("no {STATE} file")))?;
    let state =
        String::from_utf8(state.bytes).map_err(|_| damaged(format!("{STATE} is not text")))?;
    for name in names {
        let mut words = state
            .lines()
            .map(|l| l.split_whitespace())
            .find_map(|mut w| (w.next() == Some(*name)).then_some(w))
            .ok_or_else(|| damaged(format!("no entry for {name}")))?;
        let dst = host_dir.join(name);
        match (words.next(), words.next()) {
            (Some("present"), mode) => {
                let mode = match mode {
                    None => default_mode(name),
                    Some(m) => u32::from_str_radix(m, 8)
                        .ok()
                        .filter(|m| *m <= 0o7777)
                        .ok_or_else(|| damaged(format!("bad mode {m:?} for {name}")))?,
                };
                let saved = read_in(dir, name)?
                    .ok_or_else(|| damaged(format!("{name} is listed but missing")))?;
                write_atomic(&dst, &saved.bytes, mode)?;
            }
            (Some("absent"), None) => match fs::remove_file(&dst) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &dst)(e)),
            },
            (other, _) => {
                return Err(damaged(format!(
                    "unknown state {:?} for {name}",
                    other.unwrap_or("")
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// A file's mode survives the backup and the restore; an entry written
    /// by an older vgpu (no mode) gets the old default; a file that was
    /// absent is removed again.
    #[test]
    fn modes_are_kept_and_old_states_still_restore() {
        let d = tempfile::tempdir().unwrap();
        let (host, dir) = (d.path().join("host"), d.path().join("host/.vgpu-backup"));
        fs::create_dir_all(&host).unwrap();
        let secret = HostFile {
            bytes: b"/opt/x.so\n".to_vec(),
            mode: 0o600,
        };
        save_once(
            &dir,
            &[("ld.so.preload", Some(&secret)), ("libvgpu.so", None)],
        )
        .unwrap();
        assert_eq!(mode(&dir.join("ld.so.preload")), 0o600);
        fs::write(host.join("libvgpu.so"), b"ours").unwrap();
        restore(&dir, &host, &["ld.so.preload", "libvgpu.so"]).unwrap();
        assert_eq!(fs::read(host.join("ld.so.preload")).unwrap(), secret.bytes);
        assert_eq!(mode(&host.join("ld.so.preload")), 0o600);
        assert!(!host.join("libvgpu.so").exists());

        fs::write(
            dir.join(STATE),
            "libvgpu.so present\nld.so.preload absent\n",
        )
        .unwrap();
        fs::write(dir.join("libvgpu.so"), b"hami").unwrap();
        restore(&dir, &host, &["libvgpu.so"]).unwrap();
        assert_eq!(mode(&host.join("libvgpu.so")), 0o755);
        fs::write(dir.join(STATE), "libvgpu.so present 9\n").unwrap();
        assert!(matches!(
            restore(&dir, &host, &["libvgpu.so"]),
            Err(InstallError::Backup(..))
        ));
    }

    /// A backup file swapped for a symlink is refused, not read through.
    #[test]
    fn a_symlink_in_the_backup_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let (host, dir) = (d.path().join("host"), d.path().join("host/.vgpu-backup"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(d.path().join("secret"), b"x").unwrap();
        fs::write(dir.join(STATE), "ld.so.preload present 644\n").unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), dir.join("ld.so.preload")).unwrap();
        let e = restore(&dir, &host, &["ld.so.preload"]).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(!host.join("ld.so.preload").exists());
    }
}
