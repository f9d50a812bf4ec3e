//! The compute processes NVML lists on a device, and their utilization.

use super::{list, sym, NvmlError};
use crate::ffi::*;

/// `(pid, used bytes)` of the compute processes on `dev`; entries without
/// a memory figure are dropped. PIDs are as the caller's PID namespace sees
/// them (host PIDs on the host).
///
/// # Errors
/// As [`compute_processes`].
pub fn running_processes(dev: nvmlDevice_t) -> Result<Vec<(u32, u64)>, NvmlError> {
    Ok(compute_processes(dev)?
        .iter()
        .filter(|i| i.used_gpu_memory != NVML_VALUE_NOT_AVAILABLE_U64)
        .map(|i| (i.pid, i.used_gpu_memory))
        .collect())
}

/// Every compute process on the device, as NVML lists it to this process:
/// `nvmlDeviceGetComputeRunningProcesses_v3` (else `_v2`, same struct),
/// the buffer grown while NVML reports it too small.
///
/// # Errors
/// NVML's code; `NVML_ERROR_INSUFFICIENT_SIZE` if the list kept growing.
#[doc(alias = "nvmlDeviceGetComputeRunningProcesses_v3")]
pub fn compute_processes(dev: nvmlDevice_t) -> Result<Vec<nvmlProcessInfo_t>, NvmlError> {
    let call = sym(|t| {
        t.nvmlDeviceGetComputeRunningProcesses_v3
            .or(t.nvmlDeviceGetComputeRunningProcesses_v2)
    })?;
    list::grow_list(|infos, count| {
        // SAFETY: `infos` holds `*count` initialised entries of the C
        // struct; both live for the whole call.
        unsafe { call(dev, count, infos.as_mut_ptr()) }
    })
}

/// Each process's utilization samples on `dev` since `since_us` (Unix µs),
/// the buffer grown while NVML reports it too small.
///
/// # Errors
/// NVML's code: `NVML_ERROR_NOT_FOUND` when no process ran since
/// `since_us`; `NVML_ERROR_INSUFFICIENT_SIZE` if the list kept growing.
#[doc(alias = "nvmlDeviceGetProcessUtilization")]
pub fn process_utilization(
    dev: nvmlDevice_t,
    since_us: u64,
) -> Result<Vec<nvmlProcessUtilizationSample_t>, NvmlError> {
    let call = sym(|t| t.nvmlDeviceGetProcessUtilization)?;
    list::grow_list(|samples, count| {
        // SAFETY: `samples` holds `*count` initialised entries of the C
        // struct; both live for the whole call.
        unsafe { call(dev, samples.as_mut_ptr(), count, since_us) }
    })
}
