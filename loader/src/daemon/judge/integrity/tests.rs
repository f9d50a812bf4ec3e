//! The checker end to end over a fake /proc, spec and regions.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

use vgpu_common::region::MAX_DEVICES;

use super::decide::Policy;
use super::expected::Limits;
use super::overrides::{self, FileKey};
use super::{Config, Integrity, ProcInput, RegionAccess};
use crate::daemon::collect::container_identity::ContainerIdentity;
use crate::daemon::collect::nvml::DeviceSample;
use crate::daemon::collect::procfs::Procfs;
use crate::daemon::state::findings::{Kind, LimitMismatch, LimitName};

const G: u64 = 1 << 30;
const CID: &str = "4f1b3c0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";

/// Regions in memory.
struct Fake(RefCell<HashMap<FileKey, Limits>>);

impl RegionAccess for Fake {
    fn limits(&self, key: &FileKey) -> Option<Limits> {
        self.0.borrow().get(key).copied()
    }
    fn shown(&self, key: &FileKey) -> Option<PathBuf> {
        Some(PathBuf::from(format!("/r/{}", key.1)))
    }
    fn restore(&self, key: &FileKey, m: &[LimitMismatch]) -> usize {
        let mut map = self.0.borrow_mut();
        let Some(l) = map.get_mut(key) else { return 0 };
        for x in m {
            match x.limit {
                LimitName::MemoryBytes => l.mem[x.device] = x.expected,
                LimitName::SmPercent => l.sm[x.device] = x.expected,
            }
        }
        m.len()
    }
}

fn limits(mem: u64) -> Limits {
    Limits {
        mem: [mem; MAX_DEVICES],
        sm: [vgpu_common::region::rules::SM_UNLIMITED; MAX_DEVICES],
    }
}

#[test]
fn one_container_through_tampering_an_admin_change_and_excess() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The container's region (a real file: admin records bind to it).
    std::fs::create_dir_all(d.join("ctr/r")).unwrap();
    std::fs::write(d.join("ctr/r/a.cache"), b"r").unwrap();
    let md = std::fs::metadata(d.join("ctr/r/a.cache")).unwrap();
    let key = (md.dev(), md.ino());
    // Its spec, and two processes in a fake /proc.
    let bundle = d.join("task/k8s.io").join(CID);
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("config.json"),
        r#"{"process":{"env":["CUDA_DEVICE_MEMORY_LIMIT=1g","CUDA_DEVICE_MEMORY_SHARED_CACHE=/r/a.cache"]}}"#,
    )
    .unwrap();
    for (pid, env) in [
        (
            10,
            "CUDA_DEVICE_MEMORY_LIMIT=1g\0CUDA_DEVICE_MEMORY_SHARED_CACHE=/r/a.cache\0",
        ),
        (11, "CUDA_DEVICE_MEMORY_SHARED_CACHE=/r/a.cache\0"),
    ] {
        let p = d.join("proc").join(pid.to_string());
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("environ"), env).unwrap();
        std::os::unix::fs::symlink(d.join("ctr"), p.join("root")).unwrap();
    }
    let state = d.join("state");
    let pattern = format!("{}/task/*/{{id}}/config.json", d.display());
    let mut integ = Integrity::new(
        Config {
            specs: vec![pattern.parse().unwrap()],
            state_dir: state.clone(),
            policy: Policy::Restore,
        },
        Procfs::at(d.join("proc")),
    );
    let id = ContainerIdentity {
        cgroup: format!("/kubepods/pod0f9c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f/{CID}"),
        pod_uid: None,
        container_id: Some(CID.to_owned()),
    };
    let proc_in = |pid, probe| ProcInput {
        pid,
        ns_pid: 1,
        comm: "python".into(),
        identity: &id,
        region: Some(key),
        unhooked: false,
        probe_bytes: Some(probe),
        nvml_bytes: None,
        tracked_bytes: probe,
    };
    let regions = Fake(RefCell::new([(key, limits(G))].into_iter().collect()));
    let good = [proc_in(10, G / 2)];
    assert!(integ.scan(&good, &regions, &[], 1).is_empty());

    // The tenant raises device 0: reported and written back.
    regions.0.borrow_mut().get_mut(&key).unwrap().mem[0] = 64 * G;
    let f = integ.scan(&good, &regions, &[], 2);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, Kind::LimitTampered);
    assert_eq!(f[0].limits.len(), 1);
    assert_eq!(f[0].action.as_deref(), Some("restored"));
    assert_eq!(f[0].since_unix_ms, 2);
    assert_eq!(regions.limits(&key).unwrap().mem[0], G);
    assert!(integ.scan(&good, &regions, &[], 3).is_empty(), "cleared");

    // An admin raises it: recorded, so not a finding and not undone.
    overrides::record(
        &state,
        &d.join("ctr/r/a.cache"),
        key,
        overrides::Changed::Memory,
        &[0],
        2 * G,
    )
    .unwrap();
    regions.0.borrow_mut().get_mut(&key).unwrap().mem[0] = 2 * G;
    assert!(integ.scan(&good, &regions, &[], 4).is_empty());
    assert_eq!(regions.limits(&key).unwrap().mem[0], 2 * G);

    // A process without the variable: reported, not killed (restore).
    let both = [proc_in(10, G / 2), proc_in(11, 0)];
    let f = integ.scan(&both, &regions, &[], 5);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!((f[0].kind, f[0].pid), (Kind::UnlimitedProcess, 11));
    assert_eq!(f[0].action, None);

    // Past the limit by the kernel's count (the admin's 2 GiB on
    // device 0 of one), for two scans.
    let heavy = [proc_in(10, 2 * G + 1)];
    assert!(integ.scan(&heavy, &regions, &[], 6).is_empty());
    let f = integ.scan(&heavy, &regions, &[], 7);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!((f[0].kind, f[0].pid), (Kind::OverLimit, 0));
    let fine = [proc_in(10, 2 * G)];
    assert!(integ.scan(&fine, &regions, &[], 8).is_empty());

    // Memory the probes never saw (an unprobed libcuda) counts by NVML's
    // count of each GPU, at once: the driver's count is what is held.
    let gpu = |index, mem: &[(u32, u64)]| DeviceSample {
        index,
        process_memory: mem.iter().copied().collect(),
        ..DeviceSample::default()
    };
    let mut hidden = proc_in(10, G / 2);
    hidden.nvml_bytes = Some(3 * G);
    let hidden = [hidden];
    let f = integ.scan(&hidden, &regions, &[gpu(0, &[(10, 3 * G)])], 20);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, Kind::OverLimit);
    assert_eq!(
        (f[0].probe_bytes, f[0].nvml_bytes),
        (Some(G / 2), Some(3 * G))
    );
    assert_eq!(
        f[0].limits,
        vec![LimitMismatch {
            device: 0,
            limit: LimitName::MemoryBytes,
            expected: 2 * G,
            found: 3 * G
        }]
    );
    // On a node of two GPUs it is still past device 0's limit (2 GiB, the
    // admin's), though under the 3 GiB of both together.
    let two = [gpu(0, &[(10, 3 * G)]), gpu(1, &[])];
    let f = integ.scan(&hidden, &regions, &two, 21);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].limits[0].device, 0);
    // Spread within each GPU's limit: fine.
    let spread = [gpu(0, &[(10, 2 * G)]), gpu(1, &[(10, G)])];
    assert!(integ.scan(&hidden, &regions, &spread, 22).is_empty());

    // A container without a spec is not checked.
    let other = ContainerIdentity {
        container_id: Some(CID.replace('4', "5")),
        ..id.clone()
    };
    let mut p = proc_in(11, 64 * G);
    p.identity = &other;
    assert!(integ.scan(&[p], &regions, &[], 9).is_empty());
}
