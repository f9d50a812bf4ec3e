//! `--pid`, `--container`, `--pod`, `--cgroup`: which callers are shown.
//!
//! Filtering happens in user space: the probes record every process using
//! the library (the per-process maps are small), the view shows the matches.

use vgpu_common::event::Caller;

use crate::cgroup::{cgroup2_mount, CgroupIndex, ContainerInfo};

/// The selection given on the command line; empty selects everything.
pub struct Filter {
    pids: Vec<u32>,
    container: Option<String>,
    pod: Option<String>,
    cgroup_id: Option<u64>,
    cgroup_path: Option<String>,
}

impl Filter {
    /// From the parsed arguments.
    pub fn new(args: &super::Args) -> Filter {
        let (cgroup_id, cgroup_path) = match args.cgroup.as_deref() {
            None => (None, None),
            Some(s) => match s.parse::<u64>() {
                Ok(id) => (Some(id), None),
                Err(_) => (None, Some(normalize_cgroup_path(s))),
            },
        };
        Filter {
            pids: args.pid.clone(),
            container: args.container.as_ref().map(|c| c.to_ascii_lowercase()),
            pod: args.pod.as_ref().map(|p| norm_uid(p)),
            cgroup_id,
            cgroup_path,
        }
    }

    /// Does `c` pass?
    pub fn matches(&self, c: &Caller, cgroups: &mut CgroupIndex) -> bool {
        if !self.pids.is_empty()
            && !self
                .pids
                .iter()
                .any(|&p| p == c.host_tgid || p == c.host_pid || (c.ns_tgid != 0 && p == c.ns_tgid))
        {
            return false;
        }
        if self.cgroup_id.is_some_and(|id| id != c.cgroup_id) {
            return false;
        }
        if self.cgroup_path.is_none() && self.container.is_none() && self.pod.is_none() {
            return true;
        }
        let Some(path) = cgroups.path(c.cgroup_id) else {
            return false;
        };
        if let Some(want) = &self.cgroup_path {
            if !(path == want || path.starts_with(&format!("{}/", want.trim_end_matches('/')))) {
                return false;
            }
        }
        let info = ContainerInfo::from_path(path);
        if let Some(want) = &self.container {
            if !info
                .container_id
                .is_some_and(|id| id.starts_with(want.as_str()))
            {
                return false;
            }
        }
        if let Some(want) = &self.pod {
            if info.pod_uid.is_none_or(|u| norm_uid(&u) != *want) {
                return false;
            }
        }
        true
    }
}

fn norm_uid(s: &str) -> String {
    s.to_ascii_lowercase().replace('_', "-")
}

/// Accepts `/sys/fs/cgroup/x/y` as well as `/x/y` (relative to the mount).
fn normalize_cgroup_path(s: &str) -> String {
    if let Some(root) = cgroup2_mount() {
        if let Ok(rel) = std::path::Path::new(s).strip_prefix(&root) {
            return format!("/{}", rel.display());
        }
    }
    if s.starts_with('/') {
        s.to_owned()
    } else {
        format!("/{s}")
    }
}
