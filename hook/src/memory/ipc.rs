//! IPC imports: the size of an opened handle is known only after the open
//! (`cuMemGetAddressRange_v2`); if counting it would pass the limit the
//! mapping is closed again and `CUDA_ERROR_OUT_OF_MEMORY` returned.

use super::limit;
use super::target;
use super::track::Entry;
use super::uncounted;
use crate::driver;
use crate::driver::Memory;
use crate::ffi::*;
use crate::region::Kind;
use crate::state::process;

pub fn open(
    forward: impl Fn() -> CUresult,
    dptr: *mut CUdeviceptr,
    _handle: CUipcMemHandle,
    _flags: std::ffi::c_uint,
) -> CUresult {
    let Some((p, dev)) = target(driver::live()).filter(|_| !dptr.is_null()) else {
        return forward();
    };
    let rc = forward();
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let ptr = read(dptr).unwrap_or(0);
    let Some(bytes) = driver::live().allocation_size(ptr) else {
        vlog_once!(crate::log::WARN, "cannot size an IPC import; not counted");
        return rc;
    };
    let Some(r) = limit::reserve(&p.att, dev, bytes, Kind::Data) else {
        let _ = driver::live().ipc_close(ptr);
        write(dptr, 0);
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    r.commit();
    if let Some(old) = p
        .ptrs
        .insert(ptr, Entry::here(driver::live(), dev, bytes, Kind::Data))
    {
        limit::release_counted(&p.att, old.dev, old.bytes, old.kind);
    }
    rc
}

pub fn close(forward: impl FnOnce() -> CUresult, dptr: CUdeviceptr) -> CUresult {
    match process() {
        Some(p) => uncounted(p, &p.ptrs, dptr, forward),
        None => forward(),
    }
}
