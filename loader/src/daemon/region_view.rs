//! What the metrics show of each open region (one container): its labels,
//! its per-device sums and launches, its utilization, and its dead slots.

use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::region::{status, SharedRegion, MAX_DEVICES};

use super::identity::{Identities, Identity};
use super::launches::Ledger;
use super::metrics::{Labels, RegionDevice, RegionView};
use super::pods::{PodName, PodNames};
use super::region_cache::RegionCache;
use super::region_owner::{region_owner, RegionOwner};
use super::utilization::{daemon_publishes, Measured, Utilization};
use crate::regions::liveness::Mappers;

/// A region's labels: HAMi's monitor's first (namespace, pod, container;
/// the device's `vdevice_index` and `device_uuid` follow per device), then
/// vgpu's. `name` is the pod's, `owner` says whose the region is
/// ([`region_owner`]), `id` is the cgroup identity of a process using it.
pub fn labels(name: Option<&PodName>, owner: RegionOwner, id: &Identity, region: &Path) -> Labels {
    vec![
        (
            "namespace".to_owned(),
            name.map(|n| n.namespace.clone()).unwrap_or_default(),
        ),
        (
            "pod".to_owned(),
            name.map(|n| n.pod.clone()).unwrap_or_default(),
        ),
        ("container".to_owned(), owner.container),
        ("pod_uid".to_owned(), owner.pod_uid),
        (
            "container_id".to_owned(),
            id.container_id.clone().unwrap_or_default(),
        ),
        ("cgroup".to_owned(), id.cgroup.clone()),
        ("region".to_owned(), region.display().to_string()),
    ]
}

/// One view per open, initialised region of `cache`, and each container's
/// measured utilization: labels (`ids`, `pods`), per-device sums, launches
/// (`launches` keeps them monotonic) and the utilization `util` gives, which
/// is also written into the slots of devices the region does not SM-limit.
pub fn views(
    cache: &RegionCache,
    ids: &mut Identities,
    pods: &PodNames,
    launches: &mut Ledger,
    util: &Utilization<'_>,
) -> (Vec<RegionView>, Vec<Measured>) {
    let mut views = Vec::new();
    let mut measured = Vec::new();
    launches.begin_scan();
    for (key, r) in cache.iter() {
        let Some(region) = r.last_snapshot() else {
            continue;
        };
        if !region.is_initialized() {
            continue;
        }
        let id = r.cgroup_id.map(|c| ids.of(c)).unwrap_or_default();
        let owner = region_owner(r.owner.as_ref(), &id);
        let name = pods.get(&owner.pod_uid);
        let labels = labels(name, owner, &id, &r.shown_path);
        let mut devices = devices(region);
        let counted = launches.observe(*key, region);
        let mut m = Measured {
            dev: key.0,
            ino: key.1,
            region: r.shown_path.display().to_string(),
            devices: Vec::new(),
        };
        for d in &mut devices {
            d.launches = counted.get(d.index).copied().unwrap_or(0);
            if let Some(u) = util.container(key, &d.uuid, d.index) {
                d.sm_util = u;
                m.devices.push((d.index, u));
            }
            if daemon_publishes(d.sm_limit) {
                for (slot, host_pid, pct) in util.per_slot(key, &d.uuid, d.index) {
                    if let Err(e) = r.write_sm_util(slot, host_pid, d.index, pct) {
                        tracing::debug!("{e}");
                    }
                }
            }
        }
        if !m.devices.is_empty() {
            measured.push(m);
        }
        views.push(RegionView {
            labels,
            devices,
            dead_slots: dead_slots(region),
            last_kernel_time: region.last_kernel_time.load(SeqCst),
        });
    }
    launches.end_scan();
    views.sort_by(|a, b| a.labels.cmp(&b.labels));
    measured.sort_by(|a, b| a.region.cmp(&b.region));
    (views, measured)
}

/// Per-device sums over slots with status != 0, as HAMi's monitor makes them.
pub fn devices(region: &SharedRegion) -> Vec<RegionDevice> {
    let device_num = region.device_num.load(SeqCst).min(MAX_DEVICES as u64) as usize;
    let mut devs: Vec<RegionDevice> = (0..MAX_DEVICES)
        .map(|d| {
            let (uuid, len) = region.uuid(d);
            RegionDevice {
                index: d,
                uuid: String::from_utf8_lossy(&uuid[..len])
                    .chars()
                    .take(40)
                    .collect(),
                limit: region.limit[d].load(SeqCst),
                sm_limit: region.sm_limit[d].load(SeqCst),
                ..RegionDevice::default()
            }
        })
        .collect();
    for s in region.active_slots() {
        if s.status.load(SeqCst) == status::EXITED {
            continue;
        }
        for (d, dev) in devs.iter_mut().enumerate() {
            let m = &s.used[d];
            dev.total = dev.total.saturating_add(m.total.load(SeqCst));
            dev.context = dev.context.saturating_add(m.context_size.load(SeqCst));
            dev.module = dev.module.saturating_add(m.module_size.load(SeqCst));
            dev.data = dev.data.saturating_add(m.data_size.load(SeqCst));
            dev.sm_util = dev
                .sm_util
                .saturating_add(s.device_util[d].sm_util.load(SeqCst));
        }
    }
    devs.retain(|d| d.index < device_num || d.total != 0 || d.limit != 0);
    devs
}

/// Slots in use whose process is certainly gone, judged by host PID alone
/// (the region's `hostpid` is the tenant's to write: a wrong one only
/// miscounts its own container).
pub fn dead_slots(region: &SharedRegion) -> u64 {
    let none = Mappers::none();
    region
        .active_slots()
        .iter()
        .filter(|s| s.pid.load(SeqCst) != 0 && s.status.load(SeqCst) != status::EXITED)
        .filter(|s| none.slot_liveness(s).is_certainly_dead())
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;
    use vgpu_common::region_io::RegionSnapshot;

    /// Sums count slots that are not exited, as HAMi's monitor does; a
    /// device shows when the region has it, or has usage or a limit on it.
    /// A slot whose host PID is gone is a dead slot.
    #[test]
    fn devices_sum_live_slots_and_dead_slots_are_counted() {
        let r = RegionSnapshot::zeroed();
        r.device_num.store(1, Relaxed);
        r.set_uuid(0, b"GPU-0");
        r.limit[2].store(1 << 30, Relaxed);
        r.proc_num.store(3, Relaxed);
        let me = std::process::id() as i32;
        let gone = {
            let mut c = std::process::Command::new("true").spawn().unwrap();
            let pid = c.id() as i32;
            c.wait().unwrap();
            pid
        };
        for (i, (st, host)) in [
            (status::RUNNING, me),
            (status::EXITED, me),
            (status::RUNNING, gone),
        ]
        .into_iter()
        .enumerate()
        {
            let s = &r.procs[i];
            s.pid.store(i as i32 + 1, Relaxed);
            s.hostpid.store(host, Relaxed);
            s.status.store(st, Relaxed);
            s.used[0].data_size.store(100, Relaxed);
            s.used[0].context_size.store(10, Relaxed);
            s.used[0].total.store(110, Relaxed);
            s.device_util[0].sm_util.store(20, Relaxed);
        }
        let devs = devices(&r);
        assert_eq!(devs.iter().map(|d| d.index).collect::<Vec<_>>(), vec![0, 2]);
        let d0 = &devs[0];
        assert_eq!(d0.uuid, "GPU-0");
        assert_eq!(
            (d0.total, d0.data, d0.context, d0.sm_util),
            (220, 200, 20, 40)
        );
        assert_eq!((devs[1].limit, devs[1].total), (1 << 30, 0));
        assert_eq!(dead_slots(&r), 1);
    }
}
