//! The driver's own view through NVML: per-device memory and utilization,
//! and per-process used memory keyed by host PID.

use std::collections::HashMap;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

/// One device.
#[derive(Clone, Debug, Default)]
pub struct DeviceSample {
    pub index: u32,
    pub uuid: String,
    /// `NVIDIA-<name>`, HAMi's `device_type`.
    pub device_type: String,
    pub memory_used: u64,
    /// GPU utilization, percent.
    pub utilization: Option<u32>,
}

/// One scan's NVML view.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub devices: Vec<DeviceSample>,
    /// Host PID -> used bytes, summed over devices.
    pub processes: HashMap<u32, u64>,
}

/// An initialised NVML.
pub struct NvmlView {
    nvml: Nvml,
}

impl NvmlView {
    /// Loads `libnvidia-ml.so.1` and initialises it.
    pub fn init() -> Result<Self, nvml_wrapper::error::NvmlError> {
        Ok(Self {
            nvml: Nvml::init()?,
        })
    }

    /// Samples every device. A device that fails is skipped (logged at debug).
    pub fn sample(&self) -> Sample {
        let mut out = Sample::default();
        let count = match self.nvml.device_count() {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!("nvmlDeviceGetCount: {e}");
                return out;
            }
        };
        for index in 0..count {
            let dev = match self.nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    tracing::debug!("nvmlDeviceGetHandleByIndex({index}): {e}");
                    continue;
                }
            };
            let s = DeviceSample {
                index,
                uuid: dev.uuid().unwrap_or_default(),
                device_type: dev
                    .name()
                    .map(|n| format!("NVIDIA-{n}"))
                    .unwrap_or_default(),
                memory_used: dev.memory_info().map_or(0, |m| m.used),
                utilization: dev.utilization_rates().ok().map(|u| u.gpu),
            };
            match dev.running_compute_processes() {
                Ok(procs) => {
                    for p in procs {
                        if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                            *out.processes.entry(p.pid).or_insert(0) += b;
                        } else {
                            out.processes.entry(p.pid).or_insert(0);
                        }
                    }
                }
                Err(e) => tracing::debug!("nvmlDeviceGetComputeRunningProcesses({index}): {e}"),
            }
            out.devices.push(s);
        }
        out
    }
}
