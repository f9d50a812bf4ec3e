//! Pod namespace and name by pod UID, for HAMi's metric labels, without
//! the API server: the kubelet keeps one log directory per pod on every
//! node, named `<namespace>_<pod>_<podUID>` (`/var/log/pods`). Only the
//! names are read. Namespace and pod names are DNS names (no `_`), so the
//! name splits unambiguously; anything else there is skipped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A pod's namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodName {
    pub namespace: String,
    pub pod: String,
}

/// The directory's pods by UID, read again at most once per `min_age`.
#[derive(Debug)]
pub struct PodNames {
    dir: PathBuf,
    by_uid: HashMap<String, PodName>,
    read_at: Option<Instant>,
    min_age: Duration,
    warned: bool,
}

/// DNS-1123 names (namespace: label, pod: subdomain).
fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

fn is_uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// `<namespace>_<pod>_<uid>` -> (uid, name).
fn parse(dir_name: &str) -> Option<(String, PodName)> {
    let mut parts = dir_name.split('_');
    let (namespace, pod, uid) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !is_dns_name(namespace) || !is_dns_name(pod) || !is_uid(uid) {
        return None;
    }
    Some((
        uid.to_owned(),
        PodName {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
        },
    ))
}

impl PodNames {
    /// Pods of `dir` (the kubelet's `/var/log/pods`).
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            by_uid: HashMap::new(),
            read_at: None,
            min_age: Duration::from_secs(1),
            warned: false,
        }
    }

    /// Reads the directory again unless it was read within a second.
    pub fn refresh(&mut self) {
        if self.read_at.is_some_and(|t| t.elapsed() < self.min_age) {
            return;
        }
        self.read_at = Some(Instant::now());
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                if !self.warned {
                    tracing::warn!(
                        "pod names for metrics unavailable: reading {}: {e}",
                        self.dir.display()
                    );
                    self.warned = true;
                }
                return;
            }
        };
        self.warned = false;
        self.by_uid = entries
            .filter_map(Result::ok)
            .filter_map(|e| parse(e.file_name().to_str()?))
            .collect();
    }

    /// Pods named from a list rather than a directory (tests of what
    /// carries their names).
    #[cfg(test)]
    pub fn from_names(names: impl IntoIterator<Item = (String, PodName)>) -> Self {
        Self {
            by_uid: names.into_iter().collect(),
            ..Self::new(PathBuf::new())
        }
    }

    /// The pod with this UID, if its directory was there at the last read.
    pub fn get(&self, uid: &str) -> Option<&PodName> {
        self.by_uid.get(uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f9c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f";

    #[test]
    fn kubelet_names_parse_and_others_do_not() {
        let (uid, p) = parse(&format!("ml-team_trainer-7d9f-abcde_{UID}")).unwrap();
        assert_eq!(uid, UID);
        assert_eq!(p.namespace, "ml-team");
        assert_eq!(p.pod, "trainer-7d9f-abcde");
        for bad in [
            format!("ns_pod_{UID}_extra"),
            format!("ns__{UID}"),
            format!("Ns_pod_{UID}"),
            "ns_pod_not-a-uid!".to_owned(),
            "ns_pod".to_owned(),
            format!("ns_po\"d_{UID}"),
        ] {
            assert!(parse(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn reads_the_directory_and_sees_new_pods_after_a_second() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join(format!("default_a_{UID}"))).unwrap();
        std::fs::create_dir(d.path().join("junk")).unwrap();
        let mut pods = PodNames::new(d.path().to_owned());
        pods.refresh();
        assert_eq!(pods.get(UID).map(|p| p.pod.as_str()), Some("a"));
        std::fs::create_dir(d.path().join("kube-system_b_1234")).unwrap();
        pods.min_age = Duration::ZERO;
        pods.refresh();
        assert_eq!(
            pods.get("1234").map(|p| p.namespace.as_str()),
            Some("kube-system")
        );
        let mut missing = PodNames::new(d.path().join("none"));
        missing.refresh();
        assert!(missing.get(UID).is_none());
    }
}
