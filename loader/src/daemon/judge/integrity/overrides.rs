//! Limits admins changed at runtime: `vgpu set-mem-limit` / `set-sm-limit`
//! record each change in `<state-dir>/overrides/<dev>-<ino>.json` (the
//! region file's device and inode) before writing the region, and the
//! daemon takes them as the expected limits, so an admin's change is never
//! a finding nor undone. Only root can write the state directory; a record
//! that anyone else could have written is ignored, and one whose region
//! path no longer is that inode (the file was replaced) too.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use super::expected::Overrides;

/// Sub-directory of the state directory.
pub const DIR: &str = "overrides";
const VERSION: u32 = 1;
const MAX_RECORD_BYTES: u64 = 64 << 10;

/// (st_dev, st_ino) of a region file.
pub type FileKey = (u64, u64);

/// Which limit an admin changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    Memory,
    Sm,
}

/// Why a record could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    #[error("cannot record the admin change in {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is ignored: {why}")]
    Untrusted { path: PathBuf, why: &'static str },
    #[error("{path} is not an override record: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    version: u32,
    /// The region as the admin named it (host path).
    path: PathBuf,
    limits: Overrides,
}

/// The record file of region `key`.
pub fn record_path(state_dir: &Path, key: FileKey) -> PathBuf {
    state_dir
        .join(DIR)
        .join(format!("{}-{}.json", key.0, key.1))
}

/// Records that an admin set `changed` of `devices` to `value` in the
/// region at `region` (whose file is `key`), merged with earlier changes.
pub fn record(
    state_dir: &Path,
    region: &Path,
    key: FileKey,
    changed: Changed,
    devices: &[usize],
    value: u64,
) -> Result<(), OverrideError> {
    let path = record_path(state_dir, key);
    let werr = |source| OverrideError::Write {
        path: path.clone(),
        source,
    };
    let dir = state_dir.join(DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(werr)?;
    // Changes for another file that had this inode do not carry over.
    let mut limits = match load(state_dir, key) {
        Ok(Some(o)) => o,
        _ => Overrides::default(),
    };
    let cells = match changed {
        Changed::Memory => &mut limits.mem,
        Changed::Sm => &mut limits.sm,
    };
    for &d in devices {
        cells.insert(d, value);
    }
    let rec = Record {
        version: VERSION,
        path: std::path::absolute(region).unwrap_or_else(|_| region.to_owned()),
        limits,
    };
    let text = serde_json::to_vec_pretty(&rec).map_err(|e| werr(e.into()))?;
    let tmp = dir.join(format!(".{}-{}.tmp", key.0, key.1));
    let mut f = File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(werr)?;
    f.write_all(&text).map_err(werr)?;
    f.sync_data().map_err(werr)?;
    std::fs::rename(&tmp, &path).map_err(werr)?;
    prune(state_dir);
    Ok(())
}

/// Removes records whose region is gone or replaced (they can never apply
/// again), so the directory does not grow with every region ever changed.
fn prune(state_dir: &Path) {
    const MAX_SEEN: usize = 4096;
    let Ok(entries) = std::fs::read_dir(state_dir.join(DIR)) else {
        return;
    };
    for e in entries.flatten().take(MAX_SEEN) {
        let name = e.file_name();
        let Some(key) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".json"))
            .and_then(|n| n.split_once('-'))
            .and_then(|(d, i)| Some((d.parse().ok()?, i.parse().ok()?)))
        else {
            continue;
        };
        if matches!(load(state_dir, key), Ok(None)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The admin's changes to region `key`, if a trustworthy record exists.
pub fn load(state_dir: &Path, key: FileKey) -> Result<Option<Overrides>, OverrideError> {
    let path = record_path(state_dir, key);
    let file = match File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(OverrideError::Read { path, source }),
    };
    let rerr = |source| OverrideError::Read {
        path: path.clone(),
        source,
    };
    let untrusted = |why| OverrideError::Untrusted {
        path: path.clone(),
        why,
    };
    let md = file.metadata().map_err(rerr)?;
    if !md.is_file() {
        return Err(untrusted("not a regular file"));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me || md.mode() & 0o022 != 0 {
        return Err(untrusted(
            "not owned by the daemon's user, or writable by others",
        ));
    }
    if md.len() > MAX_RECORD_BYTES {
        return Err(untrusted("too large"));
    }
    let mut text = Vec::new();
    file.take(MAX_RECORD_BYTES)
        .read_to_end(&mut text)
        .map_err(rerr)?;
    let rec: Record = serde_json::from_slice(&text).map_err(|source| OverrideError::Parse {
        path: path.clone(),
        source,
    })?;
    let now = rec
        .path
        .symlink_metadata()
        .ok()
        .filter(|m| m.is_file())
        .map(|m| (m.dev(), m.ino()));
    if rec.version != VERSION || now != Some(key) {
        return Ok(None);
    }
    Ok(Some(rec.limits))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(p: &Path) -> FileKey {
        let m = std::fs::metadata(p).unwrap();
        (m.dev(), m.ino())
    }

    #[test]
    fn records_merge_and_bind_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let region = dir.path().join("r.cache");
        std::fs::write(&region, b"x").unwrap();
        let key = key_of(&region);
        // Made while the region exists, so it never has the region's inode.
        let other = dir.path().join("s.cache");
        std::fs::write(&other, b"s").unwrap();
        assert_eq!(load(&state, key).unwrap(), None);
        record(&state, &region, key, Changed::Memory, &[0, 1], 2 << 30).unwrap();
        record(&state, &region, key, Changed::Sm, &[0], 40).unwrap();
        record(&state, &region, key, Changed::Memory, &[1], 3 << 30).unwrap();
        let o = load(&state, key).unwrap().unwrap();
        assert_eq!(o.mem.get(&0), Some(&(2 << 30)));
        assert_eq!(o.mem.get(&1), Some(&(3 << 30)));
        assert_eq!(o.sm.get(&0), Some(&40));
        let mode = std::fs::metadata(record_path(&state, key)).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600);

        // The region was replaced: the record no longer applies.
        std::fs::remove_file(&region).unwrap();
        let keep = dir.path().join("keep");
        std::fs::write(&keep, b"y").unwrap();
        std::fs::write(&region, b"z").unwrap();
        if key_of(&region) != key {
            assert_eq!(load(&state, key).unwrap(), None);
        }
        // Gone: no record applies, and the next record removes it.
        std::fs::remove_file(&region).unwrap();
        assert_eq!(load(&state, key).unwrap(), None);
        record(&state, &other, key_of(&other), Changed::Sm, &[0], 50).unwrap();
        assert!(!record_path(&state, key).exists());
        assert!(record_path(&state, key_of(&other)).exists());
    }

    #[test]
    fn records_others_could_write_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let region = dir.path().join("r.cache");
        std::fs::write(&region, b"x").unwrap();
        let key = key_of(&region);
        record(&state, &region, key, Changed::Memory, &[0], 1).unwrap();
        let p = record_path(&state, key);
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        assert!(matches!(
            load(&state, key),
            Err(OverrideError::Untrusted { .. })
        ));
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&region, &p).unwrap();
        assert!(load(&state, key).is_err(), "a symlink is never followed");
    }
}
