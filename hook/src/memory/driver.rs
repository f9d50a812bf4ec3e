//! The few driver queries the accounting policy needs, behind a trait so
//! unit tests can fake them (the allocation calls themselves are closures).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::time::{Duration, Instant};

use crate::ffi::*;

pub trait Driver {
    /// The container index (`crate::devices`) of the current context's
    /// device.
    fn current_device(&self) -> Option<usize>;
    /// The size of the allocation that contains `ptr`.
    fn allocation_size(&self, ptr: CUdeviceptr) -> Option<u64>;
    /// Device-wide used memory per NVML (context measurement).
    fn device_used(&self, dev: usize) -> Option<u64>;
    /// `(host pid, used bytes)` of the processes NVML lists on `dev`;
    /// entries whose memory is not available are left out.
    fn processes(&self, _dev: usize) -> Option<Vec<(u32, u64)>> {
        None
    }
    /// This process's host PID when it is known without a guess (the
    /// process runs in the initial PID namespace).
    fn own_host_pid(&self) -> Option<u32> {
        None
    }
    /// This process's PID in its own PID namespace when that is not the
    /// initial one: the PID the driver lists it under to its own
    /// container's callers (R580 does; older drivers may list host PIDs).
    fn own_ns_pid(&self) -> Option<u32> {
        None
    }
    /// The context size of `dev` measured by another process of the
    /// container (the sidecar).
    fn shared_ctx_size(&self, _dev: usize) -> Option<u64> {
        None
    }
    /// Shares an exactly measured context size with the container.
    fn set_shared_ctx_size(&self, _dev: usize, _bytes: u64) {}
    /// Serialises context measurement node-wide (`/tmp/vgpulock/lock`).
    fn node_lock(&self) -> Option<NodeLock> {
        None
    }
}

/// The real driver.
#[derive(Debug, Clone, Copy, Default)]
pub struct Real;

/// The calling thread's current context (0: none, or no driver).
pub fn current_context() -> u64 {
    let mut ctx: CUcontext = std::ptr::null_mut();
    if real_cuda!(cuCtxGetCurrent(&mut ctx)) == CUDA_SUCCESS {
        ctx as u64
    } else {
        0
    }
}

impl Driver for Real {
    fn current_device(&self) -> Option<usize> {
        let mut dev: CUdevice = -1;
        if real_cuda!(cuCtxGetDevice(&mut dev)) != CUDA_SUCCESS {
            return None;
        }
        crate::devices::index_of(dev)
    }

    fn allocation_size(&self, ptr: CUdeviceptr) -> Option<u64> {
        let mut base: CUdeviceptr = 0;
        let mut size: usize = 0;
        let rc = real_cuda!(cuMemGetAddressRange_v2(&mut base, &mut size, ptr));
        (rc == CUDA_SUCCESS).then_some(size as u64)
    }

    fn device_used(&self, dev: usize) -> Option<u64> {
        let handle = crate::devices::nvml_handle(dev)?;
        let mut m = nvmlMemory_t::default();
        let rc = real_nvml!(nvmlDeviceGetMemoryInfo(handle, &mut m));
        (rc == NVML_SUCCESS).then_some(m.used)
    }

    fn processes(&self, dev: usize) -> Option<Vec<(u32, u64)>> {
        running_processes(crate::devices::nvml_handle(dev)?)
    }

    fn own_host_pid(&self) -> Option<u32> {
        in_initial_pid_ns().then(std::process::id)
    }

    fn own_ns_pid(&self) -> Option<u32> {
        (!in_initial_pid_ns()).then(std::process::id)
    }

    fn shared_ctx_size(&self, dev: usize) -> Option<u64> {
        crate::sm::sidecar::shared()?.devs.get(dev)?.ctx_bytes()
    }

    fn set_shared_ctx_size(&self, dev: usize, bytes: u64) {
        if let Some(d) = crate::sm::sidecar::shared().and_then(|s| s.devs.get(dev)) {
            d.set_ctx_bytes(bytes);
        }
    }

    fn node_lock(&self) -> Option<NodeLock> {
        NodeLock::take()
    }
}

/// `PROC_PID_INIT_INO`: the inode of the initial PID namespace.
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// Whether this process runs in the initial PID namespace, so its PID is
/// the host PID NVML reports. `/proc/self/ns/pid` names the process's own
/// namespace whatever `/proc` is mounted (`NSpid` in `/proc/self/status`
/// is relative to the `/proc` mount's namespace, so it is not used).
pub fn in_initial_pid_ns() -> bool {
    static INIT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *INIT.get_or_init(|| {
        std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .is_some_and(|l| l.as_os_str() == format!("pid:[{INIT_PID_NS_INO}]").as_str())
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v3` (else `_v2`, same struct) as
/// `(pid, used bytes)`; entries without a memory figure are dropped. PIDs
/// are as the caller's PID namespace sees them (host PIDs on the host).
pub fn running_processes(handle: nvmlDevice_t) -> Option<Vec<(u32, u64)>> {
    Some(
        compute_processes(handle)?
            .iter()
            .filter(|i| i.used_gpu_memory != NVML_VALUE_NOT_AVAILABLE_U64)
            .map(|i| (i.pid, i.used_gpu_memory))
            .collect(),
    )
}

/// Every compute process on the device, as NVML lists it to this process.
pub fn compute_processes(handle: nvmlDevice_t) -> Option<Vec<nvmlProcessInfo_t>> {
    let fns = crate::real::nvml::fns()?;
    let call = fns
        .nvmlDeviceGetComputeRunningProcesses_v3
        .or(fns.nvmlDeviceGetComputeRunningProcesses_v2)?;
    let mut cap: usize = 64;
    for _ in 0..4 {
        let mut infos = vec![nvmlProcessInfo_t::default(); cap];
        let mut count = cap as std::ffi::c_uint;
        // SAFETY: `infos` holds `count` initialised entries of the C struct;
        // `count` and `infos` are live locals for the whole call.
        let rc = unsafe { call(handle, &mut count, infos.as_mut_ptr()) };
        match rc {
            NVML_SUCCESS => {
                infos.truncate((count as usize).min(cap));
                return Some(infos);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => cap = (count as usize).max(cap) + 16,
            _ => return None,
        }
    }
    None
}

const NODE_LOCK_DIR: &str = "/tmp/vgpulock";
const NODE_LOCK: &str = "/tmp/vgpulock/lock";
const NODE_LOCK_WAIT: Duration = Duration::from_secs(3);

/// `flock` on the node-wide lock file (HAMi mounts `/tmp/vgpulock` into
/// every container), released on drop (and by the kernel if the process
/// dies). The directory and file are created 0777 / 0666 when missing,
/// with `chmod` rather than by touching the process's umask.
#[derive(Debug)]
pub struct NodeLock(File);

impl NodeLock {
    pub fn take() -> Option<Self> {
        let dir = std::path::Path::new(NODE_LOCK_DIR);
        if !dir.is_dir() && std::fs::create_dir(dir).is_ok() {
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777));
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(NODE_LOCK)
            .map_err(|e| {
                vlog_once!(
                    crate::log::WARN,
                    "{NODE_LOCK}: {e}; measuring contexts without the node lock"
                )
            })
            .ok()?;
        if f.metadata()
            .is_ok_and(|m| m.permissions().mode() & 0o777 != 0o666)
        {
            // Only the owner can chmod; others' failures are harmless.
            let _ = f.set_permissions(std::fs::Permissions::from_mode(0o666));
        }
        let deadline = Instant::now() + NODE_LOCK_WAIT;
        loop {
            // SAFETY: flock on an fd owned by `f`.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Some(Self(f));
            }
            if Instant::now() >= deadline {
                vlog!(
                    crate::log::WARN,
                    "{NODE_LOCK} busy for {NODE_LOCK_WAIT:?}; measuring the context without it"
                );
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for NodeLock {
    fn drop(&mut self) {
        // SAFETY: unlocking an fd owned by `self.0`.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Initialises the real NVML once for the hook's own use (never shut down,
/// so the application's own init/shutdown pairs are unaffected).
pub fn nvml_ready() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| real_nvml!(nvmlInit_v2()) == NVML_SUCCESS)
}
