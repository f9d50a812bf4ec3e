//! Names for the device of a context call: the CUDA ordinal the probe
//! recorded, the device's UUID and its index in the caller's container
//! (the rule is `vgpu_common::devices::process_devices`).
//!
//! A process's ordinals depend on its environment, read once per process
//! from `/proc/<host pid>/environ`. That file is the tenant's: it is read
//! bounded, and whatever it holds can only mislabel that process's own
//! lines. It shows the environment the process was started with; a
//! variable the process sets on itself later is not seen.

use std::{collections::HashMap, io::Read as _, path::Path};

use vgpu_common::{
    devices::{environ_value, process_devices, OrdinalDevice},
    env::{CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES},
    proc_identity::start_time,
};

/// Bytes of `/proc/<pid>/environ` read at most. The variables are looked
/// for in that much; one past it counts as unset.
const ENVIRON_MAX: u64 = 256 << 10;

/// Processes remembered at once; past it the memory starts over.
const PROCS_MAX: usize = 4096;

/// One device as a trace line names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    /// The `CUdevice` argument: a CUDA ordinal of the calling process.
    pub ordinal: i32,
    /// The device it is, when known (NVML present, environment readable,
    /// the ordinal names a device).
    pub device: Option<OrdinalDevice>,
}

impl Label {
    /// The table's name for it: the container index, else the ordinal
    /// as `c<ordinal>`.
    pub fn short(&self) -> String {
        match &self.device {
            Some(d) => d.index.to_string(),
            None => format!("c{}", self.ordinal),
        }
    }
}

/// A process's devices, by ordinal, and the start time they belong to.
struct Known {
    start: Option<u64>,
    devices: Vec<OrdinalDevice>,
}

/// Names devices, caching each process's devices.
#[derive(Default)]
pub struct DeviceNames {
    /// The host's device UUIDs in NVML order: `None` until first needed,
    /// `Some(None)` without NVML.
    host: Option<Option<Vec<String>>>,
    procs: HashMap<u32, Known>,
}

impl DeviceNames {
    /// Nothing loaded yet; NVML is asked at the first label.
    pub fn new() -> DeviceNames {
        DeviceNames::default()
    }

    /// Names CUDA ordinal `ordinal` of host process `tgid`.
    pub fn label(&mut self, tgid: u32, ordinal: i32) -> Label {
        let device = usize::try_from(ordinal)
            .ok()
            .and_then(|o| self.devices_of(tgid)?.get(o).cloned());
        Label { ordinal, device }
    }

    /// Forgets process `tgid` (it has exited).
    pub fn forget(&mut self, tgid: u32) {
        self.procs.remove(&tgid);
    }

    fn devices_of(&mut self, tgid: u32) -> Option<&[OrdinalDevice]> {
        let host = self.host.get_or_insert_with(host_uuids).as_deref()?;
        let dir = Path::new("/proc").join(tgid.to_string());
        let start = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|s| start_time(&s));
        // A pid taken by a new process (another start time) is read afresh;
        // one that has exited keeps what was read while it ran.
        let stale = self
            .procs
            .get(&tgid)
            .is_none_or(|k| start.is_some() && k.start != start);
        if stale {
            if self.procs.len() >= PROCS_MAX {
                self.procs.clear();
            }
            let devices = read_bounded(&dir.join("environ"), ENVIRON_MAX)
                .map(|env| {
                    process_devices(
                        host,
                        environ_value(&env, NVIDIA_VISIBLE_DEVICES).as_deref(),
                        environ_value(&env, CUDA_VISIBLE_DEVICES).as_deref(),
                    )
                })
                .unwrap_or_default();
            self.procs.insert(tgid, Known { start, devices });
        }
        self.procs.get(&tgid).map(|k| k.devices.as_slice())
    }
}

/// The host's device UUIDs in NVML index order; `None` without NVML (or
/// when a device cannot be named, since every later one's position would
/// then be wrong).
fn host_uuids() -> Option<Vec<String>> {
    let nvml = match nvml_wrapper::Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            tracing::info!("NVML unavailable ({e}): devices are shown as CUDA ordinals only");
            return None;
        }
    };
    let named = nvml.device_count().and_then(|n| {
        (0..n)
            .map(|i| nvml.device_by_index(i).and_then(|d| d.uuid()))
            .collect::<Result<Vec<_>, _>>()
    });
    match named {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::info!(
                "NVML cannot name every device ({e}): devices are shown as CUDA ordinals only"
            );
            None
        }
    }
}

/// At most `max` bytes of `path`; `None` if it cannot be opened or read.
fn read_bounded(path: &Path, max: u64) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max).read_to_end(&mut buf))
        .ok()?;
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_stops_at_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("environ");
        std::fs::write(&p, vec![b'x'; 1000]).unwrap();
        assert_eq!(read_bounded(&p, 100).unwrap().len(), 100);
        assert_eq!(read_bounded(&p, 5000).unwrap().len(), 1000);
        assert_eq!(read_bounded(&dir.path().join("none"), 10), None);
    }

    #[test]
    fn an_unknown_device_is_shown_by_its_ordinal() {
        let l = Label {
            ordinal: 3,
            device: None,
        };
        assert_eq!(l.short(), "c3");
        let l = Label {
            ordinal: 0,
            device: Some(OrdinalDevice {
                uuid: "GPU-x".into(),
                index: 1,
            }),
        };
        assert_eq!(l.short(), "1");
    }

    #[test]
    fn a_process_is_labelled_from_its_own_environment() {
        let host: Vec<String> = ["GPU-aaaa-0", "GPU-bbbb-1"].map(String::from).to_vec();
        let mut names = DeviceNames {
            host: Some(Some(host)),
            procs: HashMap::new(),
        };
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env_clear()
            .env("CUDA_VISIBLE_DEVICES", "1")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Until exec, /proc shows the parent's environment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default()
            != b"CUDA_VISIBLE_DEVICES=1\0"
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let l = names.label(pid, 0);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            l.device,
            Some(OrdinalDevice {
                uuid: "GPU-bbbb-1".into(),
                index: 1
            })
        );
        assert_eq!(l.short(), "1");
        // Ordinal 1 does not exist for it; a negative one never does.
        assert_eq!(names.label(pid, 1).short(), "c1");
        assert_eq!(names.label(pid, -1).device, None);
        // What was read while it ran stays after it exited.
        assert_eq!(names.label(pid, 0).short(), "1");
        names.forget(pid);
        assert_eq!(names.label(pid, 0).short(), "c0", "gone and forgotten");
    }

    #[test]
    fn without_nvml_only_the_ordinal_is_known() {
        let mut names = DeviceNames {
            host: Some(None),
            procs: HashMap::new(),
        };
        let l = names.label(std::process::id(), 0);
        assert_eq!((l.ordinal, l.device), (0, None));
    }
}
