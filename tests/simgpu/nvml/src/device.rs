//! Device queries: count, handles, identity, memory, utilization.

use std::ffi::{c_char, c_int, CStr};

use crate::{get, guard, handle, index, put, with, write_str, NvmlDevice, NvmlErr, NvmlReturn};

fn count(c: *mut u32) -> Result<(), NvmlErr> {
    let n = with(|s| Ok(s.client.shm().config().devices))?;
    put!(c, n);
    Ok(())
}

/// `nvmlDeviceGetCount_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(c: *mut u32) -> NvmlReturn {
    guard(|| count(c))
}

/// `nvmlDeviceGetCount`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(c: *mut u32) -> NvmlReturn {
    guard(|| count(c))
}

fn by_index(i: u32, dev: *mut NvmlDevice) -> Result<(), NvmlErr> {
    with(|s| {
        if i < s.client.shm().config().devices {
            Ok(())
        } else {
            Err(NvmlErr::InvalidArgument)
        }
    })?;
    put!(dev, handle(i));
    Ok(())
}

/// `nvmlDeviceGetHandleByIndex_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(i: u32, dev: *mut NvmlDevice) -> NvmlReturn {
    guard(|| by_index(i, dev))
}

/// `nvmlDeviceGetHandleByIndex`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(i: u32, dev: *mut NvmlDevice) -> NvmlReturn {
    guard(|| by_index(i, dev))
}

fn find(pred: impl Fn(u32) -> bool, dev: *mut NvmlDevice) -> Result<(), NvmlErr> {
    let n = with(|s| Ok(s.client.shm().config().devices))?;
    let i = (0..n).find(|&i| pred(i)).ok_or(NvmlErr::NotFound)?;
    put!(dev, handle(i));
    Ok(())
}

fn arg_str<'a>(p: *const c_char) -> Result<&'a str, NvmlErr> {
    if p.is_null() {
        return Err(NvmlErr::InvalidArgument);
    }
    // SAFETY: a non-NULL NUL-terminated string from the caller (contract).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| NvmlErr::InvalidArgument)
}

/// `nvmlDeviceGetHandleByUUID`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    dev: *mut NvmlDevice,
) -> NvmlReturn {
    guard(|| {
        let want = arg_str(uuid)?.to_ascii_lowercase();
        find(
            |i| simgpu::model::device_uuid_string(i).to_ascii_lowercase() == want,
            dev,
        )
    })
}

fn nvml_bus_id(i: u32) -> String {
    format!("0000{}", simgpu::model::pci_bus_id(i).to_ascii_uppercase())
}

fn by_pci(bus: *const c_char, dev: *mut NvmlDevice) -> Result<(), NvmlErr> {
    let want = arg_str(bus)?.to_ascii_uppercase();
    find(
        |i| nvml_bus_id(i) == want || simgpu::model::pci_bus_id(i).to_ascii_uppercase() == want,
        dev,
    )
}

/// `nvmlDeviceGetHandleByPciBusId_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus: *const c_char,
    dev: *mut NvmlDevice,
) -> NvmlReturn {
    guard(|| by_pci(bus, dev))
}

/// `nvmlDeviceGetHandleByPciBusId`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus: *const c_char,
    dev: *mut NvmlDevice,
) -> NvmlReturn {
    guard(|| by_pci(bus, dev))
}

/// `nvmlDeviceGetIndex`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: NvmlDevice, i: *mut u32) -> NvmlReturn {
    guard(|| {
        let x = with(|s| index(s, dev))?;
        put!(i, x);
        Ok(())
    })
}

/// `nvmlDeviceGetMinorNumber`: the index.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(dev: NvmlDevice, minor: *mut u32) -> NvmlReturn {
    guard(|| {
        let x = with(|s| index(s, dev))?;
        put!(minor, x);
        Ok(())
    })
}

/// `nvmlDeviceGetName`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    dev: NvmlDevice,
    name: *mut c_char,
    len: u32,
) -> NvmlReturn {
    guard(|| {
        with(|s| index(s, dev))?;
        write_str(name, len, simgpu::model::DEVICE_NAME)
    })
}

/// `nvmlDeviceGetUUID`: `GPU-…`, the same bytes as `cuDeviceGetUuid`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    dev: NvmlDevice,
    uuid: *mut c_char,
    len: u32,
) -> NvmlReturn {
    guard(|| {
        let i = with(|s| index(s, dev))?;
        write_str(uuid, len, &simgpu::model::device_uuid_string(i))
    })
}

/// `nvmlDeviceGetCudaComputeCapability`: 9.0.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    dev: NvmlDevice,
    major: *mut c_int,
    minor: *mut c_int,
) -> NvmlReturn {
    guard(|| {
        with(|s| index(s, dev))?;
        put!(major, 9);
        put!(minor, 0);
        Ok(())
    })
}

/// `nvmlPciInfo_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfo {
    bus_id_legacy: [u8; 16],
    domain: u32,
    bus: u32,
    device: u32,
    pci_device_id: u32,
    pci_subsystem_id: u32,
    bus_id: [u8; 32],
}

fn fill(dst: &mut [u8], s: &str) {
    let n = s.len().min(dst.len() - 1);
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// `nvmlDeviceGetPciInfo_v3`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(dev: NvmlDevice, pci: *mut PciInfo) -> NvmlReturn {
    guard(|| {
        let i = with(|s| index(s, dev))?;
        let mut p = PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0x18 + i,
            device: 0,
            pci_device_id: 0x2330_10de,
            pci_subsystem_id: 0x16c1_10de,
            bus_id: [0; 32],
        };
        fill(
            &mut p.bus_id_legacy,
            &simgpu::model::pci_bus_id(i).to_ascii_uppercase(),
        );
        fill(&mut p.bus_id, &nvml_bus_id(i));
        put!(pci, p);
        Ok(())
    })
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemoryV2 {
    version: u32,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2` version word: `sizeof | 2 << 24`.
const MEMORY_V2: u32 = std::mem::size_of::<MemoryV2>() as u32 | (2 << 24);

fn mem_info(dev: NvmlDevice) -> Result<(u64, u64, u64), NvmlErr> {
    with(|s| {
        let i = index(s, dev)?;
        let (free, total) = simgpu::memory::device_info(s.client.shm(), i);
        Ok((total, free, total - free))
    })
}

/// `nvmlDeviceGetMemoryInfo`: all processes' usage, contexts included.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    dev: NvmlDevice,
    memory: *mut Memory,
) -> NvmlReturn {
    guard(|| {
        let (total, free, used) = mem_info(dev)?;
        put!(memory, Memory { total, free, used });
        Ok(())
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: `version` must be `nvmlMemory_v2`;
/// `reserved` is 0.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: NvmlDevice,
    memory: *mut MemoryV2,
) -> NvmlReturn {
    guard(|| {
        let m = get!(memory as *const MemoryV2);
        if m.version != MEMORY_V2 {
            return Err(NvmlErr::ArgumentVersionMismatch);
        }
        let (total, free, used) = mem_info(dev)?;
        put!(
            memory,
            MemoryV2 {
                version: m.version,
                total,
                reserved: 0,
                free,
                used,
            }
        );
        Ok(())
    })
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Utilization {
    gpu: u32,
    memory: u32,
}

/// `nvmlDeviceGetUtilizationRates`: `gpu` is the percentage of the last
/// `SIMGPU_SAMPLE_MS` the device was running kernels; `memory` is half of
/// it (a stand-in for memory-bandwidth use).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    dev: NvmlDevice,
    util: *mut Utilization,
) -> NvmlReturn {
    guard(|| {
        let gpu = with(|s| {
            let i = index(s, dev)?;
            Ok(simgpu::timeline::utilization(
                s.client.shm(),
                i,
                s.pcfg.sample_ms * 1_000_000,
            ))
        })?;
        put!(
            util,
            Utilization {
                gpu,
                memory: gpu / 2
            }
        );
        Ok(())
    })
}

/// `nvmlSample_t`: CPU timestamp (Unix µs) and an 8-byte value union.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    time_stamp: u64,
    value: u64,
}

/// `NVML_GPU_UTILIZATION_SAMPLES`.
const GPU_UTILIZATION_SAMPLES: u32 = 1;
/// `NVML_VALUE_TYPE_UNSIGNED_INT`.
const VALUE_TYPE_UNSIGNED_INT: u32 = 1;

/// `nvmlDeviceGetSamples`, GPU utilization only: one sample, the percent of
/// the span since `last_seen` (see `procs::sampled_span_ns`) the device
/// was running kernels, as an `unsigned int`. Other sample types are
/// `NOT_SUPPORTED`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSamples(
    dev: NvmlDevice,
    kind: u32,
    last_seen: u64,
    val_type: *mut u32,
    count: *mut u32,
    samples: *mut Sample,
) -> NvmlReturn {
    guard(|| {
        if kind != GPU_UTILIZATION_SAMPLES {
            return Err(NvmlErr::NotSupported);
        }
        let util = with(|s| {
            let i = index(s, dev)?;
            let span = crate::procs::sampled_span_ns(s.pcfg.sample_ms, last_seen);
            Ok(simgpu::timeline::utilization(s.client.shm(), i, span))
        })?;
        if !val_type.is_null() {
            put!(val_type, VALUE_TYPE_UNSIGNED_INT);
        }
        let now_us = simgpu::clock::real_ns() / 1_000;
        crate::procs::fill(
            count,
            samples,
            vec![Sample {
                time_stamp: now_us,
                value: u64::from(util),
            }],
        )
    })
}
