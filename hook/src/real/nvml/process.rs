//! The compute processes NVML lists on a device.

use std::ffi::c_uint;

use super::{sym, NvmlError};
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
    let mut cap: usize = 64;
    for _ in 0..4 {
        let mut infos = vec![nvmlProcessInfo_t::default(); cap];
        let mut count = cap as c_uint;
        // SAFETY: `infos` holds `count` initialised entries of the C struct;
        // `count` and `infos` are live locals for the whole call.
        let rc = unsafe { call(dev, &mut count, infos.as_mut_ptr()) };
        match rc {
            NVML_SUCCESS => {
                infos.truncate((count as usize).min(cap));
                return Ok(infos);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => cap = (count as usize).max(cap) + 16,
            _ => return Err(NvmlError(rc)),
        }
    }
    Err(NvmlError(NVML_ERROR_INSUFFICIENT_SIZE))
}
