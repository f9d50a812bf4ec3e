//! The few driver queries the accounting policy needs, behind a trait so
//! unit tests can fake them (the allocation calls themselves are closures).

use crate::ffi::CUdeviceptr;
use crate::nodelock::NodeLock;
use crate::real::{cuda, nvml};

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

impl Driver for Real {
    fn current_device(&self) -> Option<usize> {
        crate::devices::index_of(cuda::ctx::device().ok()?)
    }

    fn allocation_size(&self, ptr: CUdeviceptr) -> Option<u64> {
        cuda::mem::allocation_size(ptr).ok().map(|s| s as u64)
    }

    fn device_used(&self, dev: usize) -> Option<u64> {
        let handle = crate::devices::nvml_handle(dev)?;
        nvml::device::memory(handle).ok().map(|m| m.used)
    }

    fn processes(&self, dev: usize) -> Option<Vec<(u32, u64)>> {
        nvml::process::running_processes(crate::devices::nvml_handle(dev)?).ok()
    }

    fn own_host_pid(&self) -> Option<u32> {
        crate::pid_namespace::own_host_pid()
    }

    fn own_ns_pid(&self) -> Option<u32> {
        crate::pid_namespace::own_ns_pid()
    }

    fn shared_ctx_size(&self, dev: usize) -> Option<u64> {
        crate::sidecar::shared()?.devs.get(dev)?.ctx_bytes()
    }

    fn set_shared_ctx_size(&self, dev: usize, bytes: u64) {
        if let Some(d) = crate::sidecar::shared().and_then(|s| s.devs.get(dev)) {
            d.set_ctx_bytes(bytes);
        }
    }

    fn node_lock(&self) -> Option<NodeLock> {
        NodeLock::take()
    }
}
