//! Finding region files under HAMi's container directory.
//!
//! HAMi's device plugin gives every container a host directory
//! `<root>/<podUID>_<containerName>/`, mounted in the container where
//! `CUDA_DEVICE_MEMORY_SHARED_CACHE` points, holding one `*.cache` region
//! file. The directory may also hold a copy of `libvgpu.so`; files whose
//! name contains `libvgpu.so` are skipped.

use std::io;
use std::path::{Path, PathBuf};

/// HAMi's default root of per-container directories.
pub const DEFAULT_ROOT: &str = "/usr/local/vgpu/containers";

/// Why a root could not be scanned.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("cannot read region directory {path}: {source}")]
    ReadDir { path: PathBuf, source: io::Error },
}

/// One region file found under a root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    /// Pod UID and container name from the directory name, when it has
    /// HAMi's `<podUID>_<containerName>` form.
    pub owner: Option<ContainerRef>,
}

/// A Kubernetes container, as named by HAMi's directory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ContainerRef {
    pub pod_uid: String,
    pub container: String,
}

impl ContainerRef {
    /// Parses `<podUID>_<containerName>`. Pod UIDs and container names
    /// (DNS labels) contain no `_`, so the first one separates them.
    pub fn from_dir_name(name: &str) -> Option<Self> {
        let (pod_uid, container) = name.split_once('_')?;
        if pod_uid.is_empty() || container.is_empty() {
            return None;
        }
        Some(Self {
            pod_uid: pod_uid.to_owned(),
            container: container.to_owned(),
        })
    }

    /// The container of the directory holding `path`, if it is named like
    /// HAMi's.
    pub fn of_file(path: &Path) -> Option<Self> {
        let dir = path.parent()?.file_name()?.to_str()?;
        Self::from_dir_name(dir)
    }
}

fn is_region_name(name: &str) -> bool {
    name.ends_with(".cache") && !name.contains("libvgpu.so")
}

fn read_dir(path: &Path) -> Result<Vec<std::fs::DirEntry>, DiscoverError> {
    let err = |source| DiscoverError::ReadDir {
        path: path.to_owned(),
        source,
    };
    let mut entries = std::fs::read_dir(path)
        .map_err(err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    entries.sort_by_key(|e| e.file_name());
    Ok(entries)
}

/// Every region file under `root`: `*.cache` files in its subdirectories
/// (HAMi's layout) and directly in `root`, sorted by path. A subdirectory
/// that cannot be read is skipped (it may vanish while we scan); `root`
/// itself must be readable.
pub fn discover(root: &Path) -> Result<Vec<Found>, DiscoverError> {
    let mut out = Vec::new();
    for entry in read_dir(root)? {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            let Ok(inner) = read_dir(&path) else {
                continue;
            };
            for file in inner {
                let is_file = file.file_type().map(|t| t.is_file()).unwrap_or(false);
                if is_file && file.file_name().to_str().is_some_and(is_region_name) {
                    let path = file.path();
                    out.push(Found {
                        owner: ContainerRef::of_file(&path),
                        path,
                    });
                }
            }
        } else if kind.is_file() && entry.file_name().to_str().is_some_and(is_region_name) {
            out.push(Found { path, owner: None });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hami_layout_is_found_and_named() {
        let root = tempfile::tempdir().unwrap();
        let c1 = root
            .path()
            .join("0b6c2f3e-1111-2222-3333-444455556666_main");
        let c2 = root.path().join("nounderscore");
        std::fs::create_dir_all(&c1).unwrap();
        std::fs::create_dir_all(&c2).unwrap();
        std::fs::write(c1.join("a1b2.cache"), b"x").unwrap();
        std::fs::write(c1.join("libvgpu.so.cache"), b"x").unwrap();
        std::fs::write(c1.join("libvgpu.so"), b"x").unwrap();
        std::fs::write(c2.join("r.cache"), b"x").unwrap();
        std::fs::write(root.path().join("top.cache"), b"x").unwrap();
        let found = discover(root.path()).unwrap();
        let names: Vec<_> = found
            .iter()
            .map(|f| f.path.strip_prefix(root.path()).unwrap().to_path_buf())
            .collect();
        assert_eq!(
            names,
            [
                PathBuf::from("0b6c2f3e-1111-2222-3333-444455556666_main/a1b2.cache"),
                PathBuf::from("nounderscore/r.cache"),
                PathBuf::from("top.cache"),
            ]
        );
        let owner = found[0].owner.clone().unwrap();
        assert_eq!(owner.pod_uid, "0b6c2f3e-1111-2222-3333-444455556666");
        assert_eq!(owner.container, "main");
        assert_eq!(found[1].owner, None);
        assert_eq!(found[2].owner, None);
    }

    #[test]
    fn missing_root_is_an_error() {
        let e = discover(Path::new("/nonexistent/vgpu-root")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/vgpu-root"), "{e}");
    }
}
