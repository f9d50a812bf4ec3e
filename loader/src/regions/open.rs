//! Opening files out of places a container can write, the way careful node
//! agents do: the lookup is confined by the kernel (`openat2` with
//! `RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`), the
//! last component is never followed (`O_NOFOLLOW`), and the lookup yields an
//! `O_PATH` descriptor, which opens nothing (a FIFO's writer is not woken, a
//! device's driver is not called). Only once `fstat` on that descriptor says
//! it is a regular file is the same inode opened for I/O (`O_NONBLOCK`), and
//! the size and header checks run on that descriptor ([`RegionIo::new`]),
//! never on a path looked at earlier. A kernel without `openat2` (before 5.6) is refused, never served
//! by a weaker open.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
use vgpu_common::region_io::{file_kind, IoError, RegionIo};

/// How to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

/// Why a file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot open {what} {path}: no such file or directory")]
    Missing { path: PathBuf, what: &'static str },
    #[error(
        "{0}: a component is a symbolic link; vgpu never follows links out of a \
         container-writable directory (pass the resolved path)"
    )]
    Symlink(PathBuf),
    #[error(
        "cannot open {path}: this kernel has no openat2 (Linux 5.6 or later is needed to \
         open container files safely)"
    )]
    NoOpenat2 { path: PathBuf },
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is a {kind}, not a regular file: refused")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(transparent)]
    Region(#[from] IoError),
}

/// Flags of the real open, through `/proc/self/fd` (so not `O_NOFOLLOW`:
/// that link is ours). `O_NONBLOCK` in case the inode is not what was
/// checked (it cannot be, but a blocking open is the one thing a daemon
/// must never do).
fn oflags(access: Access) -> OFlags {
    let rw = match access {
        Access::ReadOnly => OFlags::RDONLY,
        Access::ReadWrite => OFlags::RDWR,
    };
    rw | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY
}

const CONFINED: ResolveFlags = ResolveFlags::IN_ROOT
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// What [`OpenError::Missing`] calls the file.
const REGION: &str = "region file";

fn open_err(path: &Path, what: &'static str, e: rustix::io::Errno) -> OpenError {
    let path = path.to_owned();
    match e {
        rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR => OpenError::Missing { path, what },
        // ELOOP: a symlink with NO_SYMLINKS or O_NOFOLLOW; EXDEV: a magic
        // link or an escape attempt.
        rustix::io::Errno::LOOP | rustix::io::Errno::XDEV => OpenError::Symlink(path),
        rustix::io::Errno::NOSYS => OpenError::NoOpenat2 { path },
        e => OpenError::Open {
            path,
            source: e.into(),
        },
    }
}

/// Opens a directory the caller trusts (a `/proc/<pid>` entry, the regions
/// root an operator named) as an `O_PATH` anchor.
fn anchor(dir: &Path) -> Result<OwnedFd, OpenError> {
    rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => OpenError::Missing {
            path: dir.to_owned(),
            what: "directory",
        },
        e => OpenError::Open {
            path: dir.to_owned(),
            source: e.into(),
        },
    })
}

/// A path relative to an anchor: leading `/` dropped (`RESOLVE_IN_ROOT`
/// treats the anchor as `/` anyway); empty stays `.`.
fn relative(path: &Path) -> PathBuf {
    let rel: PathBuf = path
        .components()
        .filter(|c| !matches!(c, Component::RootDir | Component::Prefix(_)))
        .collect();
    if rel.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        rel
    }
}

/// Opens `rel` below the directory `at`, confined to it, as a regular file.
fn open_confined(
    at: &OwnedFd,
    rel: &Path,
    shown: &Path,
    access: Access,
) -> Result<File, OpenError> {
    let fd = rustix::fs::openat2(at, relative(rel), path_flags(), Mode::empty(), CONFINED)
        .map_err(|e| open_err(shown, REGION, e))?;
    reopen(fd, shown, access)
}

/// `O_PATH` opens nothing: no FIFO peer is woken, no device driver's open
/// runs. The real open happens only once the inode is known to be a
/// regular file.
fn path_flags() -> OFlags {
    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Checks the `O_PATH` descriptor's type, then opens that very inode for
/// I/O through `/proc/self/fd` (a path swapped meanwhile changes nothing).
fn reopen(fd: OwnedFd, shown: &Path, access: Access) -> Result<File, OpenError> {
    let st = rustix::fs::fstat(&fd).map_err(|e| OpenError::Open {
        path: shown.to_owned(),
        source: e.into(),
    })?;
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    match kind {
        rustix::fs::FileType::RegularFile => {}
        rustix::fs::FileType::Symlink => return Err(OpenError::Symlink(shown.to_owned())),
        _ => {
            return Err(OpenError::NotRegular {
                path: shown.to_owned(),
                kind: kind_name(kind),
            })
        }
    }
    let me = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let io = rustix::fs::open(me.as_str(), oflags(access), Mode::empty()).map_err(|e| {
        OpenError::Open {
            path: shown.to_owned(),
            source: e.into(),
        }
    })?;
    let file = File::from(io);
    let md = file.metadata().map_err(|source| OpenError::Open {
        path: shown.to_owned(),
        source,
    })?;
    if !md.file_type().is_file() {
        return Err(OpenError::NotRegular {
            path: shown.to_owned(),
            kind: file_kind(md.file_type()),
        });
    }
    Ok(file)
}

fn kind_name(k: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType as T;
    match k {
        T::RegularFile => "regular file",
        T::Directory => "directory",
        T::Symlink => "symbolic link",
        T::Fifo => "FIFO",
        T::Socket => "socket",
        T::CharacterDevice => "character device",
        T::BlockDevice => "block device",
        _ => "special file",
    }
}

/// The region `path` as process `proc_dir` (`/proc/<pid>`) names it:
/// absolute paths resolve inside the process's root, relative ones inside
/// its working directory (`..` never climbs above either).
pub fn open_in_process(
    proc_dir: &Path,
    path: &Path,
    access: Access,
) -> Result<RegionIo, OpenError> {
    let base = if path.is_absolute() { "root" } else { "cwd" };
    let at = anchor(&proc_dir.join(base))?;
    let file = open_confined(&at, path, path, access)?;
    Ok(RegionIo::new(file, path, access == Access::ReadWrite)?)
}

/// The file `path` as process `proc_dir` (`/proc/<pid>`) names it, resolved
/// like [`open_in_process`]: a file next to the region (its `.sm`
/// sidecar), which the process's container owns.
pub fn open_file_in_process(
    proc_dir: &Path,
    path: &Path,
    access: Access,
) -> Result<File, OpenError> {
    let base = if path.is_absolute() { "root" } else { "cwd" };
    let at = anchor(&proc_dir.join(base))?;
    open_confined(&at, path, path, access)
}

/// The region at `path`, which lies under `root` (a directory the caller
/// trusts, e.g. HAMi's container directory): no symlink and no `..` below
/// `root` is followed.
pub fn open_under(root: &Path, path: &Path, access: Access) -> Result<RegionIo, OpenError> {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let at = anchor(root)?;
    let file = open_confined(&at, rel, path, access)?;
    Ok(RegionIo::new(file, path, access == Access::ReadWrite)?)
}

/// A file an operator named on the command line (admin commands, `vgpu
/// turns`): no component may be a symlink, and it must be a regular file.
pub fn open_file(path: &Path, access: Access) -> Result<File, OpenError> {
    open_named(path, "file", access)
}

fn open_named(path: &Path, what: &'static str, access: Access) -> Result<File, OpenError> {
    let flags = ResolveFlags::NO_SYMLINKS.union(ResolveFlags::NO_MAGICLINKS);
    let fd = rustix::fs::openat2(CWD, path, path_flags(), Mode::empty(), flags)
        .map_err(|e| open_err(path, what, e))?;
    reopen(fd, path, access)
}

/// A file an operator named that may lie behind symlinks of the operator's
/// own (`vgpu install-hook --from`): followed, but it must be a regular
/// file, and nothing else (a FIFO, a device) is ever opened.
pub fn open_followed(path: &Path) -> Result<File, OpenError> {
    let fd = rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| open_err(path, "file", e))?;
    reopen(fd, path, Access::ReadOnly)
}

/// The file `name` of the directory `dir` (which the caller trusts, e.g.
/// the hook's host directory an operator named), as a regular file: a
/// symlink there is refused, never followed, and a FIFO or device is never
/// opened.
pub fn open_file_in(dir: &Path, name: &str, access: Access) -> Result<File, OpenError> {
    let at = anchor(dir)?;
    let shown = dir.join(name);
    let fd = rustix::fs::openat2(&at, name, path_flags(), Mode::empty(), CONFINED)
        .map_err(|e| open_err(&shown, "file", e))?;
    reopen(fd, &shown, access)
}

/// The region an operator named, opened like [`open_file`].
pub fn open_region(path: &Path, access: Access) -> Result<RegionIo, OpenError> {
    let file = open_named(path, REGION, access)?;
    Ok(RegionIo::new(file, path, access == Access::ReadWrite)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use vgpu_common::region::{FILE_SIZE, MAGIC};

    fn region(path: &Path) {
        let mut v = vec![0u8; FILE_SIZE as usize];
        v[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        v[4..8].copy_from_slice(&1u32.to_le_bytes());
        std::fs::write(path, v).unwrap();
    }

    /// A fake `/proc/<pid>` whose root is `ctr` (the anchor is opened with
    /// normal resolution, as `/proc/<pid>/root` is).
    fn fake_proc(dir: &Path) -> PathBuf {
        let p = dir.join("proc/7");
        std::fs::create_dir_all(&p).unwrap();
        std::fs::create_dir_all(dir.join("ctr/r")).unwrap();
        symlink(dir.join("ctr"), p.join("root")).unwrap();
        symlink(dir.join("ctr/r"), p.join("cwd")).unwrap();
        p
    }

    #[test]
    fn process_paths_stay_in_the_process_root() {
        let dir = tempfile::tempdir().unwrap();
        let p = fake_proc(dir.path());
        region(&dir.path().join("ctr/r/a.cache"));
        region(&dir.path().join("host.cache"));
        assert!(open_in_process(&p, Path::new("/r/a.cache"), Access::ReadWrite).is_ok());
        assert!(open_in_process(&p, Path::new("a.cache"), Access::ReadOnly).is_ok());
        // `..` is clamped at the root: the host's file is not reached.
        assert!(matches!(
            open_in_process(&p, Path::new("/../../host.cache"), Access::ReadOnly),
            Err(OpenError::Missing { .. })
        ));
        // Symlinks, absolute or relative, are refused wherever they are.
        symlink(
            dir.path().join("host.cache"),
            dir.path().join("ctr/r/abs.cache"),
        )
        .unwrap();
        symlink("../../host.cache", dir.path().join("ctr/r/rel.cache")).unwrap();
        symlink(dir.path(), dir.path().join("ctr/d")).unwrap();
        for name in ["/r/abs.cache", "/r/rel.cache", "/d/host.cache", "rel.cache"] {
            let e = open_in_process(&p, Path::new(name), Access::ReadOnly).unwrap_err();
            assert!(matches!(e, OpenError::Symlink(_)), "{name}: {e}");
        }
        // A directory is not a region.
        assert!(matches!(
            open_in_process(&p, Path::new("/r"), Access::ReadOnly),
            Err(OpenError::NotRegular {
                kind: "directory",
                ..
            })
        ));
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f.cache");
        rustix::fs::mknodat(
            CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::RUSR | Mode::WUSR,
            0,
        )
        .unwrap();
        // Read-only open of a FIFO with no writer blocks without O_NONBLOCK.
        let e = open_region(&fifo, Access::ReadOnly).unwrap_err();
        assert!(
            matches!(e, OpenError::NotRegular { kind: "FIFO", .. }),
            "{e}"
        );
        let e = open_under(dir.path(), &fifo, Access::ReadOnly).unwrap_err();
        assert!(
            matches!(e, OpenError::NotRegular { kind: "FIFO", .. }),
            "{e}"
        );
    }

    #[test]
    fn under_a_root_nothing_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("p_c")).unwrap();
        region(&root.join("p_c/ok.cache"));
        region(&dir.path().join("outside.cache"));
        symlink(dir.path().join("outside.cache"), root.join("p_c/ln.cache")).unwrap();
        assert!(open_under(&root, &root.join("p_c/ok.cache"), Access::ReadWrite).is_ok());
        assert!(matches!(
            open_under(&root, &root.join("p_c/ln.cache"), Access::ReadOnly),
            Err(OpenError::Symlink(_))
        ));
        assert!(matches!(
            open_region(&root.join("p_c/ln.cache"), Access::ReadOnly),
            Err(OpenError::Symlink(_))
        ));
    }
}
