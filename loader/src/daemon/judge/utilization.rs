//! Every container's SM utilization, from NVML's per-process samples (keyed
//! by host PID) and the processes the daemon has matched to a region slot.
//!
//! The HAMi region's `sm_util` is written by the hook only where it limits
//! SM (its feedback loop publishes NVML's measurement there); elsewhere it
//! stays 0 and HAMi's monitor reads 0. The daemon fills those slots, and
//! leaves the limited devices' slots to the hook so the two never fight.
//! The metric is the daemon's measurement for every container (limited or
//! not), so all containers are measured the same way.

use std::collections::HashMap;

use crate::daemon::collect::nvml::DeviceSample;
use crate::daemon::collect::region_cache::RegionKey;

/// The state file with the last scan's measurements (for `vgpu top`).
pub const FILE_NAME: &str = "utilization.json";

/// One region's measured devices, as written to [`FILE_NAME`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Measured {
    /// The region file's `st_dev` and `st_ino`: the same file whatever path
    /// names it.
    pub dev: u64,
    pub ino: u64,
    /// The path as the daemon shows it (`region` label).
    pub region: String,
    /// `(device index, percent)`.
    pub devices: Vec<(usize, u64)>,
}

/// [`FILE_NAME`]'s content.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct State {
    pub version: u32,
    pub updated_unix_ms: u64,
    pub regions: Vec<Measured>,
}

impl State {
    /// Percent for region file `(dev, ino)`'s device `index`, if measured.
    pub fn get(&self, key: RegionKey, index: usize) -> Option<u64> {
        self.regions
            .iter()
            .find(|m| (m.dev, m.ino) == key)?
            .devices
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, p)| *p)
    }
}

/// A CUDA process matched to its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotProc {
    pub host_pid: u32,
    pub region: RegionKey,
    pub slot: usize,
}

/// One scan's NVML per-process utilization, with the processes per region.
#[derive(Debug, Default)]
pub struct Utilization<'a> {
    devices: &'a [DeviceSample],
    by_region: HashMap<RegionKey, Vec<SlotProc>>,
}

impl<'a> Utilization<'a> {
    pub fn new(devices: &'a [DeviceSample], procs: impl IntoIterator<Item = SlotProc>) -> Self {
        let mut by_region: HashMap<RegionKey, Vec<SlotProc>> = HashMap::new();
        for p in procs {
            by_region.entry(p.region).or_default().push(p);
        }
        Self { devices, by_region }
    }

    /// NVML's samples for the device a region calls `uuid` (its index
    /// `index` when the region names no UUID); `None`: no such device or
    /// the query failed.
    fn samples(&self, uuid: &str, index: usize) -> Option<&'a HashMap<u32, u32>> {
        let dev = if uuid.is_empty() {
            self.devices.iter().find(|d| d.index as usize == index)
        } else {
            // The region keeps at most 40 bytes of the UUID (HAMi's label).
            self.devices.iter().find(|d| d.uuid.starts_with(uuid))
        }?;
        dev.process_util.as_ref()
    }

    /// The region's utilization of a device, percent (sum over its
    /// matched processes, capped at 100); `None` when none of its processes
    /// is matched yet or NVML cannot say.
    pub fn container(&self, region: &RegionKey, uuid: &str, index: usize) -> Option<u64> {
        let procs = self.by_region.get(region)?;
        let samples = self.samples(uuid, index)?;
        let sum: u64 = procs
            .iter()
            .map(|p| u64::from(samples.get(&p.host_pid).copied().unwrap_or(0)))
            .sum();
        Some(sum.min(100))
    }

    /// `(slot, host pid, percent)` for each of the region's matched
    /// processes on a device; empty when NVML cannot say.
    pub fn per_slot(&self, region: &RegionKey, uuid: &str, index: usize) -> Vec<(usize, u32, u64)> {
        let (Some(procs), Some(samples)) = (self.by_region.get(region), self.samples(uuid, index))
        else {
            return Vec::new();
        };
        procs
            .iter()
            .map(|p| {
                let u = samples.get(&p.host_pid).copied().unwrap_or(0);
                (p.slot, p.host_pid, u64::from(u.min(100)))
            })
            .collect()
    }
}

/// Whether the daemon writes a device's `sm_util` into the slots: only where
/// the region sets no SM limit (`rules::sm_limit`); a limited device's
/// `sm_util` belongs to the hook's feedback loop.
pub fn daemon_publishes(sm_limit: u64) -> bool {
    vgpu_common::region::rules::sm_limit(sm_limit).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(index: u32, uuid: &str, util: Option<&[(u32, u32)]>) -> DeviceSample {
        DeviceSample {
            index,
            uuid: uuid.into(),
            process_util: util.map(|u| u.iter().copied().collect()),
            ..DeviceSample::default()
        }
    }

    const A: RegionKey = (1, 10);
    const B: RegionKey = (1, 11);

    #[test]
    fn each_region_sums_its_own_processes_on_the_matching_device() {
        let devs = [
            dev(0, "GPU-aaaa", Some(&[(100, 30), (101, 25), (200, 40)])),
            dev(1, "GPU-bbbb", Some(&[(100, 90)])),
        ];
        let procs = [
            SlotProc {
                host_pid: 100,
                region: A,
                slot: 0,
            },
            SlotProc {
                host_pid: 101,
                region: A,
                slot: 1,
            },
            SlotProc {
                host_pid: 200,
                region: B,
                slot: 0,
            },
        ];
        let u = Utilization::new(&devs, procs);
        assert_eq!(u.container(&A, "GPU-aaaa", 0), Some(55));
        assert_eq!(u.container(&B, "GPU-aaaa", 0), Some(40));
        // By UUID, not by index: region device 0 may be NVML device 1.
        assert_eq!(u.container(&A, "GPU-bbbb", 0), Some(90));
        assert_eq!(u.container(&B, "GPU-bbbb", 0), Some(0));
        // No UUID in the region: the index.
        assert_eq!(u.container(&A, "", 1), Some(90));
        assert_eq!(
            u.per_slot(&A, "GPU-aaaa", 0),
            vec![(0, 100, 30), (1, 101, 25)]
        );
    }

    #[test]
    fn unknown_regions_devices_and_failed_queries_say_nothing() {
        let devs = [
            dev(0, "GPU-aaaa", None),
            dev(1, "GPU-bbbb", Some(&[(100, 200), (101, 50)])),
        ];
        let procs = [
            SlotProc {
                host_pid: 100,
                region: A,
                slot: 0,
            },
            SlotProc {
                host_pid: 101,
                region: A,
                slot: 1,
            },
        ];
        let u = Utilization::new(&devs, procs);
        assert_eq!(u.container(&A, "GPU-aaaa", 0), None);
        assert!(u.per_slot(&A, "GPU-aaaa", 0).is_empty());
        assert_eq!(u.container(&B, "GPU-bbbb", 1), None);
        assert_eq!(u.container(&A, "GPU-cccc", 0), None);
        // Capped at 100, per slot and summed.
        assert_eq!(u.container(&A, "GPU-bbbb", 1), Some(100));
        assert_eq!(
            u.per_slot(&A, "GPU-bbbb", 1),
            vec![(0, 100, 100), (1, 101, 50)]
        );
    }

    #[test]
    fn the_state_file_finds_a_region_by_its_inode() {
        let s = State {
            version: 1,
            updated_unix_ms: 5,
            regions: vec![Measured {
                dev: 1,
                ino: 10,
                region: "/r".into(),
                devices: vec![(0, 42), (2, 7)],
            }],
        };
        let back: State = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(s.get((1, 10), 0), Some(42));
        assert_eq!(s.get((1, 10), 2), Some(7));
        assert_eq!(s.get((1, 10), 1), None);
        assert_eq!(s.get((2, 10), 0), None);
    }

    #[test]
    fn limited_devices_are_left_to_the_hook() {
        assert!(daemon_publishes(0));
        assert!(daemon_publishes(100));
        assert!(daemon_publishes(150));
        assert!(!daemon_publishes(1));
        assert!(!daemon_publishes(30));
        assert!(!daemon_publishes(99));
    }
}
