//! Devices: count, handles, UUIDs, indices, memory.

use std::ffi::{c_char, c_uint, CStr};

use super::{sym, NvmlError};
use crate::ffi::*;

/// The number of devices NVML lists.
///
/// # Errors
/// NVML's code.
#[doc(alias = "nvmlDeviceGetCount_v2")]
pub fn count() -> Result<c_uint, NvmlError> {
    let f = sym(|t| t.nvmlDeviceGetCount_v2)?;
    let mut n: c_uint = 0;
    // SAFETY: `n` is a live local NVML writes one unsigned int to.
    NvmlError::result(unsafe { f(&mut n) })?;
    Ok(n)
}

/// The handle of NVML's device `index`.
///
/// # Errors
/// NVML's code.
#[doc(alias = "nvmlDeviceGetHandleByIndex_v2")]
pub fn by_index(index: c_uint) -> Result<nvmlDevice_t, NvmlError> {
    let f = sym(|t| t.nvmlDeviceGetHandleByIndex_v2)?;
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: `h` is a live local NVML writes one handle to.
    NvmlError::result(unsafe { f(index, &mut h) })?;
    Ok(h)
}

/// The handle of the device with this UUID.
///
/// # Errors
/// NVML's code (`NVML_ERROR_NOT_FOUND` for a UUID it does not list).
#[doc(alias = "nvmlDeviceGetHandleByUUID")]
pub fn by_uuid(uuid: &CStr) -> Result<nvmlDevice_t, NvmlError> {
    let f = sym(|t| t.nvmlDeviceGetHandleByUUID)?;
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: `uuid` is NUL-terminated and outlives the call; `h` is a live
    // local NVML writes one handle to.
    NvmlError::result(unsafe { f(uuid.as_ptr(), &mut h) })?;
    Ok(h)
}

/// The UUID of `dev` as NVML spells it (`GPU-…`, `MIG-…`).
///
/// # Errors
/// NVML's code; `NVML_ERROR_UNKNOWN` for a UUID that is not UTF-8.
#[doc(alias = "nvmlDeviceGetUUID")]
pub fn uuid(dev: nvmlDevice_t) -> Result<String, NvmlError> {
    const LEN: usize = vgpu_common::region::UUID_LEN;
    let f = sym(|t| t.nvmlDeviceGetUUID)?;
    let mut buf = [0u8; LEN];
    // SAFETY: `buf` is a live local of `LEN` bytes, the length passed;
    // NVML writes at most that many (NUL included).
    NvmlError::result(unsafe { f(dev, buf.as_mut_ptr().cast::<c_char>(), LEN as c_uint) })?;
    // NVML NUL-terminates; the last byte stays 0 whatever it wrote.
    buf[LEN - 1] = 0;
    CStr::from_bytes_until_nul(&buf)
        .ok()
        .and_then(|s| s.to_str().ok())
        .map(str::to_owned)
        .ok_or(NvmlError(NVML_ERROR_UNKNOWN))
}

/// NVML's index of `dev`.
///
/// # Errors
/// NVML's code.
#[doc(alias = "nvmlDeviceGetIndex")]
pub fn index(dev: nvmlDevice_t) -> Result<c_uint, NvmlError> {
    let f = sym(|t| t.nvmlDeviceGetIndex)?;
    let mut i: c_uint = 0;
    // SAFETY: `i` is a live local NVML writes one unsigned int to.
    NvmlError::result(unsafe { f(dev, &mut i) })?;
    Ok(i)
}

/// The device's memory (total, free, used) as NVML reports it.
///
/// # Errors
/// NVML's code.
#[doc(alias = "nvmlDeviceGetMemoryInfo")]
pub fn memory(dev: nvmlDevice_t) -> Result<nvmlMemory_t, NvmlError> {
    let f = sym(|t| t.nvmlDeviceGetMemoryInfo)?;
    let mut m = nvmlMemory_t::default();
    // SAFETY: `m` is a live local of nvmlMemory_t's layout NVML writes to.
    NvmlError::result(unsafe { f(dev, &mut m) })?;
    Ok(m)
}

/// The device's utilization samples (percent of the time a kernel ran)
/// since `since_us` (Unix µs), every internal sample period (1/6 s to 1 s)
/// and not just the last one.
///
/// # Errors
/// NVML's code; `NVML_ERROR_UNKNOWN` when the samples are not unsigned
/// integers.
#[doc(alias = "nvmlDeviceGetSamples")]
pub fn utilization_samples(dev: nvmlDevice_t, since_us: u64) -> Result<Vec<u32>, NvmlError> {
    let f = sym(|t| t.nvmlDeviceGetSamples)?;
    let mut v = [nvmlSample_t::default(); 64];
    let mut count = v.len() as c_uint;
    let mut kind: c_uint = 0;
    // SAFETY: `v` holds `count` initialised entries of the C struct; `kind`
    // and `count` are live locals for the whole call.
    NvmlError::result(unsafe {
        f(
            dev,
            NVML_GPU_UTILIZATION_SAMPLES,
            since_us,
            &mut kind,
            &mut count,
            v.as_mut_ptr(),
        )
    })?;
    if kind != NVML_VALUE_TYPE_UNSIGNED_INT {
        return Err(NvmlError(NVML_ERROR_UNKNOWN));
    }
    let n = (count as usize).min(v.len());
    // The union's `unsigned int` is its low 4 bytes (little-endian).
    Ok(v[..n].iter().map(|s| s.value as u32).collect())
}

/// The device's utilization over its last sample period.
///
/// # Errors
/// NVML's code.
#[doc(alias = "nvmlDeviceGetUtilizationRates")]
pub fn utilization_rates(dev: nvmlDevice_t) -> Result<nvmlUtilization_t, NvmlError> {
    let f = sym(|t| t.nvmlDeviceGetUtilizationRates)?;
    let mut u = nvmlUtilization_t::default();
    // SAFETY: `u` is a live local of the C struct's layout.
    NvmlError::result(unsafe { f(dev, &mut u) })?;
    Ok(u)
}
