//! Simulated `libnvidia-ml.so.1`: NVML over the simulated device of the
//! `simgpu` crate. It reads the shared state file; `nvmlInit` registers
//! with the server (starting it if needed) without taking a process-table
//! slot, so an NVML-only process (a monitor, the loader) is not a GPU
//! process. See `docs/simgpu.md`.

mod device;
mod procs;
mod system;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use simgpu::client::Client;
use simgpu::config::{ProcessConfig, MAX_DEVICES};
use simgpu::proto::Kind;

/// `nvmlReturn_t`.
pub type NvmlReturn = u32;

/// An NVML error; the discriminant is the `nvmlReturn_t` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[repr(u32)]
pub enum NvmlErr {
    /// NVML_ERROR_UNINITIALIZED
    #[error("Uninitialized")]
    Uninitialized = 1,
    /// NVML_ERROR_INVALID_ARGUMENT
    #[error("Invalid Argument")]
    InvalidArgument = 2,
    /// NVML_ERROR_NOT_SUPPORTED
    #[error("Not Supported")]
    NotSupported = 3,
    /// NVML_ERROR_NOT_FOUND
    #[error("Not Found")]
    NotFound = 6,
    /// NVML_ERROR_INSUFFICIENT_SIZE
    #[error("Insufficient Size")]
    InsufficientSize = 7,
    /// NVML_ERROR_DRIVER_NOT_LOADED
    #[error("Driver Not Loaded")]
    DriverNotLoaded = 9,
    /// NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    #[error("Argument Version Mismatch")]
    ArgumentVersionMismatch = 25,
    /// NVML_ERROR_UNKNOWN
    #[error("Unknown Error")]
    Unknown = 999,
}

/// Runs an entry point's body: `Err` → its code, panic → `NVML_ERROR_UNKNOWN`.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), NvmlErr>) -> NvmlReturn {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => e as NvmlReturn,
        Err(_) => NvmlErr::Unknown as NvmlReturn,
    }
}

/// Writes through a caller's out-pointer; NULL is `INVALID_ARGUMENT`.
macro_rules! put {
    ($p:expr, $v:expr) => {{
        let p = $p;
        if p.is_null() {
            return Err($crate::NvmlErr::InvalidArgument);
        }
        // SAFETY: a non-NULL out-pointer from the C caller, which the API
        // contract requires to be valid for a write of its type.
        unsafe { p.write($v) }
    }};
}
pub(crate) use put;

/// Reads a caller's in/out struct; NULL is `INVALID_ARGUMENT`.
macro_rules! get {
    ($p:expr) => {{
        let p = $p;
        if p.is_null() {
            return Err($crate::NvmlErr::InvalidArgument);
        }
        // SAFETY: a non-NULL pointer from the C caller, which the API
        // contract requires to point to a valid value.
        unsafe { p.read() }
    }};
}
pub(crate) use get;

/// Copies `s` and a NUL into `buf` of `len` bytes; too small is
/// `INSUFFICIENT_SIZE`.
pub(crate) fn write_str(buf: *mut std::ffi::c_char, len: u32, s: &str) -> Result<(), NvmlErr> {
    if buf.is_null() {
        return Err(NvmlErr::InvalidArgument);
    }
    if (len as usize) < s.len() + 1 {
        return Err(NvmlErr::InsufficientSize);
    }
    // SAFETY: the caller's buffer holds `len` >= s.len() + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// The initialised library: the server connection and settings.
pub(crate) struct State {
    pub client: Client,
    pub pcfg: ProcessConfig,
    refs: u32,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Runs `f` on the initialised library; `UNINITIALIZED` before `nvmlInit`.
pub(crate) fn with<T>(f: impl FnOnce(&State) -> Result<T, NvmlErr>) -> Result<T, NvmlErr> {
    let g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    match g.as_ref() {
        Some(s) => f(s),
        None => Err(NvmlErr::Uninitialized),
    }
}

fn init() -> Result<(), NvmlErr> {
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = g.as_mut() {
        s.refs += 1;
        return Ok(());
    }
    let pcfg = ProcessConfig::from_env();
    let client = Client::connect(Kind::Observer, &pcfg).map_err(|e| {
        eprintln!("simgpu nvml: nvmlInit: {e}");
        NvmlErr::DriverNotLoaded
    })?;
    *g = Some(State {
        client,
        pcfg,
        refs: 1,
    });
    Ok(())
}

/// `nvmlInit_v2`.
///
/// # Safety
/// No preconditions (a C entry point without pointer arguments).
#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> NvmlReturn {
    guard(init)
}

/// `nvmlInit` (v1).
///
/// # Safety
/// No preconditions (a C entry point without pointer arguments).
#[no_mangle]
pub unsafe extern "C" fn nvmlInit() -> NvmlReturn {
    guard(init)
}

/// `nvmlInitWithFlags`: flags ignored.
///
/// # Safety
/// No preconditions (a C entry point without pointer arguments).
#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: u32) -> NvmlReturn {
    guard(init)
}

/// `nvmlShutdown`: the last one closes the connection.
///
/// # Safety
/// No preconditions (a C entry point without pointer arguments).
#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> NvmlReturn {
    guard(|| {
        let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
        let s = g.as_mut().ok_or(NvmlErr::Uninitialized)?;
        s.refs -= 1;
        if s.refs == 0 {
            *g = None;
        }
        Ok(())
    })
}

/// Opaque device handles: addresses inside this array.
static DEVICES: [u64; MAX_DEVICES as usize] = [0; MAX_DEVICES as usize];

/// `nvmlDevice_t`.
pub type NvmlDevice = *const u64;

/// The handle of device `i`.
pub(crate) fn handle(i: u32) -> NvmlDevice {
    &DEVICES[i as usize % DEVICES.len()]
}

/// The index of a handle, checked against the configured devices.
pub(crate) fn index(s: &State, dev: NvmlDevice) -> Result<u32, NvmlErr> {
    let base = DEVICES.as_ptr() as usize;
    let a = dev as usize;
    let i = a.wrapping_sub(base) / 8;
    if a < base || !(a - base).is_multiple_of(8) || i >= s.client.shm().config().devices as usize {
        return Err(NvmlErr::InvalidArgument);
    }
    Ok(i as u32)
}
