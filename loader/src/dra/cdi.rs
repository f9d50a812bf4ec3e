//! The Container Device Interface spec the plugin writes for each claim:
//! one device named by the claim's UID, whose edits give a container the
//! claim's GPUs, vgpu's hook and the claim's limits.
//!
//! Field names and which are required follow the CDI spec (`cdiVersion`,
//! `kind`, `devices[].name`, `devices[].containerEdits`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vgpu_common::env as names;

use super::claim::Plan;

/// The spec version written: the oldest that has every field used (env,
/// mounts, device nodes by path), as the CDI library itself picks it, so
/// that older runtimes take the spec too. Debian 12's podman 4.3 resolves a
/// 0.5.0 spec and refuses a 0.6.0 one ("unresolvable CDI devices"); 0.6.0
/// would only add annotations, which the plugin does not write.
pub const CDI_VERSION: &str = "0.5.0";
/// `vendor/class` of every spec this plugin writes.
pub const CLASS: &str = "claim";
/// The hook's library in the hook directory.
pub const HOOK_LIB: &str = "libvgpu.so";
/// The preload list in the hook directory, mounted at `/etc/ld.so.preload`.
pub const PRELOAD_FILE: &str = "ld.so.preload";
/// The region file's name in the claim's directory.
pub const REGION_FILE: &str = "vgpu.cache";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<Device>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// Where the spec's files are, on the host and in the container.
#[derive(Clone, Debug)]
pub struct Layout {
    /// `<driver>/claim`.
    pub kind: String,
    /// The host's hook directory (`libvgpu.so`, `ld.so.preload`, `claims/`).
    pub hook_dir: PathBuf,
    /// Where the container sees the hook directory.
    pub container_hook_dir: PathBuf,
    /// Where the host's device nodes are looked for (`/dev`).
    pub dev_dir: PathBuf,
}

impl Layout {
    /// The claim's region directory on the host.
    pub fn claim_dir(&self, uid: &str) -> PathBuf {
        self.hook_dir.join("claims").join(uid)
    }

    /// The fully qualified CDI device name of a claim.
    pub fn device_id(&self, uid: &str) -> String {
        format!("{}={uid}", self.kind)
    }

    /// The spec file of a claim in `cdi_dir`.
    pub fn spec_path(&self, cdi_dir: &Path, uid: &str) -> PathBuf {
        cdi_dir.join(format!("{}-{uid}.json", self.kind.replace('/', "-")))
    }

    /// The claim's UID from a spec file name this layout writes.
    pub fn uid_of_spec(&self, file_name: &str) -> Option<String> {
        file_name
            .strip_prefix(&format!("{}-", self.kind.replace('/', "-")))?
            .strip_suffix(".json")
            .filter(|u| valid_name(u))
            .map(str::to_owned)
    }

    /// The spec for `plan`.
    pub fn spec(&self, plan: &Plan) -> Spec {
        let container_claim_dir = self.container_hook_dir.join("claims").join(&plan.uid);
        let mut env = Vec::new();
        let uuids: Vec<&str> = plan.devices.iter().map(|d| d.uuid.as_str()).collect();
        env.push(format!(
            "{}={}",
            names::NVIDIA_VISIBLE_DEVICES,
            uuids.join(",")
        ));
        for (i, d) in plan.devices.iter().enumerate() {
            env.push(format!("{}_{i}={}", names::MEMORY_LIMIT, d.memory));
            env.push(format!("{}_{i}={}", names::SM_LIMIT, d.cores));
        }
        env.push(format!(
            "{}={}",
            names::SHARED_CACHE,
            container_claim_dir.join(REGION_FILE).display()
        ));
        if let Some(p) = plan.settings.priority {
            env.push(format!("{}={p}", names::TASK_PRIORITY));
        }
        if let Some(o) = plan.settings.oversubscribe {
            env.push(format!("{}={o}", names::OVERSUBSCRIBE));
        }
        if let Some(p) = plan.settings.core_policy {
            env.push(format!("{}={}", names::UTILIZATION_POLICY, p.env_value()));
        }
        let ro = || {
            vec![
                "ro".to_owned(),
                "nosuid".to_owned(),
                "nodev".to_owned(),
                "bind".to_owned(),
            ]
        };
        let mounts = vec![
            Mount {
                host_path: self.claim_dir(&plan.uid).display().to_string(),
                container_path: container_claim_dir.display().to_string(),
                options: vec![
                    "rw".to_owned(),
                    "nosuid".to_owned(),
                    "nodev".to_owned(),
                    "bind".to_owned(),
                ],
            },
            Mount {
                host_path: self.hook_dir.join(HOOK_LIB).display().to_string(),
                container_path: self.container_hook_dir.join(HOOK_LIB).display().to_string(),
                options: ro(),
            },
            Mount {
                host_path: self.hook_dir.join(PRELOAD_FILE).display().to_string(),
                container_path: "/etc/ld.so.preload".to_owned(),
                options: ro(),
            },
        ];
        // Composed with NVIDIA's spec, which brings the device nodes (and
        // the driver's files); restated otherwise.
        let mut device_nodes = Vec::new();
        let mut node = |name: String| {
            if plan.nvidia.is_some() {
                return;
            }
            if self.dev_dir.join(&name).exists() {
                device_nodes.push(DeviceNode {
                    path: Path::new("/dev").join(name).display().to_string(),
                });
            }
        };
        for d in &plan.devices {
            if let Some(m) = d.minor {
                node(format!("nvidia{m}"));
            }
        }
        for n in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
            node(n.to_owned());
        }
        Spec {
            cdi_version: CDI_VERSION.to_owned(),
            kind: self.kind.clone(),
            annotations: BTreeMap::new(),
            devices: vec![Device {
                name: plan.uid.clone(),
                container_edits: ContainerEdits {
                    env,
                    device_nodes,
                    mounts,
                },
            }],
        }
    }
}

/// A CDI device name (and a claim UID fit for a file name): letters,
/// digits, `_.:-`, not starting with a punctuation character.
pub fn valid_name(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
}
