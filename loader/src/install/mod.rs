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
//! so `--uninstall` can restore it exactly, mode included.
//!
//! The host directory's files are mounted into every GPU container, so
//! nothing in it is followed or waited on: a symlink or anything but a
//! regular file where vgpu reads (`libvgpu.so`, `ld.so.preload`, the
//! backup) is refused, never read through (a symlinked `ld.so.preload`
//! would copy its target, say a root-only file, into the backup), and a
//! FIFO is never opened. The library given is a regular file (`--from` may
//! be an operator's symlink), a shared library, and the hook: it exports
//! the hook's entry points (`elf`), or nothing is touched.
//!
//! On HAMi ≥ 2.5 nodes the device plugin mounts a versioned file first;
//! `hami` says how vgpu takes its place without writing over it, and why
//! HAMi ≤ 2.4, Volcano and KAI nodes are refused without `--force`. A plain
//! install on a node HAMi 2.5+ serves is refused too: the file it writes
//! would never be mounted. A `libvgpu.so` vgpu did not write (`backup`
//! records the file each install writes) is never replaced without
//! `--force`.
//!
//! `--uninstall` leaves a marker (`.vgpu-uninstalled`) that a keeper
//! (`--watch`) honours: it stands down instead of installing again, until
//! an install without `--watch` (a new deployment's init container) clears
//! the marker. A keeper that is stopped (SIGTERM: its pod deleted or
//! rolled) restores the directory as `--uninstall` does, but leaves no
//! marker: the next pod's keeper, or one running beside it, installs again. Install and uninstall hold an exclusive `flock` on the host
//! directory, so a keeper's install never interleaves with an uninstall.

mod backup;
mod elf;
mod hami;
mod watch;

use std::fs;
use std::io::{Read as _, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::regions::open::{open_file_in, open_followed, Access, OpenError};

pub use elf::{running_libc, ElfError, NotHook};
pub use hami::HamiSeen;
pub use watch::{DirWatch, StopSignals, Woke};

/// The files vgpu manages in the host directory.
pub const LIB_NAME: &str = "libvgpu.so";
pub const PRELOAD_NAME: &str = "ld.so.preload";
const BACKUP_DIR: &str = ".vgpu-backup";
/// Left by `--uninstall`; a keeper stands down while it exists.
const UNINSTALLED: &str = ".vgpu-uninstalled";

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
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("{0} is a symbolic link or not a directory: refusing to use it as vgpu's backup")]
    BackupDir(PathBuf),
    #[error("the backup in {0} is damaged: {1}")]
    Backup(PathBuf, String),
    #[error(
        "refusing to install in {dir}: it holds no HAMi libvgpu.so.<version> and vgpu set none \
         aside, so HAMi 2.5 or later is not proven; found: {found}. HAMi 2.4 and earlier (and \
         Volcano's vGPU device plugin) copy their libvgpu.so over the host file in place on \
         every start, and with --hami there is no versioned file to move aside: upgrade HAMi \
         to 2.5 or later, or wait for its device plugin to start, then run install-hook --hami \
         (docs/kubernetes.md, \"HAMi versions\"). Nothing was changed."
    )]
    HamiUnversioned { dir: PathBuf, found: String },
    #[error(
        "refusing to install in {dir}: found {found}, whose device plugin copies its \
         libvgpu.so over the host file in place (cp -f) on every start, which would rewrite \
         vgpu's library under the containers that have it mapped. On HAMi, upgrade to 2.5 or \
         later and run install-hook --hami; to install here anyway, pass --force and restart \
         that device plugin only on a drained node (docs/kubernetes.md, \"Hosts\"). Nothing \
         was changed."
    )]
    RewrittenInPlace { dir: PathBuf, found: String },
    #[error(
        "refusing to replace {path}: vgpu did not install it ({found}); pass --force to \
         replace it (the first install keeps it, and --uninstall puts it back). Nothing was \
         changed."
    )]
    Foreign { path: PathBuf, found: String },
    #[error(
        "refusing to install in {0}: HAMi's device plugin serves it and mounts its {1} before \
         libvgpu.so, so a plain install would write a file no container gets; run \
         install-hook --hami. Nothing was changed."
    )]
    HamiServes(PathBuf, String),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Installed,
    /// A keeper found the uninstall marker and changed nothing.
    StoodDown,
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
    /// A keeper's install (`--watch`): honours the uninstall marker instead
    /// of clearing it.
    pub keeper: bool,
    /// The operator's word (`--force`) to replace a `libvgpu.so` vgpu did
    /// not install, and to install where a device plugin rewrites it in
    /// place (HAMi ≤ 2.4, Volcano, KAI's isolator).
    pub force: bool,
}

/// A regular file's bytes and permission bits.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HostFile {
    pub bytes: Vec<u8>,
    pub mode: u32,
}

fn read_all(mut f: fs::File, path: &Path) -> Result<HostFile, InstallError> {
    let mode = f
        .metadata()
        .map_err(io_err("stat", path))?
        .permissions()
        .mode()
        & 0o7777;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).map_err(io_err("read", path))?;
    Ok(HostFile { bytes, mode })
}

/// `name` in `dir`, `None` if it (or `dir`) does not exist; a symlink or
/// anything but a regular file is an error, and is never opened.
pub(crate) fn read_in(dir: &Path, name: &str) -> Result<Option<HostFile>, InstallError> {
    match open_file_in(dir, name, Access::ReadOnly) {
        Ok(f) => read_all(f, &dir.join(name)).map(Some),
        Err(OpenError::Missing { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The library an operator named: a regular file (through the operator's
/// symlinks), never a FIFO waited on, a shared library, and the hook.
fn read_library(path: &Path) -> Result<Vec<u8>, InstallError> {
    let bytes = read_all(open_followed(path)?, path)?.bytes;
    elf::check_shared_library(path, &bytes)?;
    elf::check_hook(path, &bytes)?;
    Ok(bytes)
}

/// Refuses a backup directory that is a symlink or not a directory (what
/// is written into it, and read back at uninstall, would go elsewhere).
pub(crate) fn check_backup_dir(dir: &Path) -> Result<(), InstallError> {
    match fs::symlink_metadata(dir) {
        Ok(m) if !m.file_type().is_dir() => Err(InstallError::BackupDir(dir.to_owned())),
        _ => Ok(()),
    }
}

/// Installs the hook; a second run with the same library changes nothing
/// (and reads, but does not check against the C library, the library
/// again: cheap enough to run every few seconds with `--watch`).
pub fn install(plan: &Plan) -> Result<Report, InstallError> {
    let _lock = lock(&plan.host_dir)?;
    let marker = plan.host_dir.join(UNINSTALLED);
    if plan.keeper && fs::symlink_metadata(&marker).is_ok() {
        return Ok(Report {
            outcome: Outcome::StoodDown,
            versioned: Vec::new(),
        });
    }
    // What is given first: a wrong file is refused whatever the node.
    let new = read_library(&plan.lib)?;
    let backup_dir = plan.host_dir.join(BACKUP_DIR);
    check_backup_dir(&backup_dir)?;
    let seen = hami::seen(&plan.host_dir, &backup_dir)?;
    match (plan.hami, &seen) {
        (true, HamiSeen::Versioned(_)) | (false, HamiSeen::Nothing) => {}
        (true, _) => {
            return Err(InstallError::HamiUnversioned {
                dir: plan.host_dir.clone(),
                found: seen.describe(),
            })
        }
        (false, HamiSeen::Versioned(versions)) => {
            let names: Vec<String> = versions.iter().map(|v| format!("{LIB_NAME}.{v}")).collect();
            return Err(InstallError::HamiServes(
                plan.host_dir.clone(),
                names.join(", "),
            ));
        }
        (false, _) if plan.force => {}
        (false, _) => {
            return Err(InstallError::RewrittenInPlace {
                dir: plan.host_dir.clone(),
                found: seen.describe(),
            })
        }
    }
    let lib_dst = plan.host_dir.join(LIB_NAME);
    let preload_dst = plan.host_dir.join(PRELOAD_NAME);
    let preload = format!("{}\n", plan.container_path.display());
    let old_lib = read_in(&plan.host_dir, LIB_NAME)?;
    let old_preload = read_in(&plan.host_dir, PRELOAD_NAME)?;
    let same_lib = old_lib.as_ref().is_some_and(|old| old.bytes == new);
    if !same_lib
        && !plan.force
        && old_lib.is_some()
        && !backup::installed_here(&backup_dir, &lib_dst)?
    {
        let found = match old_lib.as_ref().and_then(|f| elf::why_not_hook(&f.bytes)) {
            Some(why) => format!("not a hook at all: {why}"),
            None => format!("another hook; {}", seen.describe()),
        };
        return Err(InstallError::Foreign {
            path: lib_dst,
            found,
        });
    }
    // HAMi's own file names the same library (2.5 to 2.9 ship it without
    // the newline): rewriting it would only fight each device-plugin start.
    let same_preload = old_preload
        .as_ref()
        .is_some_and(|old| old.bytes.trim_ascii_end() == preload.trim_end().as_bytes());

    let outcome = if same_lib && same_preload {
        Outcome::AlreadyInstalled
    } else {
        if !same_lib {
            elf::check_compatible(&plan.lib, &new, &plan.libc)?;
        }
        fs::create_dir_all(&plan.host_dir).map_err(io_err("create", &plan.host_dir))?;
        backup::save_once(
            &backup_dir,
            &[
                (LIB_NAME, old_lib.as_ref()),
                (PRELOAD_NAME, old_preload.as_ref()),
            ],
        )?;
        if !same_lib {
            write_atomic(&lib_dst, &new, 0o755)?;
            backup::record_installed(&backup_dir, &lib_dst)?;
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
    // Only an operator's install (not a keeper's) ends an uninstall.
    match fs::remove_file(&marker) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("remove", &marker)(e)),
    }
    Ok(Report { outcome, versioned })
}

/// What `host_dir` proves of the HAMi release serving it.
pub fn hami_seen(host_dir: &Path) -> Result<HamiSeen, InstallError> {
    hami::seen(host_dir, &host_dir.join(BACKUP_DIR))
}

/// An exclusive `flock` on `host_dir`, held until dropped; `None` when
/// the directory does not exist (nothing there for a keeper to race).
fn lock(host_dir: &Path) -> Result<Option<OwnedFd>, InstallError> {
    use rustix::fs::{flock, open, FlockOperation, Mode, OFlags};
    let fd = match open(
        host_dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io_err("open", host_dir)(e.into())),
    };
    flock(&fd, FlockOperation::LockExclusive).map_err(|e| io_err("lock", host_dir)(e.into()))?;
    Ok(Some(fd))
}

/// Which library HAMi's device plugin mounts into new containers now.
#[derive(Debug, PartialEq, Eq)]
pub enum Mounted {
    /// `libvgpu.so`, byte for byte the library given.
    Vgpu,
    /// HAMi's versioned files (any one of them wins over `libvgpu.so`).
    Versioned(Vec<String>),
    /// `libvgpu.so`, another hook (another build of vgpu's, HAMi-core's).
    Other,
    /// `libvgpu.so`, a file that is not a hook at all.
    NotHook(NotHook),
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
    let in_place = read_in(host_dir, LIB_NAME)?;
    // Before `lib` is read: a file in place that is no hook is not one even
    // when `lib` is the same file.
    if let Some(why) = in_place.as_ref().and_then(|f| elf::why_not_hook(&f.bytes)) {
        return Ok(Mounted::NotHook(why));
    }
    let ours = read_library(lib)?;
    Ok(match in_place {
        Some(f) if f.bytes == ours => Mounted::Vgpu,
        Some(_) => Mounted::Other,
        None => Mounted::Nothing,
    })
}

/// Puts back what the first install found (or removes the files if there
/// was nothing), HAMi's versioned files first, then drops the backup.
/// Leaves the marker a keeper stands down at.
pub fn uninstall(host_dir: &Path) -> Result<Report, InstallError> {
    undo(host_dir, true)
}

/// What a keeper does when its container is stopped (its pod deleted, or
/// replaced by a rolling update): as [`uninstall`], but without the
/// marker, so that a keeper running beside it (a surge pod) or after it
/// (the next pod, a restart of this container) installs again. Every file
/// is put back by rename or removed, never written in place: processes
/// that map vgpu's library keep its inode.
pub fn restore(host_dir: &Path) -> Result<Report, InstallError> {
    undo(host_dir, false)
}

fn undo(host_dir: &Path, marker: bool) -> Result<Report, InstallError> {
    let Some(_lock) = lock(host_dir)? else {
        return Ok(Report {
            outcome: Outcome::NothingToUninstall,
            versioned: Vec::new(),
        });
    };
    // First: a keeper woken by what follows must already find it.
    if marker {
        write_atomic(
            &host_dir.join(UNINSTALLED),
            b"vgpu install-hook --uninstall ran here; keepers (--watch) stand down until the next install-hook\n",
            0o644,
        )?;
    }
    let dir = host_dir.join(BACKUP_DIR);
    check_backup_dir(&dir)?;
    if fs::symlink_metadata(&dir).is_err() {
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
/// The temporary file is new (`O_EXCL`: never a symlink or file left
/// there) and has `mode` from its creation, so a root-only file's bytes are
/// never readable by others, not even for a moment.
pub(crate) fn write_atomic(dst: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dst.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let create = || {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
    };
    let result = (|| {
        let mut f = match create() {
            // Left by an earlier run of this PID that died: not ours to keep.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                fs::remove_file(&tmp).map_err(io_err("remove", &tmp))?;
                create()
            }
            other => other,
        }
        .map_err(io_err("create", &tmp))?;
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
