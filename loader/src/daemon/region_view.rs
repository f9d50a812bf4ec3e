//! What the metrics show of one open region (one container): its labels,
//! its per-device sums, and its dead slots.

use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::region::{status, SharedRegion, MAX_DEVICES};

use super::identity::Identity;
use super::metrics::{Labels, RegionDevice};
use super::pods::PodName;
use crate::regions::discover::ContainerRef;
use crate::regions::liveness::Mappers;

/// A region's labels: HAMi's monitor's first (namespace, pod, container;
/// the device's `vdevice_index` and `device_uuid` follow per device), then
/// vgpu's. `name` is the pod's, `owner` the container directory the region
/// was found in, `id` the cgroup identity of a process using it.
pub fn labels(
    name: Option<&PodName>,
    owner: Option<&ContainerRef>,
    pod_uid: String,
    id: &Identity,
    region: &Path,
) -> Labels {
    vec![
        (
            "namespace".to_owned(),
            name.map(|n| n.namespace.clone()).unwrap_or_default(),
        ),
        (
            "pod".to_owned(),
            name.map(|n| n.pod.clone()).unwrap_or_default(),
        ),
        (
            "container".to_owned(),
            owner.map(|o| o.container.clone()).unwrap_or_default(),
        ),
        ("pod_uid".to_owned(), pod_uid),
        (
            "container_id".to_owned(),
            id.container_id.clone().unwrap_or_default(),
        ),
        ("cgroup".to_owned(), id.cgroup.clone()),
        ("region".to_owned(), region.display().to_string()),
    ]
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
