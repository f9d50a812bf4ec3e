//! Which container a process is in: cgroup id (from the probes) -> cgroup
//! path (a walk of the cgroup2 mount, `/sys/fs/cgroup` or the hybrid
//! `/sys/fs/cgroup/unified`) -> Kubernetes pod UID and container id.
//! The path parsing is `crate::cgroup::ContainerInfo`; this adds the cache
//! the daemon needs.

use crate::cgroup::{CgroupIndex, ContainerInfo};
use crate::daemon::collect::procfs::Procfs;

/// A process's container, as far as its cgroup tells.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerIdentity {
    /// Path under the cgroup2 mount (`/kubepods/...`); empty if unknown.
    pub cgroup: String,
    pub pod_uid: Option<String>,
    pub container_id: Option<String>,
}

impl ContainerIdentity {
    /// Parses a cgroup path (cgroupfs and systemd layouts, docker/cri-o/containerd).
    pub fn from_cgroup_path(path: &str) -> ContainerIdentity {
        let info = ContainerInfo::from_path(path);
        ContainerIdentity {
            cgroup: path.to_owned(),
            pod_uid: info.pod_uid,
            container_id: info.container_id,
        }
    }
}

/// cgroup id -> identity, rescanning the hierarchy on a miss (at most once a second).
pub struct ContainerIdentities {
    index: CgroupIndex,
}

impl Default for ContainerIdentities {
    fn default() -> Self {
        Self {
            index: CgroupIndex::new(),
        }
    }
}

impl ContainerIdentities {
    /// The identity of cgroup `id` (empty when the id is unknown or 0).
    pub fn of(&mut self, id: u64) -> ContainerIdentity {
        if id == 0 {
            return ContainerIdentity::default();
        }
        self.index
            .path(id)
            .map(ContainerIdentity::from_cgroup_path)
            .unwrap_or_default()
    }

    /// The identity of host process `pid` with probe cgroup id `cgroup_id`;
    /// without one (a process only NVML listed), from its `0::/path` line
    /// in `/proc/<pid>/cgroup`.
    pub fn of_process(&mut self, procfs: &Procfs, pid: u32, cgroup_id: u64) -> ContainerIdentity {
        let id = self.of(cgroup_id);
        if !id.cgroup.is_empty() {
            return id;
        }
        std::fs::read_to_string(procfs.dir(pid).join("cgroup"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
            })
            .map(|p| ContainerIdentity::from_cgroup_path(&p))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f9c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f";
    const CID: &str = "4f1b3c0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";

    #[test]
    fn cgroupfs_driver_layouts() {
        for qos in ["", "burstable/", "besteffort/"] {
            let p = format!("/kubepods/{qos}pod{UID}/{CID}");
            let id = ContainerIdentity::from_cgroup_path(&p);
            assert_eq!(id.pod_uid.as_deref(), Some(UID), "{p}");
            assert_eq!(id.container_id.as_deref(), Some(CID), "{p}");
            assert_eq!(id.cgroup, p);
        }
    }

    #[test]
    fn systemd_driver_layouts() {
        let uid_ = UID.replace('-', "_");
        for (qos, runtime) in [
            ("burstable", "cri-containerd"),
            ("besteffort", "crio"),
            ("burstable", "docker"),
        ] {
            let p = format!(
                "/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid_}.slice/{runtime}-{CID}.scope"
            );
            let id = ContainerIdentity::from_cgroup_path(&p);
            assert_eq!(id.pod_uid.as_deref(), Some(UID), "{p}");
            assert_eq!(id.container_id.as_deref(), Some(CID), "{p}");
        }
        // Guaranteed pods sit directly under kubepods.slice.
        let p = format!("/kubepods.slice/kubepods-pod{uid_}.slice/cri-containerd-{CID}.scope");
        assert_eq!(
            ContainerIdentity::from_cgroup_path(&p).pod_uid.as_deref(),
            Some(UID)
        );
    }

    #[test]
    fn non_kubernetes_paths() {
        let id = ContainerIdentity::from_cgroup_path(&format!("/system.slice/docker-{CID}.scope"));
        assert_eq!((id.pod_uid, id.container_id.as_deref()), (None, Some(CID)));
        let id = ContainerIdentity::from_cgroup_path("/user.slice/user-0.slice/session-1.scope");
        assert_eq!((id.pod_uid, id.container_id), (None, None));
        assert_eq!(
            ContainerIdentities::default().of(0),
            ContainerIdentity::default()
        );
    }
}
