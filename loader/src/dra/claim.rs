//! A ResourceClaim as the API server returns it (`resource.k8s.io/v1`),
//! read only as far as preparing it needs, and the plan the plugin makes
//! of it: which of this node's GPUs, how much of each, and the `VgpuConfig`.
//!
//! Unknown fields of the API object are ignored (the API grows); unknown
//! fields of our own opaque `VgpuConfig` are an error the user sees.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::devices::Gpu;
use super::quantity::{self, QuantityError};

/// The claim, as far as it is read.
#[derive(Debug, Deserialize)]
pub struct ResourceClaim {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: Option<ClaimStatus>,
}

#[derive(Debug, Deserialize)]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
}

#[derive(Debug, Deserialize)]
pub struct ClaimStatus {
    #[serde(default)]
    pub allocation: Option<Allocation>,
}

#[derive(Debug, Deserialize)]
pub struct Allocation {
    #[serde(default)]
    pub devices: Option<DeviceAllocation>,
}

#[derive(Debug, Default, Deserialize)]
pub struct DeviceAllocation {
    #[serde(default)]
    pub results: Vec<AllocationResult>,
    #[serde(default)]
    pub config: Vec<AllocationConfig>,
}

/// `status.allocation.devices.results[]`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationResult {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// Quantities, as the API writes them (`8Gi`, `30`).
    #[serde(default)]
    pub consumed_capacity: BTreeMap<String, String>,
}

/// `status.allocation.devices.config[]`: the class's and the claim's
/// configuration, class first.
#[derive(Debug, Deserialize)]
pub struct AllocationConfig {
    #[serde(default)]
    pub source: String,
    /// The requests it applies to; empty: all of them.
    #[serde(default)]
    pub requests: Vec<String>,
    #[serde(default)]
    pub opaque: Option<OpaqueConfig>,
}

#[derive(Debug, Deserialize)]
pub struct OpaqueConfig {
    pub driver: String,
    pub parameters: serde_json::Value,
}

/// The API version and kind of [`VgpuConfig`].
pub const CONFIG_API_VERSION: &str = "vgpu.dev/v1alpha1";
pub const CONFIG_KIND: &str = "VgpuConfig";

/// The opaque parameters vgpu takes in a claim or a DeviceClass:
/// `{"apiVersion": "vgpu.dev/v1alpha1", "kind": "VgpuConfig", ...}`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VgpuConfig {
    pub api_version: String,
    pub kind: String,
    /// `CUDA_TASK_PRIORITY`: 0 high (a latency service), 1 normal.
    #[serde(default)]
    pub priority: Option<u8>,
    /// `CUDA_OVERSUBSCRIBE`: allocations past the device (not past the
    /// limit) from host memory.
    #[serde(default)]
    pub oversubscribe: Option<bool>,
    /// `GPU_CORE_UTILIZATION_POLICY`.
    #[serde(default)]
    pub core_policy: Option<CorePolicy>,
}

/// How the SM share is applied (HAMi-core's `GPU_CORE_UTILIZATION_POLICY`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CorePolicy {
    Default,
    Force,
    Disable,
}

impl CorePolicy {
    /// The value of `GPU_CORE_UTILIZATION_POLICY`.
    pub fn env_value(self) -> &'static str {
        match self {
            CorePolicy::Default => "default",
            CorePolicy::Force => "force",
            CorePolicy::Disable => "disable",
        }
    }
}

/// The settings of one claim after every config entry applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub priority: Option<u8>,
    pub oversubscribe: Option<bool>,
    pub core_policy: Option<CorePolicy>,
}

/// One of this node's GPUs in a claim, with what the claim consumes of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedDevice {
    /// The requests of the claim it serves.
    pub requests: Vec<String>,
    pub pool: String,
    /// The device's name in the ResourceSlice (`gpu-<index>`).
    pub device: String,
    pub index: u32,
    pub uuid: String,
    pub minor: Option<u32>,
    /// Bytes of device memory the claim may use.
    pub memory: u64,
    /// Percent of the GPU's time, 1–100.
    pub cores: u32,
}

/// What preparing one claim means, before anything is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// In the order of the host's device index, which is the order the
    /// container sees them in: `_<i>` is the position here.
    pub devices: Vec<PlannedDevice>,
    pub settings: Settings,
    /// NVIDIA's CDI device of each of `devices`, in their order, where the
    /// node's NVIDIA spec names every one: the runtime then takes the GPUs'
    /// device nodes and driver files from NVIDIA's spec.
    pub nvidia: Option<Vec<String>>,
}

/// Why a claim cannot be prepared; the text is what kubelet shows in the
/// pod's events.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("claim {claim} is not allocated yet (no status.allocation.devices)")]
    NotAllocated { claim: String },
    #[error(
        "claim {claim} has no device of driver {driver} (its devices are of {others}): \
         another driver prepares it"
    )]
    OtherDriver {
        claim: String,
        driver: String,
        others: String,
    },
    #[error(
        "claim {claim}: device {device} of pool {pool} is not a GPU of this node \
         (pool {node_pool}, devices {have})"
    )]
    UnknownDevice {
        claim: String,
        pool: String,
        device: String,
        node_pool: String,
        /// The node's devices, for the message (`none` without GPUs).
        have: String,
    },
    #[error("claim {claim}: consumed capacity {name}={value:?} of {device}: {source}")]
    Quantity {
        claim: String,
        device: String,
        name: String,
        value: String,
        #[source]
        source: QuantityError,
    },
    #[error(
        "claim {claim}: consumed capacity {name:?} of {device} is not one vgpu publishes \
         (memory, cores)"
    )]
    UnknownCapacity {
        claim: String,
        device: String,
        name: String,
    },
    #[error("claim {claim}: {device} is given {asked} bytes of memory, more than its {has} bytes")]
    MemoryAboveDevice {
        claim: String,
        device: String,
        asked: u64,
        has: u64,
    },
    #[error("claim {claim}: {device} is given {asked} % of its time; cores must be 1 to 100")]
    CoresOutOfRange {
        claim: String,
        device: String,
        asked: u64,
    },
    #[error(
        "claim {claim}: opaque config ({source_kind}) for {driver} is not a VgpuConfig: {source}"
    )]
    BadConfig {
        claim: String,
        source_kind: String,
        driver: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "claim {claim}: opaque config ({source_kind}) has apiVersion {api_version:?} and \
         kind {kind:?}; vgpu takes apiVersion {CONFIG_API_VERSION:?}, kind {CONFIG_KIND:?}"
    )]
    ConfigKind {
        claim: String,
        source_kind: String,
        api_version: String,
        kind: String,
    },
    #[error("claim {claim}: priority {priority} in VgpuConfig; it must be 0 (high) or 1 (normal)")]
    Priority { claim: String, priority: u8 },
}

impl ResourceClaim {
    /// `namespace/name`, for messages.
    fn display_name(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    /// The plan for this node's `gpus` in pool `node_pool`, or why the claim
    /// cannot be prepared by `driver` here.
    pub fn plan(&self, driver: &str, node_pool: &str, gpus: &[Gpu]) -> Result<Plan, ClaimError> {
        let claim = self.display_name();
        let alloc = self
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .ok_or_else(|| ClaimError::NotAllocated {
                claim: claim.clone(),
            })?;
        let ours: Vec<&AllocationResult> = alloc
            .results
            .iter()
            .filter(|r| r.driver == driver)
            .collect();
        if ours.is_empty() {
            let mut others: Vec<&str> = alloc.results.iter().map(|r| r.driver.as_str()).collect();
            others.sort_unstable();
            others.dedup();
            return Err(ClaimError::OtherDriver {
                claim,
                driver: driver.to_owned(),
                others: if others.is_empty() {
                    "no driver".to_owned()
                } else {
                    others.join(", ")
                },
            });
        }
        let mut devices: Vec<PlannedDevice> = Vec::new();
        for r in ours {
            let gpu = gpus
                .iter()
                .find(|g| r.pool == node_pool && g.name() == r.device)
                .ok_or_else(|| ClaimError::UnknownDevice {
                    claim: claim.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                    node_pool: node_pool.to_owned(),
                    have: device_names(gpus),
                })?;
            let (memory, cores) = consumed(&claim, r, gpu)?;
            // Two requests on one GPU (consumable capacity allows it): one
            // device in the container, their shares added.
            if let Some(d) = devices.iter_mut().find(|d| d.device == r.device) {
                d.requests.push(r.request.clone());
                d.memory = d.memory.saturating_add(memory);
                d.cores = d.cores.saturating_add(cores);
                check_bounds(&claim, gpu, d.memory, u64::from(d.cores))?;
                continue;
            }
            devices.push(PlannedDevice {
                requests: vec![r.request.clone()],
                pool: r.pool.clone(),
                device: r.device.clone(),
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                minor: gpu.minor,
                memory,
                cores,
            });
        }
        devices.sort_by_key(|d| d.index);
        let settings = settings(&claim, driver, &alloc.config, &devices)?;
        Ok(Plan {
            uid: self.metadata.uid.clone(),
            namespace: self.metadata.namespace.clone(),
            name: self.metadata.name.clone(),
            devices,
            settings,
            nvidia: None,
        })
    }
}

/// `gpu-0, gpu-1`, or `none`.
fn device_names(gpus: &[Gpu]) -> String {
    if gpus.is_empty() {
        return "none".to_owned();
    }
    gpus.iter().map(Gpu::name).collect::<Vec<_>>().join(", ")
}

/// Memory bytes and cores percent one result consumes of `gpu`; the whole
/// GPU for what it does not name.
fn consumed(claim: &str, r: &AllocationResult, gpu: &Gpu) -> Result<(u64, u32), ClaimError> {
    let mut memory = gpu.memory;
    let mut cores: u64 = 100;
    for (name, value) in &r.consumed_capacity {
        let parse = || {
            quantity::parse(value).map_err(|source| ClaimError::Quantity {
                claim: claim.to_owned(),
                device: r.device.clone(),
                name: name.clone(),
                value: value.clone(),
                source,
            })
        };
        match name.as_str() {
            "memory" => memory = parse()?,
            "cores" => cores = parse()?,
            _ => {
                return Err(ClaimError::UnknownCapacity {
                    claim: claim.to_owned(),
                    device: r.device.clone(),
                    name: name.clone(),
                })
            }
        }
    }
    check_bounds(claim, gpu, memory, cores)?;
    // check_bounds kept it within 1..=100.
    Ok((memory, u32::try_from(cores).unwrap_or(100)))
}

fn check_bounds(claim: &str, gpu: &Gpu, memory: u64, cores: u64) -> Result<(), ClaimError> {
    if memory > gpu.memory {
        return Err(ClaimError::MemoryAboveDevice {
            claim: claim.to_owned(),
            device: gpu.name(),
            asked: memory,
            has: gpu.memory,
        });
    }
    if !(1..=100).contains(&cores) {
        return Err(ClaimError::CoresOutOfRange {
            claim: claim.to_owned(),
            device: gpu.name(),
            asked: cores,
        });
    }
    Ok(())
}

/// The `VgpuConfig` entries of `driver` that apply to the claim's requests
/// on this node, applied in order (the class's before the claim's, as the
/// API lists them): a later entry's field wins.
fn settings(
    claim: &str,
    driver: &str,
    config: &[AllocationConfig],
    devices: &[PlannedDevice],
) -> Result<Settings, ClaimError> {
    let mut out = Settings::default();
    for c in config {
        let Some(opaque) = c.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let applies = c.requests.is_empty()
            || devices
                .iter()
                .any(|d| d.requests.iter().any(|r| c.requests.contains(r)));
        // A malformed entry is an error even where it applies to no request
        // here: the user wrote it for this driver.
        let cfg: VgpuConfig =
            serde_json::from_value(opaque.parameters.clone()).map_err(|source| {
                ClaimError::BadConfig {
                    claim: claim.to_owned(),
                    source_kind: c.source.clone(),
                    driver: driver.to_owned(),
                    source,
                }
            })?;
        if cfg.api_version != CONFIG_API_VERSION || cfg.kind != CONFIG_KIND {
            return Err(ClaimError::ConfigKind {
                claim: claim.to_owned(),
                source_kind: c.source.clone(),
                api_version: cfg.api_version,
                kind: cfg.kind,
            });
        }
        if let Some(p) = cfg.priority.filter(|&p| p > 1) {
            return Err(ClaimError::Priority {
                claim: claim.to_owned(),
                priority: p,
            });
        }
        if !applies {
            continue;
        }
        out.priority = cfg.priority.or(out.priority);
        out.oversubscribe = cfg.oversubscribe.or(out.oversubscribe);
        out.core_policy = cfg.core_policy.or(out.core_policy);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> Vec<Gpu> {
        (0..2)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i}"),
                memory: 8 << 30,
                minor: Some(i),
                product: None,
                compute_capability: None,
            })
            .collect()
    }

    fn claim(results: serde_json::Value, config: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u-1"},
            "status": {"allocation": {"devices": {"results": results, "config": config}}}
        }))
        .unwrap()
    }

    #[test]
    fn devices_follow_the_host_order_and_configs_apply_class_then_claim() {
        let c = claim(
            serde_json::json!([
                {"request": "b", "driver": "vgpu.dev", "pool": "n1", "device": "gpu-1",
                 "consumedCapacity": {"memory": "2Gi", "cores": "30"}},
                {"request": "a", "driver": "vgpu.dev", "pool": "n1", "device": "gpu-0"},
            ]),
            serde_json::json!([
                {"source": "FromClass", "opaque": {"driver": "vgpu.dev", "parameters":
                    {"apiVersion": "vgpu.dev/v1alpha1", "kind": "VgpuConfig", "priority": 1, "oversubscribe": true}}},
                {"source": "FromClaim", "requests": ["a"], "opaque": {"driver": "vgpu.dev", "parameters":
                    {"apiVersion": "vgpu.dev/v1alpha1", "kind": "VgpuConfig", "priority": 0}}},
                {"source": "FromClaim", "opaque": {"driver": "other.dev", "parameters": {"x": 1}}},
            ]),
        );
        let p = c.plan("vgpu.dev", "n1", &gpus()).unwrap();
        assert_eq!(p.devices.len(), 2);
        assert_eq!(
            (p.devices[0].index, p.devices[0].memory, p.devices[0].cores),
            (0, 8 << 30, 100)
        );
        assert_eq!(
            (p.devices[1].index, p.devices[1].memory, p.devices[1].cores),
            (1, 2 << 30, 30)
        );
        assert_eq!(p.settings.priority, Some(0));
        assert_eq!(p.settings.oversubscribe, Some(true));
    }

    #[test]
    fn bad_claims_are_refused_with_their_reason() {
        let gpus = gpus();
        let other = claim(
            serde_json::json!([{"request": "a", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]),
            serde_json::json!([]),
        );
        let e = other.plan("vgpu.dev", "n1", &gpus).unwrap_err().to_string();
        assert!(e.contains("gpu.nvidia.com"), "{e}");
        let big = claim(
            serde_json::json!([{"request": "a", "driver": "vgpu.dev", "pool": "n1", "device": "gpu-0",
                "consumedCapacity": {"memory": "9Gi"}}]),
            serde_json::json!([]),
        );
        let e = big.plan("vgpu.dev", "n1", &gpus).unwrap_err().to_string();
        assert!(e.contains("more than its 8589934592 bytes"), "{e}");
        let unknown = claim(
            serde_json::json!([{"request": "a", "driver": "vgpu.dev", "pool": "n1", "device": "gpu-0"}]),
            serde_json::json!([{"source": "FromClaim", "opaque": {"driver": "vgpu.dev", "parameters":
                {"apiVersion": "vgpu.dev/v1alpha1", "kind": "VgpuConfig", "prio": 0}}}]),
        );
        let e = unknown
            .plan("vgpu.dev", "n1", &gpus)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `prio`"), "{e}");
        let elsewhere = claim(
            serde_json::json!([{"request": "a", "driver": "vgpu.dev", "pool": "n2", "device": "gpu-0"}]),
            serde_json::json!([]),
        );
        assert!(matches!(
            elsewhere.plan("vgpu.dev", "n1", &gpus),
            Err(ClaimError::UnknownDevice { .. })
        ));
    }
}
