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

/// How many region files one scan takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Per container directory (and directly in the root), first by name.
    pub per_dir: usize,
    /// In all.
    pub total: usize,
}

impl Bounds {
    pub const NONE: Self = Self {
        per_dir: usize::MAX,
        total: usize::MAX,
    };
}

/// What a bounded scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovered {
    pub regions: Vec<Found>,
    /// Region files left out by the bounds.
    pub skipped: usize,
}

/// Every region file under `root`: `*.cache` files in its subdirectories
/// (HAMi's layout) and directly in `root`, sorted by path. A subdirectory
/// that cannot be read is skipped (it may vanish while we scan); `root`
/// itself must be readable. Symlinks are never taken (neither as a
/// directory nor as a file).
pub fn discover(root: &Path) -> Result<Vec<Found>, DiscoverError> {
    discover_bounded(root, Bounds::NONE).map(|d| d.regions)
}

/// What an operator named: the region file `path`, or every region under
/// the directory `path` (`root` when none is named). A symlink named as
/// `path` is a file (refused when it is opened), never a directory to scan.
/// The second value is the root the regions were found under, if any.
pub fn named_or_under<'a>(
    path: Option<&'a Path>,
    root: &'a Path,
) -> Result<(Vec<Found>, Option<&'a Path>), DiscoverError> {
    match path.filter(|p| !std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())) {
        Some(p) => Ok((
            vec![Found {
                path: p.to_owned(),
                owner: ContainerRef::of_file(p),
            }],
            None,
        )),
        None => {
            let root = path.unwrap_or(root);
            Ok((discover(root)?, Some(root)))
        }
    }
}

/// [`discover`], taking at most `bounds.per_dir` files of each directory
/// and `bounds.total` in all.
pub fn discover_bounded(root: &Path, bounds: Bounds) -> Result<Discovered, DiscoverError> {
    let mut out = Discovered::default();
    let mut top = 0;
    let take = |out: &mut Discovered, in_dir: &mut usize, found: Found| {
        if *in_dir >= bounds.per_dir || out.regions.len() >= bounds.total {
            out.skipped += 1;
        } else {
            *in_dir += 1;
            out.regions.push(found);
        }
    };
    for entry in read_dir(root)? {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            let Ok(inner) = read_dir(&path) else {
                continue;
            };
            let mut in_dir = 0;
            for file in inner {
                let is_file = file.file_type().map(|t| t.is_file()).unwrap_or(false);
                if is_file && file.file_name().to_str().is_some_and(is_region_name) {
                    let path = file.path();
                    let found = Found {
                        owner: ContainerRef::of_file(&path),
                        path,
                    };
                    take(&mut out, &mut in_dir, found);
                }
            }
        } else if kind.is_file() && entry.file_name().to_str().is_some_and(is_region_name) {
            take(&mut out, &mut top, Found { path, owner: None });
        }
    }
    out.regions.sort_by(|a, b| a.path.cmp(&b.path));
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
    fn bounds_cap_each_directory_and_the_scan() {
        let root = tempfile::tempdir().unwrap();
        for d in ["a_x", "b_y"] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
            for i in 0..10 {
                std::fs::write(root.path().join(d).join(format!("{i}.cache")), b"x").unwrap();
            }
        }
        std::os::unix::fs::symlink(root.path().join("a_x"), root.path().join("c_z")).unwrap();
        let got = discover_bounded(
            root.path(),
            Bounds {
                per_dir: 3,
                total: 5,
            },
        )
        .unwrap();
        assert_eq!(got.regions.len(), 5);
        assert_eq!(got.skipped, 15);
        let in_a = got
            .regions
            .iter()
            .filter(|f| f.path.starts_with(root.path().join("a_x")));
        assert_eq!(in_a.count(), 3);
        assert_eq!(
            discover(root.path()).unwrap().len(),
            20,
            "the symlinked directory is not read"
        );
    }

    #[test]
    fn missing_root_is_an_error() {
        let e = discover(Path::new("/nonexistent/vgpu-root")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/vgpu-root"), "{e}");
    }
}
