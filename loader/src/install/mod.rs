//! Installing the hook on a node (`vgpu install-hook`).
//!
//! HAMi's device plugin bind-mounts `<host-dir>/libvgpu.so` and
//! `<host-dir>/ld.so.preload` into every GPU container (its
//! `pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go`,
//! <https://github.com/Project-HAMi/HAMi>). Installing
//! vgpu there makes it the hook of every new container, with no change to
//! HAMi. Running containers keep the library they mapped: the new file is
//! written under a temporary name and renamed over the old one, so no
//! process ever sees a half-written library (an in-place copy would corrupt
//! every mapping of the old file).
//!
//! The first install keeps what was there before in `<host-dir>/.vgpu-backup/`
//! so `--uninstall` can restore it exactly.
//!
//! On HAMi ≥ 2.5 nodes the device plugin mounts a versioned file first;
//! `hami` says how vgpu takes its place without writing over it.

mod backup;
mod elf;
mod hami;
mod watch;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub use elf::{running_libc, ElfError};
pub use watch::DirWatch;

/// The files vgpu manages in the host directory.
pub const LIB_NAME: &str = "libvgpu.so";
pub const PRELOAD_NAME: &str = "ld.so.preload";
const BACKUP_DIR: &str = ".vgpu-backup";

/// Why installing or uninstalling failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error("the backup in {0} is damaged: {1}")]
    Backup(PathBuf, String),
}

pub(crate) fn io_err(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> InstallError {
    let path = path.to_owned();
    move |source| InstallError::Io {
        action,
        path,
        source,
    }
}

/// What an install or uninstall did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Installed,
    AlreadyInstalled,
    Restored,
    NothingToUninstall,
}

/// The outcome, and HAMi's versioned files moved aside (install) or back
/// (uninstall).
#[derive(Debug, PartialEq, Eq)]
pub struct Report {
    pub outcome: Outcome,
    pub versioned: Vec<String>,
}

/// What to install and where.
#[derive(Debug)]
pub struct Plan {
    /// The new `libvgpu.so`.
    pub lib: PathBuf,
    /// The node directory (`/usr/local/vgpu` under HAMi).
    pub host_dir: PathBuf,
    /// The path containers see the library at, written into ld.so.preload.
    /// HAMi mounts the host dir's library at `/usr/local/vgpu/libvgpu.so`.
    pub container_path: PathBuf,
    /// The C library whose symbol versions the hook must fit.
    pub libc: PathBuf,
    /// Also move HAMi's `libvgpu.so.<version>` files aside, so that its
    /// device plugin falls back to vgpu's `libvgpu.so`.
    pub hami: bool,
}

/// Installs the hook; a second run with the same library changes nothing
/// (and reads, but does not check, the library again: cheap enough to run
/// every few seconds with `--watch`).
pub fn install(plan: &Plan) -> Result<Report, InstallError> {
    let new = fs::read(&plan.lib).map_err(io_err("read", &plan.lib))?;
    let lib_dst = plan.host_dir.join(LIB_NAME);
    let preload_dst = plan.host_dir.join(PRELOAD_NAME);
    let preload = format!("{}\n", plan.container_path.display());
    let same_lib = fs::read(&lib_dst).is_ok_and(|old| old == new);
    let same_preload = fs::read(&preload_dst).is_ok_and(|old| old == preload.as_bytes());
    let backup_dir = plan.host_dir.join(BACKUP_DIR);

    let outcome = if same_lib && same_preload {
        Outcome::AlreadyInstalled
    } else {
        if !same_lib {
            elf::check_compatible(&plan.lib, &new, &plan.libc)?;
        }
        fs::create_dir_all(&plan.host_dir).map_err(io_err("create", &plan.host_dir))?;
        backup::save_once(&backup_dir, &[&lib_dst, &preload_dst])?;
        if !same_lib {
            write_atomic(&lib_dst, &new, 0o755)?;
        }
        if !same_preload {
            write_atomic(&preload_dst, preload.as_bytes(), 0o644)?;
        }
        Outcome::Installed
    };
    // Only now: HAMi's device plugin must always find one of the two names.
    let versioned = if plan.hami {
        hami::set_aside(&plan.host_dir, &backup_dir)?
    } else {
        Vec::new()
    };
    Ok(Report { outcome, versioned })
}

/// Which library HAMi's device plugin mounts into new containers now.
#[derive(Debug, PartialEq, Eq)]
pub enum Mounted {
    /// `libvgpu.so`, byte for byte the library given.
    Vgpu,
    /// HAMi's versioned files (any one of them wins over `libvgpu.so`).
    Versioned(Vec<String>),
    /// `libvgpu.so`, another library.
    Other,
    /// Neither name exists.
    Nothing,
}

/// Applies HAMi's rule (a versioned file first, else `libvgpu.so`) to
/// `host_dir`, and compares the result with `lib`.
pub fn mounted(host_dir: &Path, lib: &Path) -> Result<Mounted, InstallError> {
    let versioned = hami::versioned_in(host_dir)?;
    if !versioned.is_empty() {
        return Ok(Mounted::Versioned(versioned));
    }
    let ours = fs::read(lib).map_err(io_err("read", lib))?;
    Ok(match fs::read(host_dir.join(LIB_NAME)) {
        Ok(bytes) if bytes == ours => Mounted::Vgpu,
        Ok(_) => Mounted::Other,
        Err(_) => Mounted::Nothing,
    })
}

/// Puts back what the first install found (or removes the files if there
/// was nothing), HAMi's versioned files first, then drops the backup.
pub fn uninstall(host_dir: &Path) -> Result<Report, InstallError> {
    let dir = host_dir.join(BACKUP_DIR);
    if !dir.exists() {
        return Ok(Report {
            outcome: Outcome::NothingToUninstall,
            versioned: Vec::new(),
        });
    }
    // Before libvgpu.so may disappear: the device plugin needs one of them.
    let versioned = hami::restore(host_dir, &dir)?;
    if backup::exists(&dir) {
        backup::restore(&dir, host_dir, &[LIB_NAME, PRELOAD_NAME])?;
    }
    fs::remove_dir_all(&dir).map_err(io_err("remove", &dir))?;
    Ok(Report {
        outcome: Outcome::Restored,
        versioned,
    })
}

/// Writes `bytes` to a temporary file in the same directory, syncs it, and
/// renames it over `dst`: readers see the old file or the new one, whole.
pub(crate) fn write_atomic(dst: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dst.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
        f.write_all(bytes).map_err(io_err("write", &tmp))?;
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io_err("chmod", &tmp))?;
        f.sync_all().map_err(io_err("sync", &tmp))?;
        fs::rename(&tmp, dst).map_err(io_err("rename onto", dst))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
