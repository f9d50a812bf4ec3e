//! Finding region files under HAMi's container directory.
//!
//! HAMi's device plugin gives every container a host directory
//! `<root>/<podUID>_<containerName>/`, mounted in the container where
//! `CUDA_DEVICE_MEMORY_SHARED_CACHE` points, holding one `*.cache` region
//! file. The directory may also hold a copy of `libvgpu.so`; files whose
//! name contains `libvgpu.so` are skipped.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// A container directory listed before is read again only when this much
/// time has passed since, whatever its timestamps say.
pub const RELIST_ALL: Duration = Duration::from_secs(30);

/// A listing is reused only if the directory had not changed for this long
/// when it was read: a change in the same tick of the clock as the read
/// would leave its timestamps as they were.
const SETTLED: Duration = Duration::from_secs(2);

/// What the last walks read of each container directory, so that one
/// whose change time (`st_ctime`, which a tenant cannot set: `utimensat`
/// sets it to now) is the same is not read again (see [`discover_listed`]).
#[derive(Debug, Default)]
pub struct Listings {
    dirs: HashMap<PathBuf, Listing>,
    /// Directories read (not reused) by the walks so far.
    #[cfg(test)]
    reads: u64,
}

#[derive(Debug)]
struct Listing {
    stamp: Stamp,
    read_at: Instant,
    /// The first names (sorted) of its regular files that look like
    /// regions, as many as a walk takes of one directory: a tenant filling
    /// its directory must not fill the daemon's memory.
    files: Vec<OsString>,
    /// How many more there were.
    more: usize,
}

/// Identity and change times of a directory: (dev, inode, ctime, mtime).
type Stamp = (u64, u64, (i64, i64), (i64, i64));

impl Listings {
    /// The first `keep` region-like file names of directory `dir` (an
    /// entry of the root the walk found to be a directory) and how many
    /// more it holds, from the last listing while the directory is
    /// unchanged.
    fn files(&mut self, dir: &Path, keep: usize) -> Option<(&[OsString], usize)> {
        use std::os::unix::fs::MetadataExt as _;
        let md = std::fs::symlink_metadata(dir).ok().filter(|m| m.is_dir())?;
        let stamp = (
            md.dev(),
            md.ino(),
            (md.ctime(), md.ctime_nsec()),
            (md.mtime(), md.mtime_nsec()),
        );
        let reuse = self
            .dirs
            .get(dir)
            .is_some_and(|l| l.stamp == stamp && l.read_at.elapsed() < RELIST_ALL);
        if !reuse {
            let entries = read_dir(dir).ok()?;
            let mut files: Vec<OsString> = entries
                .into_iter()
                .filter(|f| f.file_type().is_ok_and(|t| t.is_file()))
                .map(|f| f.file_name())
                .filter(|n| n.to_str().is_some_and(is_region_name))
                .collect();
            let more = files.len().saturating_sub(keep);
            files.truncate(keep);
            files.shrink_to_fit();
            #[cfg(test)]
            {
                self.reads += 1;
            }
            // Changed too recently to trust its timestamps next time: the
            // stamp then never matches, and the next walk reads it again.
            let changed = UNIX_EPOCH
                + Duration::new(
                    u64::try_from(md.ctime()).unwrap_or(0),
                    u32::try_from(md.ctime_nsec()).unwrap_or(0),
                );
            let settled = SystemTime::now()
                .duration_since(changed)
                .is_ok_and(|age| age >= SETTLED);
            let stamp = if settled {
                stamp
            } else {
                (0, 0, (-1, -1), (-1, -1))
            };
            self.dirs.insert(
                dir.to_owned(),
                Listing {
                    stamp,
                    read_at: Instant::now(),
                    files,
                    more,
                },
            );
        }
        self.dirs.get(dir).map(|l| (&l.files[..], l.more))
    }
}

/// [`discover`], taking at most `bounds.per_dir` files of each directory
/// and `bounds.total` in all.
pub fn discover_bounded(root: &Path, bounds: Bounds) -> Result<Discovered, DiscoverError> {
    discover_listed(root, bounds, &mut Listings::default())
}

/// [`discover_bounded`] that reads a container directory again only when
/// its change time moved since `listings` last read it, or
/// [`RELIST_ALL`] after that read: creating, removing or renaming a file
/// in it moves the change time, and setting its times back moves it too.
/// The root itself is read every time; listings of directories no longer
/// in it are forgotten.
pub fn discover_listed(
    root: &Path,
    bounds: Bounds,
    listings: &mut Listings,
) -> Result<Discovered, DiscoverError> {
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
    let mut seen = HashSet::new();
    for entry in read_dir(root)? {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            let Some((files, more)) = listings.files(&path, bounds.per_dir) else {
                continue;
            };
            let owner = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(ContainerRef::from_dir_name);
            let mut in_dir = 0;
            for name in files {
                let found = Found {
                    path: path.join(name),
                    owner: owner.clone(),
                };
                take(&mut out, &mut in_dir, found);
            }
            out.skipped += more;
            seen.insert(path);
        } else if kind.is_file() && entry.file_name().to_str().is_some_and(is_region_name) {
            take(&mut out, &mut top, Found { path, owner: None });
        }
    }
    listings.dirs.retain(|d, _| seen.contains(d));
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

    /// An unchanged directory is not read again; a file added to it is
    /// found at the next walk even when its times are set back, and so is
    /// a directory that changed just before it was read.
    #[test]
    fn an_unchanged_directory_is_not_read_again_and_a_change_is_seen() {
        use std::os::unix::fs::MetadataExt as _;
        let root = tempfile::tempdir().unwrap();
        let c = root.path().join("pod_main");
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("a.cache"), b"x").unwrap();
        let names = |d: &Discovered| d.regions.iter().map(|f| f.path.clone()).collect::<Vec<_>>();
        let mut l = Listings::default();
        // Just changed: read at every walk until it has settled.
        discover_listed(root.path(), Bounds::NONE, &mut l).unwrap();
        discover_listed(root.path(), Bounds::NONE, &mut l).unwrap();
        assert_eq!(l.reads, 2, "a directory changed moments ago is read again");
        // Settled (times two seconds back, as if listed later).
        let old = std::time::SystemTime::now() - Duration::from_secs(10);
        let set_times = |p: &Path| {
            let f = std::fs::File::open(p).unwrap();
            f.set_times(
                std::fs::FileTimes::new()
                    .set_accessed(old)
                    .set_modified(old),
            )
            .unwrap();
        };
        set_times(&c);
        // utimensat moved ctime to now: wait until it has settled.
        let settled = std::time::SystemTime::now() + SETTLED;
        while std::time::SystemTime::now() < settled {
            std::thread::sleep(Duration::from_millis(100));
        }
        discover_listed(root.path(), Bounds::NONE, &mut l).unwrap();
        let reads = l.reads;
        let d = discover_listed(root.path(), Bounds::NONE, &mut l).unwrap();
        assert_eq!(l.reads, reads, "an unchanged directory is not read again");
        assert_eq!(names(&d), vec![c.join("a.cache")]);
        assert_eq!(d.regions[0].owner.as_ref().unwrap().container, "main");
        // A file added, the directory's mtime set back: ctime moved.
        std::fs::write(c.join("b.cache"), b"x").unwrap();
        set_times(&c);
        assert_eq!(
            std::fs::metadata(&c).unwrap().mtime(),
            old.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
        );
        let d = discover_listed(root.path(), Bounds::NONE, &mut l).unwrap();
        assert_eq!(names(&d), vec![c.join("a.cache"), c.join("b.cache")]);
        // A directory gone is forgotten.
        std::fs::remove_dir_all(&c).unwrap();
        assert!(discover_listed(root.path(), Bounds::NONE, &mut l)
            .unwrap()
            .regions
            .is_empty());
        assert!(l.dirs.is_empty());
    }

    /// A directory full of region-like files costs a listing of the bound,
    /// not of what it holds; the rest is counted as skipped.
    #[test]
    fn a_listing_keeps_only_what_a_walk_takes() {
        let root = tempfile::tempdir().unwrap();
        let c = root.path().join("pod_main");
        std::fs::create_dir_all(&c).unwrap();
        for i in 0..50 {
            std::fs::write(c.join(format!("r{i:02}.cache")), b"x").unwrap();
        }
        let mut l = Listings::default();
        let bounds = Bounds {
            per_dir: 3,
            total: 100,
        };
        let d = discover_listed(root.path(), bounds, &mut l).unwrap();
        assert_eq!((d.regions.len(), d.skipped), (3, 47));
        assert_eq!(d.regions[0].path, c.join("r00.cache"));
        let kept = &l.dirs[&c];
        assert_eq!((kept.files.len(), kept.more), (3, 47));
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
