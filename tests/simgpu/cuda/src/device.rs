//! `cuInit`, the driver version and device queries.

use std::ffi::{c_char, c_int};

use crate::state::{self, with};
use crate::{cstr, guard, put, write_cstr, CUdevice, CUresult, CuErr};

/// The driver version reported (CUDA 13.0).
pub(crate) const DRIVER_VERSION: i32 = 13000;

/// The 16 UUID bytes of a device; NVML's `GPU-…` string spells the same
/// bytes.
pub(crate) fn uuid_bytes(dev: u32) -> [u8; 16] {
    simgpu::model::device_uuid(dev)
}

/// `cuInit`: flags must be 0.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: u32) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(CuErr::InvalidValue);
        }
        state::init()
    })
}

/// `cuDriverGetVersion`: 13000. Works before `cuInit`.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    guard(|| {
        put!(version, DRIVER_VERSION);
        Ok(())
    })
}

/// `cuDeviceGet`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard(|| {
        with(|d| d.dev(ordinal))?;
        put!(device, ordinal as CUdevice);
        Ok(())
    })
}

/// `cuDeviceGetCount`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard(|| {
        let n = with(|d| Ok(d.visible.len()))?;
        put!(count, n as c_int);
        Ok(())
    })
}

/// `cuDeviceGetName`: "NVIDIA SimGPU".
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        with(|d| d.dev(dev))?;
        write_cstr(name, len, simgpu::model::DEVICE_NAME)
    })
}

/// `cuDeviceGetUuid`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    guard(|| {
        let d = with(|d| d.dev(dev))?;
        put!(uuid, uuid_bytes(d));
        Ok(())
    })
}

/// `cuDeviceGetUuid_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    // SAFETY: same contract as cuDeviceGetUuid.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

/// `cuDeviceGetPCIBusId`: `0000:XX:00.0` with XX = 0x18 + ordinal.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let d = with(|d| d.dev(dev))?;
        write_cstr(bus_id, len, &simgpu::model::pci_bus_id(d))
    })
}

/// `cuDeviceGetByPCIBusId`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(
    dev: *mut CUdevice,
    bus_id: *const c_char,
) -> CUresult {
    guard(|| {
        let want = cstr!(bus_id).to_ascii_lowercase();
        let ordinal = with(|d| {
            let found = d.visible.iter().position(|&i| {
                let id = simgpu::model::pci_bus_id(i).to_ascii_lowercase();
                id == want || id.strip_prefix("0000:") == Some(want.as_str())
            });
            found.ok_or(CuErr::InvalidValue)
        })?;
        put!(dev, ordinal as CUdevice);
        Ok(())
    })
}

/// `cuDeviceTotalMem_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(|| {
        let total = with(|d| {
            d.dev(dev)?;
            Ok(d.cfg.memory)
        })?;
        put!(bytes, total as usize);
        Ok(())
    })
}

/// `cuDeviceComputeCapability` (deprecated): 9.0.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        with(|d| d.dev(dev))?;
        put!(major, 9);
        put!(minor, 0);
        Ok(())
    })
}

/// `cuDeviceCanAccessPeer`: distinct devices can.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    guard(|| {
        with(|d| {
            d.dev(dev)?;
            d.dev(peer)
        })?;
        put!(can, c_int::from(dev != peer));
        Ok(())
    })
}

/// Value of a `CUdevice_attribute` for the simulated device.
fn attribute(attr: c_int, sms: u32, dev: u32) -> Option<c_int> {
    Some(match attr {
        1 => 1024,                 // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,             // MAX_BLOCK_DIM_X / Y
        4 => 64,                   // MAX_BLOCK_DIM_Z
        5 => i32::MAX,             // MAX_GRID_DIM_X
        6 | 7 => 65535,            // MAX_GRID_DIM_Y / Z
        8 => 49152,                // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,                // TOTAL_CONSTANT_MEMORY
        10 => 32,                  // WARP_SIZE
        11 => i32::MAX,            // MAX_PITCH
        12 => 65536,               // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,           // CLOCK_RATE (kHz)
        14 => 512,                 // TEXTURE_ALIGNMENT
        15 => 1,                   // GPU_OVERLAP
        16 => sms as c_int,        // MULTIPROCESSOR_COUNT
        17 => 0,                   // KERNEL_EXEC_TIMEOUT
        18 => 0,                   // INTEGRATED
        19 => 1,                   // CAN_MAP_HOST_MEMORY
        20 => 0,                   // COMPUTE_MODE (default)
        31 => 1,                   // CONCURRENT_KERNELS
        32 => 1,                   // ECC_ENABLED
        33 => 0x18 + dev as c_int, // PCI_BUS_ID
        34 => 0,                   // PCI_DEVICE_ID
        35 => 0,                   // TCC_DRIVER
        36 => 2_619_000,           // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,                // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,            // L2_CACHE_SIZE
        39 => 2048,                // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,                   // ASYNC_ENGINE_COUNT
        41 => 1,                   // UNIFIED_ADDRESSING
        50 => 0,                   // PCI_DOMAIN_ID
        75 => 9,                   // COMPUTE_CAPABILITY_MAJOR
        76 => 0,                   // COMPUTE_CAPABILITY_MINOR
        81 => 233_472,             // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,               // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,                   // MANAGED_MEMORY
        84 => 0,                   // MULTI_GPU_BOARD
        86 => 1,                   // HOST_NATIVE_ATOMIC_SUPPORTED
        88 => 1,                   // PAGEABLE_MEMORY_ACCESS
        89 => 1,                   // CONCURRENT_MANAGED_ACCESS
        95 => 1,                   // COOPERATIVE_LAUNCH
        97 => 232_448,             // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        102 => 1,                  // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        106 => 32,                 // MAX_BLOCKS_PER_MULTIPROCESSOR
        115 => 1,                  // MEMORY_POOLS_SUPPORTED
        0 | 1000.. => return None,
        a if a < 0 => return None,
        _ => 0,
    })
}

/// `cuDeviceGetAttribute`: MULTIPROCESSOR_COUNT (16) is `SIMGPU_SMS`,
/// MAX_THREADS_PER_MULTIPROCESSOR (39) is 2048, the rest H100-like.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let (d, sms) = with(|d| Ok((d.dev(dev)?, d.cfg.sms)))?;
        put!(pi, attribute(attrib, sms, d).ok_or(CuErr::InvalidValue)?);
        Ok(())
    })
}
