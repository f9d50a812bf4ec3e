//! NVML under the hook: `nvmlInit*` attach the region (nvidia-smi gets a
//! slot, as with HAMi) and fill `device_num`/`uuids` when nobody has;
//! `nvmlDeviceGetMemoryInfo(_v2)` show the limit as total and the
//! container's usage as used.

#![forbid(unsafe_code)]

use std::ffi::c_uint;
use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::region::{SharedRegion, MAX_DEVICES};

use crate::driver;
use crate::driver::DeviceIds;
use crate::ffi::*;
use crate::memory::info::virtual_info;
use crate::region::usage;
use crate::state::process;

fn after_init(rc: nvmlReturn_t) -> nvmlReturn_t {
    if rc == NVML_SUCCESS {
        if let Some(p) = process() {
            let r = p.att.region();
            if r.device_num.load(SeqCst) == 0 {
                fill_from_nvml(r);
            }
        }
    }
    rc
}

pub fn init_v1(forward: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    after_init(forward())
}

pub fn init_v2(forward: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    after_init(forward())
}

pub fn init_with_flags(forward: impl FnOnce() -> nvmlReturn_t, _flags: c_uint) -> nvmlReturn_t {
    after_init(forward())
}

fn fill_from_nvml(r: &SharedRegion) {
    let uuids = crate::devices::nvml_container_order(driver::live());
    let n = uuids.len().min(MAX_DEVICES);
    for (i, u) in uuids.iter().take(n).enumerate() {
        r.set_uuid(i, u.as_bytes());
    }
    if n > 0 {
        r.device_num.store(n as u64, SeqCst);
    }
}

/// The container index (`crate::devices`) of an NVML device: its UUID's
/// position in the region, else its NVML index (NVML lists the container's
/// devices in the container's order).
fn container_index(r: &SharedRegion, dev: nvmlDevice_t) -> Option<usize> {
    if let Some(u) = driver::live().nvml_uuid(dev) {
        let n = (r.device_num.load(SeqCst) as usize).min(MAX_DEVICES);
        for i in 0..n {
            let (bytes, len) = r.uuid(i);
            if &bytes[..len] == u.as_bytes() {
                return Some(i);
            }
        }
    }
    let index = driver::live().nvml_index(dev)?;
    Some(index as usize).filter(|i| *i < MAX_DEVICES)
}

/// `(total, free, used)` to report for `dev`, or `None` to leave the
/// driver's values.
fn virtualise(dev: nvmlDevice_t, phys_total: u64, phys_free: u64) -> Option<(u64, u64, u64)> {
    let p = process()?;
    let r = p.att.region();
    let i = container_index(r, dev)?;
    let limit = usage::limit(r, i)?;
    // Processes that exited since still fill their slots until reclaimed.
    p.att.reclaim_now_and_then();
    let used = usage::container_used(r, i);
    let (free, total) = virtual_info(Some(limit), used, phys_free, phys_total);
    Some((total, free, used))
}

pub fn memory_info(
    forward: impl FnOnce() -> nvmlReturn_t,
    dev: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    let rc = forward();
    let Some(m) = read(memory).filter(|_| rc == NVML_SUCCESS) else {
        return rc;
    };
    if let Some((total, free, used)) = virtualise(dev, m.total, m.free) {
        write(memory, nvmlMemory_t { total, free, used });
    }
    rc
}

pub fn memory_info_v2(
    forward: impl FnOnce() -> nvmlReturn_t,
    dev: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    let rc = forward();
    let Some(m) = read(memory).filter(|_| rc == NVML_SUCCESS) else {
        return rc;
    };
    if let Some((total, free, used)) = virtualise(dev, m.total, m.free) {
        write(
            memory,
            nvmlMemory_v2_t {
                total,
                free,
                used,
                ..m
            },
        );
    }
    rc
}
