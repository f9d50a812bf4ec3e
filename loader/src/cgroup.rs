//! cgroup v2: where it is mounted, cgroup id -> path, and the Kubernetes pod
//! UID / container id encoded in a path (cgroupfs and systemd layouts).

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// The cgroup2 mount point (`/sys/fs/cgroup` or `/sys/fs/cgroup/unified` in
/// hybrid setups), from `/proc/self/mountinfo`.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        pre.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// Kubernetes / container-runtime identity parsed from a cgroup path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerInfo {
    /// Pod UID with dashes (`0f9c…-…`).
    pub pod_uid: Option<String>,
    /// Container id (64 hex digits for containerd/CRI-O/Docker).
    pub container_id: Option<String>,
}

impl ContainerInfo {
    /// Parses a cgroup path such as
    /// `/kubepods/burstable/pod<uid>/<id>` (cgroupfs driver) or
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope`
    /// (systemd driver), also `docker-<id>.scope`, `crio-<id>.scope`, `/docker/<id>`.
    pub fn from_path(path: &str) -> ContainerInfo {
        let mut info = ContainerInfo::default();
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            let stem = comp
                .strip_suffix(".slice")
                .or_else(|| comp.strip_suffix(".scope"))
                .unwrap_or(comp);
            // Pod: "pod<uid>" (cgroupfs) or "...-pod<uid_with_underscores>" (systemd).
            if let Some(i) = stem.rfind("pod") {
                let uid = &stem[i + 3..];
                let before_ok = i == 0 || stem[..i].ends_with('-');
                if before_ok && looks_like_uid(uid) {
                    info.pod_uid = Some(uid.replace('_', "-"));
                    continue;
                }
            }
            // Container: "<runtime>-<id>.scope", or a bare id component.
            let id = stem.rsplit_once('-').map_or(stem, |(_, id)| id);
            if is_container_id(id) {
                info.container_id = Some(id.to_owned());
            }
        }
        info
    }

    /// Short form for tables: `pod/<uid8>/<cid12>`, `ctr/<cid12>`, or `-`.
    pub fn short(&self) -> String {
        let cid = self.container_id.as_deref().map(|c| &c[..c.len().min(12)]);
        match (&self.pod_uid, cid) {
            (Some(p), Some(c)) => format!("{}/{c}", &p[..p.len().min(8)]),
            (Some(p), None) => format!("{}/-", &p[..p.len().min(8)]),
            (None, Some(c)) => c.to_owned(),
            (None, None) => "-".to_owned(),
        }
    }
}

fn looks_like_uid(s: &str) -> bool {
    s.len() == 36
        && s.chars()
            .all(|c| c.is_ascii_hexdigit() || c == '-' || c == '_')
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// Maps cgroup ids (the inode numbers of cgroup2 directories, what
/// `bpf_get_current_cgroup_id()` returns) to paths under the mount.
pub struct CgroupIndex {
    root: Option<PathBuf>,
    by_id: HashMap<u64, String>,
    last_scan: Option<Instant>,
}

impl CgroupIndex {
    /// An index over the cgroup2 mount (empty when there is none).
    pub fn new() -> CgroupIndex {
        CgroupIndex {
            root: cgroup2_mount(),
            by_id: HashMap::new(),
            last_scan: None,
        }
    }

    /// The path of cgroup `id` relative to the mount (`/` for the root), rescanning
    /// the hierarchy at most once a second on a miss.
    pub fn path(&mut self, id: u64) -> Option<&str> {
        if !self.by_id.contains_key(&id)
            && self
                .last_scan
                .is_none_or(|t| t.elapsed() > Duration::from_secs(1))
        {
            self.rescan();
        }
        self.by_id.get(&id).map(String::as_str)
    }

    /// Re-reads the whole hierarchy.
    pub fn rescan(&mut self) {
        self.last_scan = Some(Instant::now());
        let Some(root) = self.root.clone() else {
            return;
        };
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            if let Ok(md) = std::fs::metadata(&dir) {
                let rel = dir.strip_prefix(&root).unwrap_or(Path::new(""));
                self.by_id.insert(md.ino(), format!("/{}", rel.display()));
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "4f1b3c0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";

    #[test]
    fn cgroupfs_layout() {
        let p = format!("/kubepods/burstable/pod0f9c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f/{CID}");
        let i = ContainerInfo::from_path(&p);
        assert_eq!(
            i.pod_uid.as_deref(),
            Some("0f9c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f")
        );
        assert_eq!(i.container_id.as_deref(), Some(CID));
    }

    #[test]
    fn systemd_layout() {
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod0f9c1d2e_3a4b_4c5d_8e6f_7a8b9c0d1e2f.slice/cri-containerd-{CID}.scope"
        );
        let i = ContainerInfo::from_path(&p);
        assert_eq!(
            i.pod_uid.as_deref(),
            Some("0f9c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f")
        );
        assert_eq!(i.container_id.as_deref(), Some(CID));
    }

    #[test]
    fn docker_and_plain() {
        let i = ContainerInfo::from_path(&format!("/system.slice/docker-{CID}.scope"));
        assert_eq!(i.container_id.as_deref(), Some(CID));
        assert_eq!(i.pod_uid, None);
        assert_eq!(
            ContainerInfo::from_path("/user.slice"),
            ContainerInfo::default()
        );
    }
}
