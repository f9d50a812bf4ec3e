//! Where the read-only region commands (`vgpu inspect`, `vgpu top`) look:
//! one file, or every container directory under a root.

use std::path::{Path, PathBuf};

use crate::regions::discover::{named_or_under, DiscoverError, Found, DEFAULT_ROOT};

#[derive(clap::Args, Debug)]
pub struct Where {
    /// A region file, or a directory to scan like --root.
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,

    /// Scan this root of HAMi container directories.
    #[arg(long, value_name = "DIR", conflicts_with = "path", default_value = DEFAULT_ROOT)]
    pub root: PathBuf,
}

impl Where {
    /// The region files named; the root they were found under (`None`:
    /// one file was named).
    pub fn find(&self) -> Result<(Vec<Found>, Option<&Path>), DiscoverError> {
        named_or_under(self.path.as_deref(), &self.root)
    }

    /// The file or directory looked at, for messages.
    pub fn shown(&self) -> &Path {
        self.path.as_deref().unwrap_or(&self.root)
    }
}
