//! What measuring a context's size needs besides the driver (which is
//! `crate::driver`): this process's PIDs, the size another process of the
//! container measured (the sidecar) and the node-wide lock. Behind a trait
//! so the measurement is unit-tested with a fake (`driver::fake`).

use crate::nodelock::NodeLock;

pub trait ContextHost {
    /// This process's host PID when it is known without a guess (the
    /// process runs in the initial PID namespace).
    fn own_host_pid(&self) -> Option<u32>;
    /// This process's PID in its own PID namespace when that is not the
    /// initial one: the PID the driver lists it under to its own
    /// container's callers (R580 does; older drivers may list host PIDs).
    fn own_ns_pid(&self) -> Option<u32>;
    /// The context size of `dev` measured by another process of the
    /// container (the sidecar).
    fn shared_ctx_size(&self, dev: usize) -> Option<u64>;
    /// Shares an exactly measured context size with the container.
    fn set_shared_ctx_size(&self, dev: usize, bytes: u64);
    /// Serialises context measurement node-wide (`/tmp/vgpulock/lock`).
    fn node_lock(&self) -> Option<NodeLock>;
}

/// The process's own host: its PID namespace, the container's sidecar, the
/// node's lock.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealHost;

impl ContextHost for RealHost {
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
