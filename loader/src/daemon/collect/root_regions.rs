//! The regions found by listing the regions root (HAMi's container
//! directories), kept open in the region cache between listings.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::daemon::collect::region_cache::{RegionCache, RegionKey, Tenant, MAX_OPEN};
use crate::regions::discover::{discover_listed, Bounds, Listings};
use crate::regions::open::{open_under, Access};

/// The regions root is listed at most this often (a container directory is
/// read again only when it changed: [`Listings`]); a region found through a
/// process needs no listing, and a deleted one is dropped at the next
/// region pass whatever.
pub const ROOT_RELIST: Duration = Duration::from_secs(1);

/// Region files read per container directory and per scan under the
/// regions root. HAMi puts one region in each container's directory; a
/// tenant filling its directory with files must not cost the node a core
/// or push other containers' series out.
pub const SCAN_BOUNDS: Bounds = Bounds {
    per_dir: 4,
    total: MAX_OPEN,
};

/// What the listings found, across scans.
#[derive(Debug, Default)]
pub struct RootRegions {
    /// Region files left out by [`SCAN_BOUNDS`] at the last listing.
    skipped: usize,
    /// Regions opened from the regions root, by path: an open one is not
    /// opened again at every scan (a replaced file is a new inode, dropped
    /// from the cache when the old one's last name goes).
    open: HashMap<PathBuf, RegionKey>,
    listed: Option<Instant>,
    /// The container directories' last listings (an unchanged one is not
    /// read again).
    listings: Listings,
}

impl RootRegions {
    /// Region files left out by [`SCAN_BOUNDS`] at the last listing.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Opens the regions under `root` into `cache` when a listing is due
    /// ([`ROOT_RELIST`]), within [`SCAN_BOUNDS`], each below the root
    /// without following a symlink; otherwise keeps the ones it opened in
    /// use.
    pub fn collect(&mut self, root: &Path, cache: &mut RegionCache, now: Instant) {
        if self
            .listed
            .is_some_and(|t| now.duration_since(t) < ROOT_RELIST)
        {
            for key in self.open.values() {
                cache.touch(key);
            }
            return;
        }
        self.listed = Some(now);
        let Ok(found) = discover_listed(root, SCAN_BOUNDS, &mut self.listings) else {
            return;
        };
        if found.skipped != self.skipped {
            if found.skipped > 0 {
                tracing::warn!(
                    "{} region file(s) under {} left out: at most {} per container directory \
                     and {} per scan are read",
                    found.skipped,
                    root.display(),
                    SCAN_BOUNDS.per_dir,
                    SCAN_BOUNDS.total
                );
            }
            self.skipped = found.skipped;
        }
        let mut still = HashMap::with_capacity(found.regions.len());
        for f in found.regions {
            if let Some(key) = self.open.get(&f.path) {
                if cache.contains(key) {
                    cache.touch(key);
                    still.insert(f.path, *key);
                    continue;
                }
            }
            let file = match open_under(root, &f.path, Access::ReadWrite) {
                Ok(file) => file,
                Err(e) => {
                    tracing::debug!("{e}");
                    continue;
                }
            };
            // HAMi's container directory: named by the device plugin.
            let tenant = Tenant::Dir(f.path.parent().unwrap_or(root).to_owned());
            match cache.insert(file, &f.path, tenant) {
                Ok((key, r)) => {
                    // The device plugin's directory names the region,
                    // whatever path its processes opened it by first.
                    r.owner = f.owner;
                    still.insert(f.path, key);
                }
                Err(e) => tracing::debug!("{e}"),
            }
        }
        self.open = still;
    }
}
