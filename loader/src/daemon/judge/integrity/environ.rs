//! A process's own view of its limits: its initial environment
//! (`/proc/<pid>/environ`), read once per process.

use std::io::Read as _;
use std::path::PathBuf;

use vgpu_common::env::{MEMORY_LIMIT, SHARED_CACHE, SHARED_CACHE_DEFAULT};

use super::expected::{self, Limits};
use super::{Integrity, OwnEnv};
use crate::daemon::collect::procfs::Procfs;

/// `/proc/<pid>/environ` is read up to this many bytes.
const MAX_ENVIRON: u64 = 1 << 20;

impl Integrity {
    /// What the process's own environment says (read once per process).
    pub(super) fn own_env(&mut self, pid: u32) -> Option<OwnEnv> {
        if let Some(e) = self.envs.get(&pid) {
            return e.clone();
        }
        let env = read_environ(&self.procfs, pid);
        let own = env.map(|records| {
            let strs: Vec<&str> = records.iter().map(String::as_str).collect();
            let (limits, _) = Limits::from_env(strs.iter().copied());
            let region = expected::lookup(strs.iter().copied(), SHARED_CACHE)
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| SHARED_CACHE_DEFAULT.to_owned());
            let memory_var = strs.iter().any(|r| r.starts_with(MEMORY_LIMIT));
            OwnEnv {
                limits,
                region: PathBuf::from(region),
                memory_var,
            }
        });
        self.envs.insert(pid, own.clone());
        own
    }
}

/// `/proc/<pid>/environ` as records (capped; `None` if unreadable).
fn read_environ(procfs: &Procfs, pid: u32) -> Option<Vec<String>> {
    let f = std::fs::File::open(procfs.dir(pid).join("environ")).ok()?;
    let mut raw = Vec::new();
    f.take(MAX_ENVIRON).read_to_end(&mut raw).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|r| !r.is_empty())
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .collect(),
    )
}
