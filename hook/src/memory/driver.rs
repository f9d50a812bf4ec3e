//! The few driver queries the accounting policy needs, behind a trait so
//! unit tests can fake them (the allocation calls themselves are closures).

use crate::ffi::*;

pub trait Driver {
    /// The CUDA ordinal of the current context's device.
    fn current_device(&self) -> Option<usize>;
    /// The size of the allocation that contains `ptr`.
    fn allocation_size(&self, ptr: CUdeviceptr) -> Option<u64>;
    /// Device-wide used memory per NVML (context measurement).
    fn device_used(&self, dev: usize) -> Option<u64>;
}

/// The real driver.
#[derive(Debug, Clone, Copy, Default)]
pub struct Real;

impl Driver for Real {
    fn current_device(&self) -> Option<usize> {
        let mut dev: CUdevice = -1;
        let rc = real_cuda!(cuCtxGetDevice(&mut dev));
        (rc == CUDA_SUCCESS && dev >= 0).then_some(dev as usize)
    }

    fn allocation_size(&self, ptr: CUdeviceptr) -> Option<u64> {
        let mut base: CUdeviceptr = 0;
        let mut size: usize = 0;
        let rc = real_cuda!(cuMemGetAddressRange_v2(&mut base, &mut size, ptr));
        (rc == CUDA_SUCCESS).then_some(size as u64)
    }

    fn device_used(&self, dev: usize) -> Option<u64> {
        let handle = nvml_handle_for_cuda(dev)?;
        let mut m = nvmlMemory_t::default();
        let rc = real_nvml!(nvmlDeviceGetMemoryInfo(handle, &mut m));
        (rc == NVML_SUCCESS).then_some(m.used)
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, NVML's UUID spelling.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The UUID of CUDA device ordinal `dev`.
pub fn cuda_uuid(dev: usize) -> Option<String> {
    let mut d: CUdevice = 0;
    if real_cuda!(cuDeviceGet(&mut d, dev as std::ffi::c_int)) != CUDA_SUCCESS {
        return None;
    }
    let mut u = CUuuid::default();
    (real_cuda!(cuDeviceGetUuid_v2(&mut u, d)) == CUDA_SUCCESS).then(|| format_uuid(&u.bytes))
}

/// Initialises the real NVML once for the hook's own use (never shut down,
/// so the application's own init/shutdown pairs are unaffected).
pub fn nvml_ready() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| real_nvml!(nvmlInit_v2()) == NVML_SUCCESS)
}

/// The NVML handle of CUDA ordinal `dev`, matched by UUID.
pub fn nvml_handle_for_cuda(dev: usize) -> Option<nvmlDevice_t> {
    if !nvml_ready() {
        return None;
    }
    let uuid = std::ffi::CString::new(cuda_uuid(dev)?).ok()?;
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    (real_nvml!(nvmlDeviceGetHandleByUUID(uuid.as_ptr(), &mut h)) == NVML_SUCCESS).then_some(h)
}
