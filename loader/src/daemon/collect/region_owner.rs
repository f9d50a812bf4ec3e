//! Whose series a region's are: the pod UID and container name its labels
//! carry. A label that says "pod X" must come from something no tenant can
//! forge, or a container could report its usage, or hide, under a
//! neighbour's name:
//!
//! - the kernel: the cgroup of a process using the region, whose path the
//!   kubelet and the runtime lay out as `…/pod<UID>/<container id>`;
//! - HAMi's directory `<podUID>_<ctrName>` of a region found under
//!   `--regions-root`: the device plugin creates those directories, and a
//!   container can write only inside its own.
//!
//! Never a name the tenant chose: the directory of the path its processes
//! name (`CUDA_DEVICE_MEMORY_SHARED_CACHE`) is theirs to call
//! `<another pod's UID>_<its container>`. When the kernel's view and HAMi's
//! directory disagree, the kernel wins and the container name (which only
//! the directory gives) is left out; with neither, the labels stay empty.

use crate::daemon::collect::container_identity::ContainerIdentity;
use crate::regions::discover::ContainerRef;

/// A region's pod UID and container name; empty strings when unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionOwner {
    pub pod_uid: String,
    pub container: String,
}

/// The owner of a region: `hami` is the HAMi directory it was found in
/// under `--regions-root` (never one derived from a path a process names),
/// `kernel` the cgroup identity of a process using it (default: none seen).
pub fn region_owner(hami: Option<&ContainerRef>, kernel: &ContainerIdentity) -> RegionOwner {
    match (kernel.pod_uid.as_deref(), hami) {
        (Some(uid), Some(h)) if h.pod_uid == uid => RegionOwner {
            pod_uid: uid.to_owned(),
            container: h.container.clone(),
        },
        (Some(uid), _) => RegionOwner {
            pod_uid: uid.to_owned(),
            container: String::new(),
        },
        (None, Some(h)) => RegionOwner {
            pod_uid: h.pod_uid.clone(),
            container: h.container.clone(),
        },
        (None, None) => RegionOwner::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD_A: &str = "0f9c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f";
    const POD_B: &str = "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9";
    const CID: &str = "4f1b3c0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";

    fn hami(uid: &str, ctr: &str) -> ContainerRef {
        ContainerRef {
            pod_uid: uid.into(),
            container: ctr.into(),
        }
    }

    #[test]
    fn the_kernel_decides_and_a_matching_directory_names_the_container() {
        let in_a =
            ContainerIdentity::from_cgroup_path(&format!("/kubepods/burstable/pod{POD_A}/{CID}"));
        let outside = ContainerIdentity::from_cgroup_path("/system.slice/job.scope");
        // Kernel and HAMi's directory agree: both labels.
        assert_eq!(
            region_owner(Some(&hami(POD_A, "main")), &in_a),
            RegionOwner {
                pod_uid: POD_A.into(),
                container: "main".into()
            }
        );
        // They disagree: the kernel's pod, no container name.
        assert_eq!(
            region_owner(Some(&hami(POD_B, "main")), &in_a),
            RegionOwner {
                pod_uid: POD_A.into(),
                container: String::new()
            }
        );
        // No HAMi directory: the kernel's pod alone.
        assert_eq!(region_owner(None, &in_a).pod_uid, POD_A);
        // No pod in the kernel's view (no process yet, or one outside
        // Kubernetes): the device plugin's directory.
        for id in [&ContainerIdentity::default(), &outside] {
            assert_eq!(
                region_owner(Some(&hami(POD_B, "c")), id),
                RegionOwner {
                    pod_uid: POD_B.into(),
                    container: "c".into()
                }
            );
            assert_eq!(region_owner(None, id), RegionOwner::default());
        }
    }
}
