//! `cuMemGetInfo_v2` and `cuDeviceTotalMem_v2` under a limit: total is
//! `min(limit, physical)`, used is the container's usage, free is
//! `total - used` clamped at 0 (and never more than physically free).
//! Without a limit the driver's values are returned untouched.

use crate::driver;
use crate::driver::{Context, Memory, Nvml};
use crate::ffi::*;
use crate::region::usage;
use crate::state::{process, Process};
use crate::world::{self, Background, Identity};

/// `(free, total)` as the application should see them on `dev` under
/// `limit` (`None`: no limit).
pub fn virtual_info(limit: Option<u64>, used: u64, phys_free: u64, phys_total: u64) -> (u64, u64) {
    let Some(limit) = limit else {
        return (phys_free, phys_total);
    };
    let total = limit.min(phys_total);
    (total.saturating_sub(used).min(phys_free), total)
}

pub fn mem_get_info(
    forward: impl FnOnce() -> CUresult,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    mem_get_info_in(driver::live(), world::live(), process, forward, free, total)
}

/// `cuMemGetInfo_v2` over the driver `d` for the process state `process`
/// gives, asked only once the driver has answered the application's call
/// (`forward`).
pub(crate) fn mem_get_info_in<'a>(
    d: &(impl Context + Memory + Nvml),
    w: &(impl Identity + Background),
    process: impl FnOnce() -> Option<&'a Process>,
    forward: impl FnOnce() -> CUresult,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    let rc = forward();
    if rc != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return rc;
    }
    let (Some(p), Some(dev)) = (process(), d.current_device()) else {
        return rc;
    };
    // Processes that exited since still fill their slots until reclaimed.
    p.att.reclaim_now_and_then();
    // Memory no call shows (GPU code, peers' buffers) is counted by the
    // background look within a second, so this answer costs no NVML query;
    // without that thread, the look runs here.
    if w.offload_failed() {
        super::modules::reconcile(p, d, w, dev);
    }
    let r = p.att.region();
    let (f, t) = virtual_info(
        usage::limit(r, dev),
        usage::container_used(r, dev),
        read(free).unwrap_or(0) as u64,
        read(total).unwrap_or(0) as u64,
    );
    write(free, f as usize);
    write(total, t as usize);
    rc
}

pub fn device_total_mem(
    forward: impl FnOnce() -> CUresult,
    bytes: *mut usize,
    dev: CUdevice,
) -> CUresult {
    let rc = forward();
    if rc != CUDA_SUCCESS || bytes.is_null() {
        return rc;
    }
    let (Some(p), Some(d)) = (process(), crate::devices::index_of(driver::live(), dev)) else {
        return rc;
    };
    if let Some(lim) = usage::limit(p.att.region(), d) {
        let phys = read(bytes).unwrap_or(0) as u64;
        write(bytes, lim.min(phys) as usize);
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtualised() {
        const G: u64 = 1 << 30;
        assert_eq!(virtual_info(None, 5, 70 * G, 80 * G), (70 * G, 80 * G));
        assert_eq!(virtual_info(Some(G), G / 4, 70 * G, 80 * G), (3 * G / 4, G));
        assert_eq!(
            virtual_info(Some(G), 2 * G, 70 * G, 80 * G),
            (0, G),
            "clamped, no wrap"
        );
        assert_eq!(
            virtual_info(Some(100 * G), 0, 70 * G, 80 * G),
            (70 * G, 80 * G)
        );
        assert_eq!(virtual_info(Some(G), 0, G / 2, 80 * G), (G / 2, G));
    }
}
