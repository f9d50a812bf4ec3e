//! The shared state file `$SIMGPU_DIR/state`: one fixed `#[repr(C)]` layout
//! of atomics, mapped by the server and every client.
//!
//! The server writes the header and publishes it by storing [`MAGIC`] last;
//! after that every field is an atomic, so any process can read without a
//! lock. Writers that must check-then-update (memory reservation, kernel
//! scheduling) take [`crate::lock::ShmLock`]. Every update is a single atomic
//! store, so a process killed at any instant leaves a consistent file.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;

use crate::config::{DeviceConfig, MAX_DEVICES};
use crate::SimError;

/// Magic of the state file ("SIMGPU" + layout version).
pub const MAGIC: u64 = 0x5349_4d47_5055_0002;
/// Process-table slots.
pub const MAX_SLOTS: usize = 1024;
/// Busy intervals kept per device.
pub const RING: usize = 1 << 17;
/// Name of the state file inside `SIMGPU_DIR`.
pub const STATE_FILE: &str = "state";

/// Fixed header.
#[repr(C)]
pub struct Header {
    /// [`MAGIC`] once initialised.
    pub magic: AtomicU64,
    /// Number of devices.
    pub devices: AtomicU32,
    /// SMs per device.
    pub sms: AtomicU32,
    /// Device memory per device.
    pub memory: AtomicU64,
    /// Device memory a context costs.
    pub context_bytes: AtomicU64,
    /// Nanoseconds per wave of blocks.
    pub wave_ns: AtomicU64,
    /// The server's pid (as the server sees itself).
    pub server_pid: AtomicU32,
    /// 1 when the server runs in the initial PID namespace (PIDs are host PIDs).
    pub server_host_ns: AtomicU32,
    /// The cross-process lock word: 0 free, else owner id (slot + 1, or
    /// [`crate::lock::SERVER_OWNER`]).
    pub lock: AtomicU32,
    /// One past the highest slot ever used (bounds scans).
    pub slot_hwm: AtomicU32,
    /// Reserved.
    pub _reserved: [AtomicU64; 8],
}

/// One process (registered with the server).
#[repr(C)]
pub struct Slot {
    /// 0 free, 1 live.
    pub state: AtomicU32,
    /// Host PID (from `SO_PEERCRED` in the server's namespace).
    pub pid: AtomicU32,
    /// The PID the process sees for itself (1 inside `unshare --pid`).
    pub ns_pid: AtomicU32,
    /// Inode of the process's PID namespace (0: unknown). nsfs inodes
    /// are 32-bit (`proc_inum` is an `unsigned int`).
    pub pid_ns: AtomicU32,
    /// Incremented each time the slot is handed out; intervals carry it.
    pub gen: AtomicU64,
    /// Device bytes held per device (contexts included).
    pub used: [AtomicU64; MAX_DEVICES as usize],
    /// Contexts held per device.
    pub contexts: [AtomicU32; MAX_DEVICES as usize],
    /// Kernels launched per device.
    pub launches: [AtomicU64; MAX_DEVICES as usize],
    /// Kernel nanoseconds per device.
    pub busy_ns: [AtomicU64; MAX_DEVICES as usize],
}

/// One busy interval of a device: `[start, end)` in monotonic ns.
#[repr(C)]
pub struct Interval {
    /// Start.
    pub start: AtomicU64,
    /// End.
    pub end: AtomicU64,
    /// Owner: `slot << 32 | (gen & 0xffff_ffff)`.
    pub owner: AtomicU64,
}

/// Per-device state.
#[repr(C)]
pub struct DeviceState {
    /// When the device finishes everything queued so far.
    pub busy_until: AtomicU64,
    /// Intervals ever written; the newest is at `(head - 1) % RING`.
    pub head: AtomicU64,
    /// Kernels launched on the device.
    pub launches: AtomicU64,
    /// Kernel nanoseconds scheduled on the device.
    pub busy_ns: AtomicU64,
    /// Reserved.
    pub _reserved: [AtomicU64; 4],
    /// Ring of busy intervals, ordered by start, non-overlapping.
    pub ring: [Interval; RING],
}

/// The whole file.
#[repr(C)]
pub struct Shared {
    /// Header.
    pub header: Header,
    /// Process table.
    pub slots: [Slot; MAX_SLOTS],
    /// Devices.
    pub devices: [DeviceState; MAX_DEVICES as usize],
}

/// Owner word of an interval for a slot and generation.
pub fn owner_word(slot: u32, gen: u64) -> u64 {
    (u64::from(slot) << 32) | (gen & 0xffff_ffff)
}

/// A mapping of the state file.
pub struct Shm {
    map: MmapRaw,
    path: PathBuf,
}

impl std::fmt::Debug for Shm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shm").field("path", &self.path).finish()
    }
}

impl Shm {
    /// Creates a fresh state file for `cfg` at `dir/state` (atomically
    /// replacing any old one) and maps it. Used by the server.
    pub fn create(dir: &Path, cfg: &DeviceConfig) -> Result<Shm, SimError> {
        let path = dir.join(STATE_FILE);
        let tmp = dir.join(format!("{STATE_FILE}.{}", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| SimError::io(format!("create {}", tmp.display()), e))?;
        file.set_len(std::mem::size_of::<Shared>() as u64)
            .map_err(|e| SimError::io(format!("size {}", tmp.display()), e))?;
        let shm = Shm::map_file(&file, &tmp)?;
        let h = &shm.shared().header;
        h.devices.store(cfg.devices, Ordering::Relaxed);
        h.sms.store(cfg.sms, Ordering::Relaxed);
        h.memory.store(cfg.memory, Ordering::Relaxed);
        h.context_bytes.store(cfg.context_bytes, Ordering::Relaxed);
        h.wave_ns.store(cfg.wave_ns, Ordering::Relaxed);
        h.server_pid.store(std::process::id(), Ordering::Relaxed);
        h.server_host_ns.store(
            u32::from(crate::pids::in_initial_pid_ns()),
            Ordering::Relaxed,
        );
        h.magic.store(MAGIC, Ordering::Release);
        std::fs::rename(&tmp, &path)
            .map_err(|e| SimError::io(format!("rename to {}", path.display()), e))?;
        Ok(Shm { path, ..shm })
    }

    /// Maps an existing state file at `dir/state`.
    pub fn open(dir: &Path) -> Result<Shm, SimError> {
        let path = dir.join(STATE_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| SimError::io(format!("open {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| SimError::io(format!("stat {}", path.display()), e))?
            .len();
        if len < std::mem::size_of::<Shared>() as u64 {
            return Err(SimError::State {
                path,
                reason: format!("{len} bytes, expected {}", std::mem::size_of::<Shared>()),
            });
        }
        let shm = Shm::map_file(&file, &path)?;
        let magic = shm.shared().header.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(SimError::State {
                path,
                reason: format!("magic {magic:#x}, expected {MAGIC:#x}"),
            });
        }
        Ok(shm)
    }

    fn map_file(file: &File, path: &Path) -> Result<Shm, SimError> {
        let map = MmapRaw::map_raw(file)
            .map_err(|e| SimError::io(format!("mmap {}", path.display()), e))?;
        if map.len() < std::mem::size_of::<Shared>() {
            return Err(SimError::State {
                path: path.to_path_buf(),
                reason: "mapping too short".into(),
            });
        }
        Ok(Shm {
            map,
            path: path.to_path_buf(),
        })
    }

    /// The shared state.
    pub fn shared(&self) -> &Shared {
        // SAFETY: the mapping is at least size_of::<Shared>() bytes (checked
        // at map time), page-aligned (so aligned for Shared), lives as long
        // as `self`, and every field of Shared is an atomic (or an array of
        // atomics) for which any bit pattern, zero included, is valid; all
        // concurrent access goes through those atomics.
        unsafe { &*(self.map.as_ptr() as *const Shared) }
    }

    /// Path of the mapped file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The device configuration stored in the header.
    pub fn config(&self) -> DeviceConfig {
        let h = &self.shared().header;
        DeviceConfig {
            devices: h.devices.load(Ordering::Relaxed).min(MAX_DEVICES),
            memory: h.memory.load(Ordering::Relaxed),
            sms: h.sms.load(Ordering::Relaxed).max(1),
            context_bytes: h.context_bytes.load(Ordering::Relaxed),
            wave_ns: h.wave_ns.load(Ordering::Relaxed),
        }
    }

    /// A device's state, if `dev` is configured.
    pub fn device(&self, dev: u32) -> Option<&DeviceState> {
        if dev < self.config().devices {
            self.shared().devices.get(dev as usize)
        } else {
            None
        }
    }

    /// A slot by index.
    pub fn slot(&self, slot: u32) -> Option<&Slot> {
        self.shared().slots.get(slot as usize)
    }

    /// Live slots: `(index, slot)`.
    pub fn live_slots(&self) -> impl Iterator<Item = (u32, &Slot)> {
        let hwm = (self.shared().header.slot_hwm.load(Ordering::Acquire) as usize).min(MAX_SLOTS);
        self.shared().slots[..hwm]
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state.load(Ordering::Acquire) == 1)
            .map(|(i, s)| (i as u32, s))
    }
}

/// A snapshot of one process as the device sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Slot index.
    pub slot: u32,
    /// Host PID.
    pub pid: u32,
    /// PID inside its own namespace.
    pub ns_pid: u32,
    /// Inode of its PID namespace (0: unknown).
    pub pid_ns: u32,
    /// Device bytes held (contexts included).
    pub used: u64,
    /// Contexts held.
    pub contexts: u32,
    /// Kernels launched.
    pub launches: u64,
    /// Kernel nanoseconds scheduled.
    pub busy_ns: u64,
}

impl Shm {
    /// Processes registered with the server and their usage of `dev`.
    pub fn processes(&self, dev: u32) -> Vec<ProcessInfo> {
        let d = dev as usize;
        if dev >= MAX_DEVICES {
            return Vec::new();
        }
        self.live_slots()
            .map(|(i, s)| ProcessInfo {
                slot: i,
                pid: s.pid.load(Ordering::Relaxed),
                ns_pid: s.ns_pid.load(Ordering::Relaxed),
                pid_ns: s.pid_ns.load(Ordering::Relaxed),
                used: s.used[d].load(Ordering::Relaxed),
                contexts: s.contexts[d].load(Ordering::Relaxed),
                launches: s.launches[d].load(Ordering::Relaxed),
                busy_ns: s.busy_ns[d].load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_stable() {
        assert_eq!(std::mem::size_of::<Interval>(), 24);
        assert_eq!(std::mem::size_of::<Slot>(), 24 + 16 * 8 * 3 + 16 * 4);
        assert_eq!(std::mem::size_of::<Header>() % 8, 0);
    }
}
