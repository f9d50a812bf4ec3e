//! The container's devices, and which of them each CUDA ordinal of this
//! process is.
//!
//! Every per-device word of the shared files (the region's limits, usage
//! and UUIDs, the sidecar's buckets) is indexed by the **container's device
//! index**: the index HAMi's device plugin gives
//! `CUDA_DEVICE_MEMORY_LIMIT_<i>` (the i-th device it allocated, the i-th
//! UUID of the `NVIDIA_VISIBLE_DEVICES` it sets), which HAMi's monitor
//! reports as `vdevice_index`. When `NVIDIA_VISIBLE_DEVICES` lists no UUIDs
//! (outside Kubernetes, `all`, ordinals) the order is NVML's, which is the
//! container's device order and ignores `CUDA_VISIBLE_DEVICES`.
//!
//! A process's CUDA ordinals follow that order only without
//! `CUDA_VISIBLE_DEVICES`, and two processes of one container may set it
//! differently (one process per GPU). So each device the driver names (a
//! context's device, a VMM location, a `CUdevice` argument) is translated
//! here, by UUID, before it indexes anything shared.
//!
//! Each function takes the driver to ask (`crate::driver::ids::DeviceIds`),
//! so that the real one (`driver::native`, which translates every
//! context's device here) and this table do not import each other.

#![forbid(unsafe_code)]

use std::sync::OnceLock;

use vgpu_common::devices::{container_devices, NvmlView};
use vgpu_common::region::MAX_DEVICES;

use crate::driver::ids::DeviceIds;
use crate::ffi::*;

/// The container index of each CUDA ordinal (`None`: a device the container
/// order does not list, or whose UUID is unknown).
pub fn ordinal_map(cuda: &[Option<String>], container: &[String]) -> Vec<Option<usize>> {
    cuda.iter()
        .map(|u| {
            let u = u.as_deref()?;
            container
                .iter()
                .position(|c| c == u)
                .filter(|i| *i < MAX_DEVICES)
        })
        .collect()
}

/// This process's devices: the container's in index order, and the
/// container index of each CUDA ordinal.
#[derive(Debug)]
pub struct Devices {
    container: Vec<String>,
    index_of: Vec<Option<usize>>,
}

/// Known once the driver is initialised (`cuInit`).
static DEVICES: OnceLock<Devices> = OnceLock::new();

impl Devices {
    /// Reads the devices from the driver and NVML; `None` before `cuInit`.
    fn load(d: &impl DeviceIds) -> Option<Self> {
        let count = d.cuda_count()?;
        let cuda: Vec<Option<String>> = (0..count.max(0) as usize)
            .map(|o| cuda_uuid(d, o))
            .collect();
        let mut container = nvml_container_order(d);
        if container.is_empty() {
            // No NVML: CUDA's own order is all there is.
            container = cuda.iter().flatten().cloned().collect();
        }
        let index_of = ordinal_map(&cuda, &container);
        let identity = index_of.iter().enumerate().all(|(i, d)| *d == Some(i));
        if !identity {
            vlog!(
                crate::log::INFO,
                "CUDA devices are the container's devices {index_of:?} (container order {container:?})"
            );
        }
        Some(Self {
            container,
            index_of,
        })
    }

    /// The container's device UUIDs, in index order.
    pub fn container(&self) -> &[String] {
        &self.container
    }
}

/// The devices, loaded on the first call after `cuInit`.
pub fn get(d: &impl DeviceIds) -> Option<&'static Devices> {
    if let Some(devices) = DEVICES.get() {
        return Some(devices);
    }
    let devices = Devices::load(d)?;
    Some(DEVICES.get_or_init(|| devices))
}

/// The container index of CUDA ordinal `ordinal` (a `CUdevice`). Before
/// `cuInit` (no device can be named then) the ordinal itself.
pub fn index_of(d: &impl DeviceIds, ordinal: CUdevice) -> Option<usize> {
    let o = usize::try_from(ordinal).ok()?;
    match get(d) {
        Some(d) => d.index_of.get(o).copied().flatten(),
        None => Some(o).filter(|o| *o < MAX_DEVICES),
    }
}

/// The UUID of the container's device `index` (known once `cuInit` ran).
pub fn uuid(d: &impl DeviceIds, index: usize) -> Option<String> {
    get(d)?.container.get(index).cloned()
}

/// The container's devices as NVML lists them, in the container's index
/// order (empty without NVML).
pub fn nvml_container_order(d: &impl DeviceIds) -> Vec<String> {
    container_devices(
        &d.nvml_uuids(),
        crate::config::get().nvidia_visible.as_deref(),
        NvmlView::Container,
    )
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, NVML's UUID spelling.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The UUID of CUDA ordinal `ordinal`.
fn cuda_uuid(d: &impl DeviceIds, ordinal: usize) -> Option<String> {
    d.cuda_uuid(ordinal).map(|u| format_uuid(&u))
}

/// The NVML handle of the container's device `index`, by UUID.
pub fn nvml_handle(d: &impl DeviceIds, index: usize) -> Option<nvmlDevice_t> {
    d.nvml_by_uuid(&uuid(d, index)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn each_ordinal_maps_to_its_devices_container_index() {
        let container = s(&["GPU-a", "GPU-b", "GPU-c"]);
        let cuda = |v: &[&str]| v.iter().map(|x| Some(x.to_string())).collect::<Vec<_>>();
        assert_eq!(
            ordinal_map(&cuda(&["GPU-a", "GPU-b", "GPU-c"]), &container),
            vec![Some(0), Some(1), Some(2)]
        );
        // CUDA_VISIBLE_DEVICES=2,0
        assert_eq!(
            ordinal_map(&cuda(&["GPU-c", "GPU-a"]), &container),
            vec![Some(2), Some(0)]
        );
        assert_eq!(
            ordinal_map(&[None, Some("GPU-x".into())], &container),
            vec![None, None]
        );
    }
}
