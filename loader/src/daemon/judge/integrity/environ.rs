//! A process's own view of its limits: its initial environment
//! (`/proc/<pid>/environ`), read once per process.

use std::io::Read as _;

use vgpu_common::env::MEMORY_LIMIT;
use vgpu_common::region_place::region_place;

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
            let region = region_place(|name| expected::lookup(strs.iter().copied(), name))
                .0
                .path();
            let memory_var = strs.iter().any(|r| r.starts_with(MEMORY_LIMIT));
            OwnEnv {
                limits,
                region,
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
