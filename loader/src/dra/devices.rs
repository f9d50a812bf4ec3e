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
    /// NVML's name (`NVIDIA H100 80GB HBM3`).
    pub product: Option<String>,
    /// CUDA compute capability, major and minor.
    pub compute_capability: Option<(i32, i32)>,
}

/// The node's driver, as the ResourceSlice describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Driver {
    /// The kernel driver's version (`550.54.15`).
    pub version: Option<String>,
    /// The CUDA version the driver supports, as CUDA encodes it
    /// (1000 × major + 10 × minor: 12040 for 12.4).
    pub cuda: Option<i32>,
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

/// Every GPU NVML sees, in index order, and the driver.
pub fn from_nvml() -> Result<(Vec<Gpu>, Driver), InventoryError> {
    let nvml = nvml_wrapper::Nvml::init().map_err(InventoryError::Init)?;
    let driver = Driver {
        version: nvml.sys_driver_version().ok(),
        cuda: nvml.sys_cuda_driver_version().ok(),
    };
    let count = nvml.device_count().map_err(InventoryError::Count)?;
    let dev_err = |call, index| {
        move |source| InventoryError::Device {
            call,
            index,
            source,
        }
    };
    let gpus = (0..count)
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
                product: d.name().ok(),
                compute_capability: d.cuda_compute_capability().ok().map(|c| (c.major, c.minor)),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((gpus, driver))
}
