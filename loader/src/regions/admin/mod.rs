//! Admin operations that write a region, one module each: runtime limits
//! (`set_limit`), reclaiming dead slots (`cleanup`), recovering the lock
//! after its holder died (`unlock`), suspend and resume (`signal`).
//!
//! Each one validates first and refuses (an [`AdminError`], nothing written)
//! when the operation is unsafe. None moves a slot: other processes keep
//! pointers to their own.
//!
//! The region is a file its container can write, so nothing here maps it:
//! decisions read a [`RegionIo::snapshot`](vgpu_common::region_io::RegionIo::snapshot)
//! and changes are single-field `pwrite`s. A signal goes only to a process
//! proven, through a pidfd, to map this very file with the slot's namespace
//! PID.

use std::path::PathBuf;

use vgpu_common::region_io::IoError;

pub mod cleanup;
pub mod set_limit;
pub mod signal;
pub mod unlock;

pub use cleanup::cleanup;
pub use set_limit::{resolve_devices, set_limit, Devices, LimitKind};
pub use signal::{plan_signal, send_signal, wait_status, SignalAction};
pub use unlock::unlock;

#[cfg(test)]
pub(crate) mod testutil;

/// Why an admin operation refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(
        "device {device} is out of range for {path}: it has {count} device(s) (indices 0..{count})"
    )]
    DeviceRange {
        path: PathBuf,
        device: usize,
        count: u64,
    },
    #[error("the region lock of {path} is held by live pid {pid}{}; try again later", host(.host_pid))]
    HeldByLive {
        path: PathBuf,
        pid: u64,
        host_pid: Option<i32>,
    },
    #[error(
        "the region lock of {path} is held now, but owner_pid {owner} names no live process \
         (the holder did not record itself, or a forked child inherited its descriptor); \
         refusing to touch it"
    )]
    HeldByUnknown { path: PathBuf, owner: u64 },
    #[error(
        "owner_pid {pid} of {path} is a live process{} although the lock is free \
         (it is between taking and releasing it); nothing to recover",
        host(.host_pid)
    )]
    OwnerAlive {
        path: PathBuf,
        pid: u64,
        host_pid: Option<i32>,
    },
    #[error(
        "owner_pid {pid} of {path} has no host PID and /proc could not be read in full, \
         so whether it lives in another PID namespace is unknown (run as root); nothing changed"
    )]
    OwnerUndecided { path: PathBuf, pid: u64 },
    #[error("cannot use the region lock of {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "slot {slot} (pid {pid}) has no host PID and no process mapping {path} has that PID \
         in its namespace, so it cannot be signalled safely (is the vgpu daemon running? run as root)"
    )]
    NoSignalTarget {
        path: PathBuf,
        slot: usize,
        pid: i32,
    },
    #[error(
        "pid {host_pid} (slot {slot}) does not handle {signal}: its hook does not implement \
         suspend/resume, and the signal would kill it; nothing was signalled"
    )]
    NotCaught {
        slot: usize,
        host_pid: i32,
        signal: &'static str,
    },
    #[error("cannot send {signal} to pid {host_pid} (slot {slot}): {source}")]
    Signal {
        slot: usize,
        host_pid: i32,
        signal: &'static str,
        source: std::io::Error,
    },
    #[error(
        "slot {slot} names host pid {host_pid}, but that process does not map {path} with \
         namespace pid {pid}: the slot's host PID is not trusted; nothing was signalled"
    )]
    Unproven {
        path: PathBuf,
        slot: usize,
        pid: i32,
        host_pid: i32,
    },
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("timed out after {secs:.1} s: {slots} did not report {want}")]
    Timeout {
        secs: f64,
        slots: String,
        want: &'static str,
    },
}

fn host(h: &Option<i32>) -> String {
    h.map(|h| format!(" (host pid {h})")).unwrap_or_default()
}
