//! The driver's own view through NVML: per-device memory and utilization,
//! per-process used memory and per-process SM utilization, keyed by host
//! PID (the daemon runs in the host's PID namespace).

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

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
    /// Memory controller utilization (NVML's memory rate), percent.
    pub memory_utilization: Option<u32>,
    /// Host PID -> SM utilization percent since the previous sample (mean
    /// of NVML's samples for that PID); `None` when the query failed.
    pub process_util: Option<HashMap<u32, u32>>,
    /// Host PID -> bytes it uses on this device (its context included).
    pub process_memory: HashMap<u32, u64>,
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
    /// Unix µs of the previous per-process utilization query, per device.
    last_seen: HashMap<u32, u64>,
}

impl NvmlView {
    /// Loads `libnvidia-ml.so.1` and initialises it.
    pub fn init() -> Result<Self, nvml_wrapper::error::NvmlError> {
        Ok(Self {
            nvml: Nvml::init()?,
            last_seen: HashMap::new(),
        })
    }

    /// Samples every device. A device that fails is skipped (logged at debug).
    pub fn sample(&mut self) -> Sample {
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
            let mut s = DeviceSample {
                index,
                uuid: dev.uuid().unwrap_or_default(),
                device_type: dev
                    .name()
                    .map(|n| format!("NVIDIA-{n}"))
                    .unwrap_or_default(),
                memory_used: dev.memory_info().map_or(0, |m| m.used),
                utilization: None,
                memory_utilization: None,
                process_util: None,
                process_memory: HashMap::new(),
            };
            if let Ok(u) = dev.utilization_rates() {
                s.utilization = Some(u.gpu);
                s.memory_utilization = Some(u.memory);
            }
            let now_us = unix_us();
            let since = self
                .last_seen
                .get(&index)
                .map_or(0, |&prev| prev.min(now_us.saturating_sub(MIN_SPAN_US)));
            let util = match dev.process_utilization_stats(since) {
                Ok(v) => Some(v.into_iter().map(|u| (u.pid, u.sm_util)).collect()),
                // No process ran since `since`.
                Err(nvml_wrapper::error::NvmlError::NotFound) => Some(Vec::new()),
                Err(e) => {
                    tracing::debug!("nvmlDeviceGetProcessUtilization({index}): {e}");
                    None
                }
            };
            if util.is_some() {
                self.last_seen.insert(index, now_us);
            }
            s.process_util = util.map(|v| mean_by_pid(&v));
            match dev.running_compute_processes() {
                Ok(procs) => {
                    for p in procs {
                        let b = match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => b,
                            UsedGpuMemory::Unavailable => 0,
                        };
                        *out.processes.entry(p.pid).or_insert(0) += b;
                        *s.process_memory.entry(p.pid).or_insert(0) += b;
                    }
                }
                Err(e) => tracing::debug!("nvmlDeviceGetComputeRunningProcesses({index}): {e}"),
            }
            out.devices.push(s);
        }
        out
    }
}

/// Per-process samples cover at least this span: NVML samples a few times a
/// second, so a shorter span of two time-sliced processes can hold one
/// process's sample and not the other's, and swing between 0 and half the
/// device (docs/benchmarks.md, "Observability").
const MIN_SPAN_US: u64 = 1_000_000;

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// NVML returns one sample per PID per internal sampling period: their mean,
/// per PID, capped at 100.
pub fn mean_by_pid(samples: &[(u32, u32)]) -> HashMap<u32, u32> {
    let mut acc: HashMap<u32, (u64, u64)> = HashMap::new();
    for &(pid, util) in samples {
        let e = acc.entry(pid).or_insert((0, 0));
        e.0 += u64::from(util.min(100));
        e.1 += 1;
    }
    acc.into_iter()
        .map(|(pid, (sum, n))| (pid, ((sum + n / 2) / n.max(1)) as u32))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_averaged_per_pid_and_capped() {
        let m = mean_by_pid(&[(7, 40), (7, 60), (8, 250), (9, 0)]);
        assert_eq!(m.get(&7), Some(&50));
        assert_eq!(m.get(&8), Some(&100));
        assert_eq!(m.get(&9), Some(&0));
        assert_eq!(m.len(), 3);
    }
}
