//! HAMi's versioned library names.
//!
//! HAMi's device plugin (≥ 2.5) mounts `<dir>/libvgpu.so.<its version>` into
//! each GPU container and falls back to `<dir>/libvgpu.so` only while the
//! versioned file does not exist; its start script copies the versioned
//! file back from its image whenever it is missing or differs. vgpu owns
//! only the unversioned name and moves every versioned file out of the way
//! instead of writing over it:
//! - the device plugin then mounts vgpu's `libvgpu.so`, with no change to HAMi;
//! - the file HAMi's start script copies back lands on a path that does not
//!   exist, so its `cp` creates a new file instead of rewriting, in place,
//!   the library that running containers have mapped (vgpu's, had vgpu
//!   taken the versioned name);
//! - a rename keeps the inode that containers started earlier have mounted;
//! - uninstall renames the files back, and a device plugin restarted after
//!   vgpu is gone copies HAMi's library back by itself.
//!
//! HAMi 2.4 and earlier ship only an unversioned `libvgpu.so`, always
//! mount it, and `cp -f` it over the host file (in place) on every device
//! plugin start: there vgpu cannot take any name without a restart
//! rewriting the pages running containers have mapped. A versioned file,
//! in the host directory or set aside by an earlier install, is the proof
//! of 2.5 or later that installing needs; `seen` says what the directory
//! proves.

use std::fs;
use std::path::Path;

use super::{check_backup_dir, io_err, InstallError, LIB_NAME, PRELOAD_NAME};

/// Where the versioned files wait, inside the backup directory.
const SET_ASIDE: &str = "hami";

/// The directory HAMi's device plugin (every version) makes for each
/// container it allocates.
const CONTAINERS: &str = "containers";

/// Where Volcano's device plugin makes them: `<HOOK_PATH>/vgpu/containers/
/// <pod-uid>_<ctr>` with `HOOK_PATH=/usr/local/vgpu`, the directory it also
/// copies `libvgpu.so` into (Project-HAMi/volcano-vgpu-device-plugin
/// 4fb76ba, `pkg/plugin/server.go` `Allocate`, and the chart's
/// templates/daemonset.yaml).
const VOLCANO_CONTAINERS: &str = "vgpu/containers";

/// KAI's resource isolator (Project-HAMi/KAI-resource-isolator,
/// chart/kai-resource-isolator/templates/daemonset.yaml): its libsync start `cp -f`s HAMi-core's
/// `libvgpu.so` and an `ld.so.preload` into the host directory (in place),
/// makes `containers/` and `chmod 1777`s it, so that HAMi-core, not a device
/// plugin, can make each container's `<pod uid>_<ctr>/` there; no HAMi
/// release sets the sticky bit on `containers/`.
const STICKY: u32 = 0o1000;

/// What the host directory says of the HAMi release that serves it.
#[derive(Debug, PartialEq, Eq)]
pub enum HamiSeen {
    /// `libvgpu.so.<version>` files, in the host directory or set aside by
    /// vgpu: HAMi 2.5 or later; the versions, sorted.
    Versioned(Vec<String>),
    /// HAMi's per-container directories but no versioned file ever: HAMi
    /// 2.4 or earlier, whose device plugin rewrites `libvgpu.so` in place.
    Unversioned,
    /// Volcano's vGPU device plugin: its per-container directories lie one
    /// level deeper (`<HOOK_PATH>/vgpu/containers`, with its `HOOK_PATH`
    /// the host directory itself), and its start `cp -f`s an unversioned
    /// `libvgpu.so` in place as HAMi 2.4 does.
    Volcano,
    /// KAI's resource isolator: `containers/` with the sticky bit its
    /// libsync sets, or a `usage.cache` region in it (HAMi-core's own
    /// per-container layout); its restart `cp -f`s HAMi-core's
    /// `libvgpu.so` in place as HAMi 2.4 does.
    Kai,
    /// An unversioned `libvgpu.so` that vgpu did not put there, beside an
    /// `ld.so.preload`, and no per-container directory yet: what the start
    /// of HAMi ≤ 2.4's or Volcano's device plugin leaves (both `cp -f`
    /// their image's two files) before it allocates its first container.
    Started,
    /// Nothing of HAMi's.
    Nothing,
}

impl HamiSeen {
    /// Whose device plugin this is and which release, for messages.
    pub fn describe(&self) -> String {
        match self {
            HamiSeen::Versioned(v) => {
                format!("HAMi {} (2.5 or later: versioned library)", v.join(", "))
            }
            HamiSeen::Unversioned => {
                "HAMi 2.4 or earlier (its containers/, no versioned library ever)".to_owned()
            }
            HamiSeen::Volcano => {
                "Volcano's vGPU device plugin, HAMi-core (its vgpu/containers/)".to_owned()
            }
            HamiSeen::Kai => "KAI's resource isolator, HAMi-core (its containers/ with the \
                 sticky bit, or usage.cache regions in it)"
                .to_owned(),
            HamiSeen::Started => "HAMi 2.4 or earlier, or Volcano's vGPU device plugin \
                 (an unversioned libvgpu.so vgpu did not install, with ld.so.preload; \
                 no container allocated yet, so which of the two is not known)"
                .to_owned(),
            HamiSeen::Nothing => "no HAMi seen".to_owned(),
        }
    }

    /// Does this host's device plugin `cp -f` its `libvgpu.so` over the
    /// host file, in place, on every start?
    pub fn rewrites_in_place(&self) -> bool {
        matches!(
            self,
            HamiSeen::Unversioned | HamiSeen::Volcano | HamiSeen::Kai | HamiSeen::Started
        )
    }
}

/// Reads what `host_dir` (and the set-aside directory in `backup`) prove of
/// HAMi; nothing is followed through a symlink.
pub fn seen(host_dir: &Path, backup: &Path) -> Result<HamiSeen, InstallError> {
    let mut names = match fs::symlink_metadata(host_dir) {
        Ok(_) => versioned_in(host_dir)?,
        Err(_) => Vec::new(),
    };
    let aside = backup.join(SET_ASIDE);
    check_backup_dir(&aside)?;
    if fs::symlink_metadata(&aside).is_ok() {
        names.extend(versioned_in(&aside)?);
    }
    let mut versions: Vec<String> = names
        .iter()
        .filter_map(|n| n.strip_prefix(LIB_NAME).and_then(|v| v.strip_prefix('.')))
        .map(str::to_owned)
        .collect();
    versions.sort();
    versions.dedup();
    if !versions.is_empty() {
        return Ok(HamiSeen::Versioned(versions));
    }
    let is_dir = |rel: &str| fs::symlink_metadata(host_dir.join(rel)).is_ok_and(|m| m.is_dir());
    let exists = |p: &Path| fs::symlink_metadata(p).is_ok();
    Ok(if is_kai(&host_dir.join(CONTAINERS)) {
        HamiSeen::Kai
    } else if is_dir(CONTAINERS) {
        HamiSeen::Unversioned
    } else if is_dir(VOLCANO_CONTAINERS) {
        HamiSeen::Volcano
    } else if [LIB_NAME, PRELOAD_NAME].iter().all(|n| {
        // The first install keeps what it found: the device plugin's pair
        // was there before vgpu's install, and still comes back at its
        // next start.
        if exists(backup) {
            exists(&backup.join(n))
        } else {
            exists(&host_dir.join(n))
        }
    }) {
        HamiSeen::Started
    } else {
        HamiSeen::Nothing
    })
}

/// Is `containers` KAI's: a directory with the sticky bit, or holding a
/// `<pod uid>_<ctr>/usage.cache`?
fn is_kai(containers: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(meta) = fs::symlink_metadata(containers) else {
        return false;
    };
    if !meta.is_dir() {
        return false;
    }
    if meta.permissions().mode() & STICKY != 0 {
        return true;
    }
    fs::read_dir(containers).is_ok_and(|entries| {
        entries.filter_map(Result::ok).any(|e| {
            fs::symlink_metadata(e.path().join(vgpu_common::env::PER_CONTAINER_CACHE))
                .is_ok_and(|m| m.is_file())
        })
    })
}

/// Is `name` one of HAMi's versioned library names (`libvgpu.so.<version>`)?
fn is_versioned(name: &str) -> bool {
    name.strip_prefix(LIB_NAME)
        .and_then(|rest| rest.strip_prefix('.'))
        .is_some_and(|version| {
            !version.is_empty() && !version.contains('/') && !version.ends_with(".tmp")
        })
}

/// The versioned files in `host_dir`, sorted.
pub fn versioned_in(host_dir: &Path) -> Result<Vec<String>, InstallError> {
    let mut names: Vec<String> = fs::read_dir(host_dir)
        .map_err(io_err("list", host_dir))?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| is_versioned(n))
        .collect();
    names.sort();
    Ok(names)
}

/// Moves every `libvgpu.so.<version>` of `host_dir` into `<backup>/hami/`,
/// replacing an older copy of the same name (the newest is what HAMi's
/// device plugin would provide). Returns the names moved.
pub fn set_aside(host_dir: &Path, backup: &Path) -> Result<Vec<String>, InstallError> {
    let mut moved = Vec::new();
    let entries = fs::read_dir(host_dir).map_err(io_err("list", host_dir))?;
    for entry in entries {
        let entry = entry.map_err(io_err("list", host_dir))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !is_versioned(&name) {
            continue;
        }
        let dir = backup.join(SET_ASIDE);
        check_backup_dir(&dir)?;
        fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
        let dst = dir.join(&name);
        fs::rename(entry.path(), &dst).map_err(io_err("move aside", &entry.path()))?;
        moved.push(name);
    }
    moved.sort();
    Ok(moved)
}

/// Renames the set-aside files back into `host_dir`. A name HAMi has
/// copied back meanwhile keeps HAMi's current file. Returns the names
/// restored.
pub fn restore(host_dir: &Path, backup: &Path) -> Result<Vec<String>, InstallError> {
    let dir = backup.join(SET_ASIDE);
    check_backup_dir(&dir)?;
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("list", &dir)(e)),
    };
    let mut restored = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("list", &dir))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !is_versioned(&name) {
            continue;
        }
        let dst = host_dir.join(&name);
        if fs::symlink_metadata(&dst).is_ok() {
            continue;
        }
        fs::rename(entry.path(), &dst).map_err(io_err("restore", &dst))?;
        restored.push(name);
    }
    restored.sort();
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proof of HAMi ≥ 2.5 survives the install that moves the file
    /// away; per-container directories alone say 2.4 or earlier.
    #[test]
    fn what_the_directory_proves() {
        let d = tempfile::tempdir().unwrap();
        let host = d.path().join("vgpu");
        let backup = host.join(".vgpu-backup");
        assert_eq!(seen(&host, &backup).unwrap(), HamiSeen::Nothing);
        fs::create_dir_all(&host).unwrap();
        fs::write(host.join("libvgpu.so"), b"hami 2.4").unwrap();
        assert_eq!(seen(&host, &backup).unwrap(), HamiSeen::Nothing);
        fs::write(host.join("ld.so.preload"), b"/usr/local/vgpu/libvgpu.so").unwrap();
        assert_eq!(seen(&host, &backup).unwrap(), HamiSeen::Started);
        fs::create_dir_all(host.join(VOLCANO_CONTAINERS)).unwrap();
        assert_eq!(seen(&host, &backup).unwrap(), HamiSeen::Volcano);
        fs::create_dir_all(host.join(CONTAINERS)).unwrap();
        fs::write(host.join("libvgpu.so"), b"hami 2.4").unwrap();
        assert_eq!(seen(&host, &backup).unwrap(), HamiSeen::Unversioned);
        // KAI's libsync: `chmod 1777 containers`; or a region of its layout.
        use std::os::unix::fs::PermissionsExt as _;
        let containers = host.join(CONTAINERS);
        fs::set_permissions(&containers, fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(seen(&host, &backup).unwrap(), HamiSeen::Kai);
        fs::set_permissions(&containers, fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(seen(&host, &backup).unwrap(), HamiSeen::Unversioned);
        fs::create_dir_all(containers.join("uid_main")).unwrap();
        fs::write(containers.join("uid_main/usage.cache"), b"").unwrap();
        assert_eq!(seen(&host, &backup).unwrap(), HamiSeen::Kai);
        fs::remove_dir_all(containers.join("uid_main")).unwrap();
        fs::write(host.join("libvgpu.so.v2.10.0"), b"hami").unwrap();
        let v = HamiSeen::Versioned(vec!["v2.10.0".into()]);
        assert_eq!(seen(&host, &backup).unwrap(), v);
        set_aside(&host, &backup).unwrap();
        assert_eq!(seen(&host, &backup).unwrap(), v);
    }

    #[test]
    fn versioned_names() {
        for n in [
            "libvgpu.so.v2.10.0",
            "libvgpu.so.2.5.1",
            "libvgpu.so.v0.0.1-dev",
        ] {
            assert!(is_versioned(n), "{n}");
        }
        for n in [
            "libvgpu.so",
            "libvgpu.so.",
            "ld.so.preload",
            "libvgpu.sox",
            "xlibvgpu.so.v1",
            "libvgpu.so.v1.tmp",
        ] {
            assert!(!is_versioned(n), "{n}");
        }
    }

    /// A symlink where the set-aside directory goes is refused: HAMi's
    /// files are never moved, or looked for, through it.
    #[test]
    fn a_symlinked_set_aside_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let host = d.path().join("vgpu");
        let backup = host.join(".vgpu-backup");
        fs::create_dir_all(&backup).unwrap();
        fs::create_dir_all(d.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(d.path().join("elsewhere"), backup.join(SET_ASIDE)).unwrap();
        fs::write(host.join("libvgpu.so.v2.10.0"), b"hami").unwrap();
        assert!(matches!(
            set_aside(&host, &backup),
            Err(InstallError::BackupDir(_))
        ));
        assert!(host.join("libvgpu.so.v2.10.0").exists());
        assert!(matches!(
            restore(&host, &backup),
            Err(InstallError::BackupDir(_))
        ));
    }

    #[test]
    fn set_aside_then_restore_keeps_inodes_and_a_newer_copy_back() {
        use std::os::unix::fs::MetadataExt as _;
        let d = tempfile::tempdir().unwrap();
        let host = d.path().join("vgpu");
        let backup = host.join(".vgpu-backup");
        fs::create_dir_all(&host).unwrap();
        fs::write(host.join("libvgpu.so.v2.9.0"), b"old hami").unwrap();
        fs::write(host.join("libvgpu.so.v2.10.0"), b"hami").unwrap();
        fs::write(host.join("libvgpu.so"), b"vgpu").unwrap();
        let ino = fs::metadata(host.join("libvgpu.so.v2.10.0")).unwrap().ino();

        let moved = set_aside(&host, &backup).unwrap();
        assert_eq!(moved, ["libvgpu.so.v2.10.0", "libvgpu.so.v2.9.0"]);
        assert!(!host.join("libvgpu.so.v2.10.0").exists());
        assert_eq!(fs::read(host.join("libvgpu.so")).unwrap(), b"vgpu");
        let aside = backup.join(SET_ASIDE).join("libvgpu.so.v2.10.0");
        assert_eq!(fs::metadata(&aside).unwrap().ino(), ino);
        assert!(set_aside(&host, &backup).unwrap().is_empty());

        // The device plugin copied a file back meanwhile: it stays.
        fs::write(host.join("libvgpu.so.v2.9.0"), b"copied back").unwrap();
        let restored = restore(&host, &backup).unwrap();
        assert_eq!(restored, ["libvgpu.so.v2.10.0"]);
        assert_eq!(
            fs::metadata(host.join("libvgpu.so.v2.10.0")).unwrap().ino(),
            ino
        );
        assert_eq!(
            fs::read(host.join("libvgpu.so.v2.9.0")).unwrap(),
            b"copied back"
        );
        assert!(restore(&d.path().join("none"), &d.path().join("no-backup"))
            .unwrap()
            .is_empty());
    }
}
