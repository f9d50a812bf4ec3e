//! CUDA IPC: a handle names (exporter host PID, device, base, size); opening
//! it maps a new address in the importer at no device-memory cost (the
//! exporter already pays), as on a real GPU.

use std::ffi::c_uint;

use crate::state::{with, Alloc, AllocKind};
use crate::{guard, put, CUdeviceptr, CUresult, CuErr};

/// `CUipcMemHandle` (64 opaque bytes, passed by value).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IpcMemHandle {
    reserved: [u8; 64],
}

const MAGIC: &[u8; 8] = b"SIMGPUIP";

fn field(b: &[u8; 64], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// `cuIpcGetMemHandle`: `dptr` must be the base of a `cuMemAlloc`
/// allocation.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(
    handle: *mut IpcMemHandle,
    dptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        let (pid, a) = with(|d| {
            let a = *d.allocs.get(&dptr).ok_or(CuErr::InvalidValue)?;
            if a.kind != AllocKind::Device {
                return Err(CuErr::InvalidValue);
            }
            Ok((d.client.host_pid(), a))
        })?;
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&u64::from(pid).to_le_bytes());
        b[16..24].copy_from_slice(&u64::from(a.dev).to_le_bytes());
        b[24..32].copy_from_slice(&dptr.to_le_bytes());
        b[32..40].copy_from_slice(&a.size.to_le_bytes());
        put!(handle, IpcMemHandle { reserved: b });
        Ok(())
    })
}

/// `cuIpcOpenMemHandle_v2`: maps the exporter's allocation; costs nothing.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pdptr: *mut CUdeviceptr,
    handle: IpcMemHandle,
    _flags: c_uint,
) -> CUresult {
    guard(|| {
        let b = handle.reserved;
        if &b[0..8] != MAGIC || pdptr.is_null() {
            return Err(CuErr::InvalidValue);
        }
        let (dev, size) = (field(&b, 16) as u32, field(&b, 32));
        let p = with(|d| {
            let (ctx, _) = d.current_ctx()?;
            if dev >= d.cfg.devices || size == 0 {
                return Err(CuErr::InvalidValue);
            }
            Ok(d.add_alloc(Alloc {
                size,
                dev,
                charged: 0,
                kind: AllocKind::Ipc,
                ctx,
            }))
        })?;
        put!(pdptr, p);
        Ok(())
    })
}

/// `cuIpcCloseMemHandle`.
#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    guard(|| {
        with(|d| match d.allocs.get(&dptr) {
            Some(a) if a.kind == AllocKind::Ipc => {
                d.allocs.remove(&dptr);
                Ok(())
            }
            _ => Err(CuErr::InvalidValue),
        })
    })
}
