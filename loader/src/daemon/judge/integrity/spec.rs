//! A container's OCI runtime spec (`config.json`), where the runtime wrote
//! the environment the device plugin gave the container: containerd keeps
//! it in the task bundle, `/run/containerd/io.containerd.runtime.v2.task/
//! <namespace>/<id>/config.json`, CRI-O in `/run/containers/storage/
//! overlay-containers/<id>/userdata/config.json`. Both are root-only host
//! directories, but the file's content came from the pod, so it is read
//! as untrusted input: no symlink, a regular file, a size cap, serde.

use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Where containerd and CRI-O keep the spec (`*`: any one directory,
/// containerd's namespace; `{id}`: the container id), under
/// `vgpu_common::paths::{CONTAINERD_TASKS_DIR, CRIO_CONTAINERS_DIR}`,
/// which the DaemonSet mounts.
pub const DEFAULT_SPECS: [&str; 2] = [
    "/run/containerd/io.containerd.runtime.v2.task/*/{id}/config.json",
    "/run/containers/storage/overlay-containers/{id}/userdata/config.json",
];

/// A spec larger than this is refused (real ones are tens of KiB).
pub const MAX_SPEC_BYTES: u64 = 4 << 20;
/// Directories a `*` looks at, at most.
const MAX_GLOB_ENTRIES: usize = 64;

/// Why a spec could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a regular file")]
    NotRegular { path: PathBuf },
    #[error("{path} is larger than {MAX_SPEC_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not an OCI runtime spec: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// A bad `--runtime-spec` pattern.
#[derive(Debug, thiserror::Error)]
#[error("runtime spec pattern {0:?}: expected an absolute path with {{id}} in one component, e.g. {first}", first = DEFAULT_SPECS[0])]
pub struct PatternError(String);

/// A `--runtime-spec` pattern: path components, where `*` is any one
/// directory and `{id}` the container id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecPattern {
    parts: Vec<String>,
}

impl FromStr for SpecPattern {
    type Err = PatternError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PatternError(s.to_owned());
        let rest = s.strip_prefix('/').ok_or_else(bad)?;
        let parts: Vec<String> = rest
            .split('/')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect();
        let ok =
            parts.iter().any(|p| p.contains("{id}")) && parts.iter().all(|p| p != ".." && p != ".");
        ok.then_some(SpecPattern { parts }).ok_or_else(bad)
    }
}

impl SpecPattern {
    /// Existing files the pattern names for container `id`.
    pub fn candidates(&self, id: &str) -> Vec<PathBuf> {
        if !valid_id(id) {
            return Vec::new();
        }
        let mut paths = vec![PathBuf::from("/")];
        for part in &self.parts {
            let mut next = Vec::new();
            for dir in &paths {
                if part == "*" {
                    let Ok(entries) = std::fs::read_dir(dir) else {
                        continue;
                    };
                    next.extend(
                        entries
                            .flatten()
                            .take(MAX_GLOB_ENTRIES)
                            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                            .map(|e| e.path()),
                    );
                } else {
                    next.push(dir.join(part.replace("{id}", id)));
                }
            }
            paths = next;
        }
        paths.retain(|p| p.symlink_metadata().is_ok());
        paths
    }
}

/// Container ids are hex (64 digits for containerd, CRI-O and Docker).
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The first spec of container `id` that `patterns` name: its path and
/// `process.env`. `Ok(None)`: none exists.
pub fn find(
    patterns: &[SpecPattern],
    id: &str,
) -> Result<Option<(PathBuf, Vec<String>)>, SpecError> {
    for p in patterns {
        if let Some(path) = p.candidates(id).into_iter().next() {
            let env = read_env(&path)?;
            return Ok(Some((path, env)));
        }
    }
    Ok(None)
}

#[derive(serde::Deserialize)]
struct Spec {
    #[serde(default)]
    process: Option<Process>,
}

#[derive(serde::Deserialize)]
struct Process {
    #[serde(default)]
    env: Vec<String>,
}

/// `process.env` of the spec at `path`.
pub fn read_env(path: &Path) -> Result<Vec<String>, SpecError> {
    let file = File::options()
        .read(true)
        // No symlink at the end, and never block on a FIFO.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| SpecError::Open {
            path: path.to_owned(),
            source,
        })?;
    // Type and size of what was opened, not of a path checked before.
    let md = file.metadata().map_err(|source| SpecError::Read {
        path: path.to_owned(),
        source,
    })?;
    if !md.is_file() {
        return Err(SpecError::NotRegular {
            path: path.to_owned(),
        });
    }
    if md.len() > MAX_SPEC_BYTES {
        return Err(SpecError::TooLarge {
            path: path.to_owned(),
        });
    }
    let mut text = Vec::new();
    file.take(MAX_SPEC_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|source| SpecError::Read {
            path: path.to_owned(),
            source,
        })?;
    if text.len() as u64 > MAX_SPEC_BYTES {
        return Err(SpecError::TooLarge {
            path: path.to_owned(),
        });
    }
    let spec: Spec = serde_json::from_slice(&text).map_err(|source| SpecError::Parse {
        path: path.to_owned(),
        source,
    })?;
    Ok(spec.process.map(|p| p.env).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "4f1b3c0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";

    #[test]
    fn defaults_are_under_the_mounted_runtime_dirs() {
        use vgpu_common::paths::{CONTAINERD_TASKS_DIR, CRIO_CONTAINERS_DIR};
        assert!(DEFAULT_SPECS[0].starts_with(&format!("{CONTAINERD_TASKS_DIR}/")));
        assert!(DEFAULT_SPECS[1].starts_with(&format!("{CRIO_CONTAINERS_DIR}/")));
    }

    #[test]
    fn patterns_are_checked() {
        for good in DEFAULT_SPECS {
            assert!(good.parse::<SpecPattern>().is_ok(), "{good}");
        }
        for bad in [
            "run/{id}/config.json",
            "/run/x/config.json",
            "/run/../{id}/c",
        ] {
            assert!(bad.parse::<SpecPattern>().is_err(), "{bad}");
        }
    }

    #[test]
    fn finds_the_spec_under_any_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("task/k8s.io").join(CID);
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::create_dir_all(dir.path().join("task/moby")).unwrap();
        std::fs::write(
            bundle.join("config.json"),
            r#"{"ociVersion":"1.1.0","process":{"args":["x"],"env":["A=1","CUDA_DEVICE_MEMORY_LIMIT=1g"]},"root":{"path":"rootfs"}}"#,
        )
        .unwrap();
        let pats = [
            format!("{}/crio/{{id}}/userdata/config.json", dir.path().display())
                .parse::<SpecPattern>()
                .unwrap(),
            format!("{}/task/*/{{id}}/config.json", dir.path().display())
                .parse::<SpecPattern>()
                .unwrap(),
        ];
        let (path, env) = find(&pats, CID).unwrap().unwrap();
        assert_eq!(path, bundle.join("config.json"));
        assert_eq!(env, ["A=1", "CUDA_DEVICE_MEMORY_LIMIT=1g"]);
        assert!(find(&pats, &CID.replace('4', "5")).unwrap().is_none());
        // An id that is not hex names nothing (no path tricks).
        assert!(pats[1].candidates("../../etc").is_empty());
    }

    #[test]
    fn hostile_specs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.json");
        std::fs::write(
            &target,
            r#"{"process":{"env":["CUDA_DEVICE_MEMORY_LIMIT=1g"]}}"#,
        )
        .unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(read_env(&link), Err(SpecError::Open { .. })));
        let fifo = dir.path().join("fifo.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(read_env(&fifo), Err(SpecError::NotRegular { .. })));
        assert!(matches!(
            read_env(dir.path()),
            Err(SpecError::NotRegular { .. })
        ));
        let big = dir.path().join("big.json");
        let f = File::create(&big).unwrap();
        f.set_len(MAX_SPEC_BYTES + 1).unwrap();
        assert!(matches!(read_env(&big), Err(SpecError::TooLarge { .. })));
        let junk = dir.path().join("junk.json");
        std::fs::write(&junk, "{\"process\":{\"env\":[1]}}").unwrap();
        assert!(matches!(read_env(&junk), Err(SpecError::Parse { .. })));
        std::fs::write(&junk, "{}").unwrap();
        assert_eq!(read_env(&junk).unwrap(), Vec::<String>::new());
    }
}
