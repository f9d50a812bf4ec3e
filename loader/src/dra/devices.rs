//! This node's GPUs, as the plugin names them in its ResourceSlice and
//! finds them in a claim's allocation.

/// One GPU of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// NVML's index, which is nvidia-smi's.
    pub index: u32,
    pub uuid: String,
    /// Total device memory, bytes: the most a claim may consume.
    pub memory: u64,
    /// N of `/dev/nvidiaN`; `None` where NVML does not say.
    pub minor: Option<u32>,
}

impl Gpu {
    /// The device's name in the ResourceSlice and in allocation results.
    pub fn name(&self) -> String {
        format!("gpu-{}", self.index)
    }
}

/// Why the node's GPUs could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("loading NVML (libnvidia-ml.so.1)")]
    Init(#[source] nvml_wrapper::error::NvmlError),
    #[error("NVML {call} of device {index}")]
    Device {
        call: &'static str,
        index: u32,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML nvmlDeviceGetCount")]
    Count(#[source] nvml_wrapper::error::NvmlError),
}

/// Every GPU NVML sees, in index order.
pub fn from_nvml() -> Result<Vec<Gpu>, InventoryError> {
    let nvml = nvml_wrapper::Nvml::init().map_err(InventoryError::Init)?;
    let count = nvml.device_count().map_err(InventoryError::Count)?;
    let dev_err = |call, index| {
        move |source| InventoryError::Device {
            call,
            index,
            source,
        }
    };
    (0..count)
        .map(|index| {
            let d = nvml
                .device_by_index(index)
                .map_err(dev_err("nvmlDeviceGetHandleByIndex", index))?;
            Ok(Gpu {
                index,
                uuid: d.uuid().map_err(dev_err("nvmlDeviceGetUUID", index))?,
                memory: d
                    .memory_info()
                    .map_err(dev_err("nvmlDeviceGetMemoryInfo", index))?
                    .total,
                minor: d.minor_number().ok(),
            })
        })
        .collect()
}
