//! NVIDIA's CDI spec on this node, where it has one (`nvidia-ctk cdi
//! generate`, the GPU operator's toolkit): kind `nvidia.com/gpu`, a device
//! per GPU named by its UUID or its index (or both, as the toolkit's
//! device-name strategy says), and spec-wide edits with the driver's files,
//! device nodes and hooks. A claim whose every GPU that spec names is
//! answered with NVIDIA's device beside the claim's own, so the runtime
//! merges NVIDIA's edits and vgpu's spec does not restate them.
//!
//! Only the kind and the device names are read; a file that is not a CDI
//! spec (or not readable) is skipped: the runtime reports it, not the
//! plugin.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The kind of NVIDIA's spec of whole GPUs.
pub const KIND: &str = "nvidia.com/gpu";

#[derive(Deserialize)]
struct SpecHead {
    kind: String,
    #[serde(default)]
    devices: Vec<DeviceHead>,
}

#[derive(Deserialize)]
struct DeviceHead {
    name: String,
}

/// The device names of NVIDIA's specs found on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvidiaDevices {
    names: BTreeSet<String>,
}

impl NvidiaDevices {
    /// The devices of every `nvidia.com/gpu` spec in `dirs` (`.json`,
    /// `.yaml`, `.yml`), except the files `skip` names (the plugin's own).
    pub fn find(dirs: &[PathBuf], skip: impl Fn(&str) -> bool) -> Self {
        let mut names = BTreeSet::new();
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let file = entry.file_name();
                let Some(file) = file.to_str() else { continue };
                let spec_file = [".json", ".yaml", ".yml"].iter().any(|e| file.ends_with(e));
                if !spec_file || skip(file) {
                    continue;
                }
                if let Some(spec) = read(&entry.path()) {
                    if spec.kind == KIND {
                        names.extend(spec.devices.into_iter().map(|d| d.name));
                    }
                }
            }
        }
        NvidiaDevices { names }
    }

    /// NVIDIA's fully qualified device of the GPU `uuid` (index `index`):
    /// by UUID where the spec names it so, else by index.
    pub fn device_of(&self, uuid: &str, index: u32) -> Option<String> {
        [uuid.to_owned(), index.to_string()]
            .into_iter()
            .find(|n| self.names.contains(n))
            .map(|n| format!("{KIND}={n}"))
    }
}

/// The spec at `path`: YAML, which JSON is too.
fn read(path: &Path) -> Option<SpecHead> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_yaml::from_str(&text) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::debug!("{}: not a CDI spec: {e}", path.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidias_devices_are_found_by_uuid_or_index_and_other_kinds_ignored() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("nvidia.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  \
             containerEdits: {}\n- name: GPU-b\n  containerEdits: {}\n- name: all\n  \
             containerEdits: {}\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("other.json"),
            r#"{"cdiVersion":"0.5.0","kind":"example.com/gpu","devices":[{"name":"GPU-c","containerEdits":{}}]}"#,
        )
        .unwrap();
        std::fs::write(d.path().join("broken.yaml"), "kind: [").unwrap();
        std::fs::write(
            d.path().join("mine.json"),
            r#"{"kind":"nvidia.com/gpu","devices":[{"name":"GPU-x"}]}"#,
        )
        .unwrap();
        let n = NvidiaDevices::find(&[d.path().to_owned()], |f| f == "mine.json");
        assert_eq!(n.device_of("GPU-a", 0).as_deref(), Some("nvidia.com/gpu=0"));
        assert_eq!(
            n.device_of("GPU-b", 1).as_deref(),
            Some("nvidia.com/gpu=GPU-b")
        );
        assert_eq!(n.device_of("GPU-c", 2), None);
        assert_eq!(n.device_of("GPU-x", 3), None);
        let none = NvidiaDevices::find(&[d.path().join("absent")], |_| false);
        assert_eq!(none, NvidiaDevices::default());
    }
}
