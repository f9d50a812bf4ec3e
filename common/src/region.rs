//! The HAMi-core v1.2 shared region (`shared_region_t` of its
//! `src/multiprocess/multiprocess_memory_limit.h`, <https://github.com/Project-HAMi/HAMi-core>),
//! byte for byte.
//!
//! Every process of a container maps the same file and HAMi's monitor reads
//! it without locks, so every field that anyone writes after creation is an
//! atomic: the types can be used through a shared reference into a
//! `MAP_SHARED` mapping. Offsets and sizes are asserted at compile time
//! against that C layout on Linux x86_64 and aarch64 (glibc `sem_t`: 32
//! bytes, 8-aligned), the offsets HAMi's monitor reads.

use core::mem::{align_of, offset_of, size_of};
use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8};

pub mod rules;

/// `initialized_flag` of a ready region (`0x012FF74E`).
pub const MAGIC: i32 = 19_920_718;
/// HAMi's monitor refuses any other major version.
pub const MAJOR_VERSION: u32 = 1;
pub const MINOR_VERSION: u32 = 2;
/// Per-device arrays have this many entries.
pub const MAX_DEVICES: usize = 16;
/// Process slots in a region.
pub const MAX_PROCS: usize = 1024;
/// Length of one UUID string field (NUL-terminated `GPU-…`).
pub const UUID_LEN: usize = 96;
/// `sizeof(shared_region_t)`.
pub const REGION_SIZE: usize = 2_008_952;
/// HAMi writes one byte past the struct; its monitor picks the parser by
/// file size, so keep the file exactly this long.
pub const FILE_SIZE: u64 = REGION_SIZE as u64 + 1;

/// Slot `status` values, HAMi-core's: `SIGUSR2` suspends a process,
/// `SIGUSR1` resumes it, exit clears its slot.
pub mod status {
    pub const EXITED: i32 = 0;
    pub const RUNNING: i32 = 1;
    pub const SUSPENDED: i32 = 2;
}

/// `utilization_switch` / `GPU_CORE_UTILIZATION_POLICY` values.
pub mod policy {
    pub const DEFAULT: i32 = 0;
    pub const FORCE: i32 = 1;
    pub const DISABLE: i32 = 2;
}

/// `device_memory_t`: one process's usage on one device.
///
/// `total` is always `context_size + module_size + data_size` (HAMi's
/// monitor sums `total`). `offset` is never written, as in HAMi.
#[repr(C)]
#[derive(Debug)]
pub struct DeviceMemory {
    pub context_size: AtomicU64,
    pub module_size: AtomicU64,
    pub data_size: AtomicU64,
    pub offset: AtomicU64,
    pub total: AtomicU64,
    /// vgpu's count of the process's successful kernel and graph launches on
    /// this device, in HAMi's `unused[0]` (neither HAMi-core nor HAMi's
    /// monitor reads or writes it). Only the slot's own process adds to it
    /// (one relaxed increment per launch); zeroed with the slot.
    pub launches: AtomicU64,
    /// vgpu's bytes of this process's allocations on this device that are
    /// served from host memory (`CUDA_OVERSUBSCRIBE`), in HAMi's
    /// `unused[1]` (neither HAMi-core nor HAMi's monitor reads or writes
    /// it). Informational: those bytes are also in `data_size` and `total`,
    /// which the limit counts. Only the slot's own process writes it.
    pub host_bytes: AtomicU64,
    pub unused: [AtomicU64; 1],
}

/// `device_util_t`: NVML utilization samples of one process on one device.
#[repr(C)]
#[derive(Debug)]
pub struct DeviceUtil {
    pub dec_util: AtomicU64,
    pub enc_util: AtomicU64,
    pub sm_util: AtomicU64,
    pub unused: [AtomicU64; 3],
}

/// `shrreg_proc_slot_t`: one process of the container.
#[repr(C)]
#[derive(Debug)]
pub struct ProcSlot {
    /// Container (namespace) PID; 0 marks a free slot.
    pub pid: AtomicI32,
    /// Host PID, filled by the loader (the hook cannot see it from inside a
    /// PID namespace).
    pub hostpid: AtomicI32,
    pub used: [DeviceMemory; MAX_DEVICES],
    /// NVML-measured per-process memory, written by whoever samples NVML.
    pub monitorused: [AtomicU64; MAX_DEVICES],
    pub device_util: [DeviceUtil; MAX_DEVICES],
    pub status: AtomicI32,
    /// C alignment padding before the 8-byte `seqlock`.
    pub _pad: AtomicU32,
    /// Odd while a writer updates `used`; readers retry on change.
    pub seqlock: AtomicU64,
    /// vgpu's slot identity, in HAMi's `unused[0]` (its monitor never reads
    /// it): the inode of the process's PID namespace. With `pid` and
    /// `start` it names one process, whatever namespace it runs in (two
    /// namespaces sharing a region both have a PID 1). 0 = not recorded (a
    /// HAMi-core process).
    pub pidns: AtomicU64,
    /// HAMi's `unused[1]`: the process's start time, `/proc/<pid>/stat`
    /// field 22 (clock ticks after boot): a reused PID has another. 0 = not
    /// recorded.
    pub start: AtomicU64,
}

/// `shared_region_t`.
#[repr(C)]
#[derive(Debug)]
pub struct SharedRegion {
    pub initialized_flag: AtomicI32,
    pub major_version: AtomicU32,
    pub minor_version: AtomicU32,
    pub sm_init_flag: AtomicI32,
    /// PID of the process holding the slot lock, 0 when free. vgpu's lock is
    /// an OFD record lock on the file (the kernel drops it on death); this
    /// field only tells an operator who holds it.
    pub owner_pid: AtomicU64,
    /// glibc `sem_t` in HAMi. vgpu does not use it but initialises it as an
    /// unlocked glibc semaphore, so a HAMi-core process sharing the region
    /// still works.
    pub sem: [AtomicU32; 8],
    pub device_num: AtomicU64,
    pub uuids: [[AtomicU8; UUID_LEN]; MAX_DEVICES],
    /// Bytes; 0 = no limit ([`rules::memory_limit`]).
    pub limit: [AtomicU64; MAX_DEVICES],
    /// Percent; 0 or >= 100 = no limit ([`rules::sm_limit`]).
    pub sm_limit: [AtomicU64; MAX_DEVICES],
    pub procs: [ProcSlot; MAX_PROCS],
    pub proc_num: AtomicI32,
    /// 1 = enforce the SM limit, 0 = the monitor sees no contention.
    pub utilization_switch: AtomicI32,
    /// 2 = launched recently, decayed by the monitor; < 0 = blocked.
    pub recent_kernel: AtomicI32,
    /// Lower = higher priority.
    pub priority: AtomicI32,
    /// Unix seconds of the last launch.
    pub last_kernel_time: AtomicU64,
    /// Second glibc `sem_t` in HAMi (host-PID probing); see [`Self::sem`].
    pub sem_postinit: [AtomicU32; 8],
}

const _: () = {
    assert!(size_of::<DeviceMemory>() == 64);
    assert!(offset_of!(DeviceMemory, context_size) == 0);
    assert!(offset_of!(DeviceMemory, module_size) == 8);
    assert!(offset_of!(DeviceMemory, data_size) == 16);
    assert!(offset_of!(DeviceMemory, offset) == 24);
    assert!(offset_of!(DeviceMemory, total) == 32);
    assert!(offset_of!(DeviceMemory, launches) == 40);
    assert!(offset_of!(DeviceMemory, host_bytes) == 48);
    assert!(offset_of!(DeviceMemory, unused) == 56);

    assert!(size_of::<DeviceUtil>() == 48);
    assert!(offset_of!(DeviceUtil, dec_util) == 0);
    assert!(offset_of!(DeviceUtil, enc_util) == 8);
    assert!(offset_of!(DeviceUtil, sm_util) == 16);
    assert!(offset_of!(DeviceUtil, unused) == 24);

    assert!(size_of::<ProcSlot>() == 1960);
    assert!(align_of::<ProcSlot>() == 8);
    assert!(offset_of!(ProcSlot, pid) == 0);
    assert!(offset_of!(ProcSlot, hostpid) == 4);
    assert!(offset_of!(ProcSlot, used) == 8);
    assert!(offset_of!(ProcSlot, monitorused) == 1032);
    assert!(offset_of!(ProcSlot, device_util) == 1160);
    assert!(offset_of!(ProcSlot, status) == 1928);
    assert!(offset_of!(ProcSlot, seqlock) == 1936);
    assert!(offset_of!(ProcSlot, pidns) == 1944);
    assert!(offset_of!(ProcSlot, start) == 1952);

    assert!(size_of::<SharedRegion>() == REGION_SIZE);
    assert!(align_of::<SharedRegion>() == 8);
    assert!(offset_of!(SharedRegion, initialized_flag) == 0);
    assert!(offset_of!(SharedRegion, major_version) == 4);
    assert!(offset_of!(SharedRegion, minor_version) == 8);
    assert!(offset_of!(SharedRegion, sm_init_flag) == 12);
    assert!(offset_of!(SharedRegion, owner_pid) == 16);
    assert!(offset_of!(SharedRegion, sem) == 24);
    assert!(offset_of!(SharedRegion, device_num) == 56);
    assert!(offset_of!(SharedRegion, uuids) == 64);
    assert!(offset_of!(SharedRegion, limit) == 1600);
    assert!(offset_of!(SharedRegion, sm_limit) == 1728);
    assert!(offset_of!(SharedRegion, procs) == 1856);
    assert!(offset_of!(SharedRegion, proc_num) == 2_008_896);
    assert!(offset_of!(SharedRegion, utilization_switch) == 2_008_900);
    assert!(offset_of!(SharedRegion, recent_kernel) == 2_008_904);
    assert!(offset_of!(SharedRegion, priority) == 2_008_908);
    assert!(offset_of!(SharedRegion, last_kernel_time) == 2_008_912);
    assert!(offset_of!(SharedRegion, sem_postinit) == 2_008_920);
};

/// Sum of the slot loop bound HAMi uses, clamped like its monitor does.
impl SharedRegion {
    /// Number of slots in use, clamped to `[0, MAX_PROCS]` as HAMi's monitor
    /// does, so a corrupt `proc_num` can never index out of bounds.
    pub fn proc_count(&self) -> usize {
        let n = self.proc_num.load(core::sync::atomic::Ordering::Acquire);
        (n.max(0) as usize).min(MAX_PROCS)
    }

    /// The slots below `proc_num`.
    pub fn active_slots(&self) -> &[ProcSlot] {
        &self.procs[..self.proc_count()]
    }

    /// Whether the header says this is a v1 region HAMi's monitor accepts.
    pub fn is_initialized(&self) -> bool {
        use core::sync::atomic::Ordering::Acquire;
        self.initialized_flag.load(Acquire) == MAGIC
            && self.major_version.load(Acquire) == MAJOR_VERSION
    }

    /// Device `dev`'s UUID as bytes up to the first NUL.
    pub fn uuid(&self, dev: usize) -> ([u8; UUID_LEN], usize) {
        let mut out = [0u8; UUID_LEN];
        let mut len = 0;
        if let Some(field) = self.uuids.get(dev) {
            for (i, b) in field.iter().enumerate() {
                let v = b.load(core::sync::atomic::Ordering::Relaxed);
                if v == 0 {
                    break;
                }
                out[i] = v;
                len = i + 1;
            }
        }
        (out, len)
    }

    /// Stores `uuid` NUL-terminated (truncated to 95 bytes) for device `dev`.
    pub fn set_uuid(&self, dev: usize, uuid: &[u8]) {
        let Some(field) = self.uuids.get(dev) else {
            return;
        };
        let n = uuid.len().min(UUID_LEN - 1);
        for (i, cell) in field.iter().enumerate() {
            let v = if i < n { uuid[i] } else { 0 };
            cell.store(v, core::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl ProcSlot {
    /// Container-wide accounting reads `total`; keep it the sum of the kinds.
    pub fn used_total(&self, dev: usize) -> u64 {
        self.used
            .get(dev)
            .map_or(0, |m| m.total.load(core::sync::atomic::Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets of the C layout, checked at run time too so a failure names
    /// the field (the const asserts above only say "evaluation failed").
    #[test]
    fn layout_matches_hami_core_v1_2() {
        let cases: &[(&str, usize, usize)] = &[
            ("device_memory_t", size_of::<DeviceMemory>(), 64),
            ("device_util_t", size_of::<DeviceUtil>(), 48),
            ("shrreg_proc_slot_t", size_of::<ProcSlot>(), 1960),
            ("slot.monitorused", offset_of!(ProcSlot, monitorused), 1032),
            ("slot.device_util", offset_of!(ProcSlot, device_util), 1160),
            ("slot.status", offset_of!(ProcSlot, status), 1928),
            ("slot.seqlock", offset_of!(ProcSlot, seqlock), 1936),
            ("slot.pidns", offset_of!(ProcSlot, pidns), 1944),
            ("slot.start", offset_of!(ProcSlot, start), 1952),
            ("shared_region_t", size_of::<SharedRegion>(), 2_008_952),
            ("owner_pid", offset_of!(SharedRegion, owner_pid), 16),
            ("sem", offset_of!(SharedRegion, sem), 24),
            ("device_num", offset_of!(SharedRegion, device_num), 56),
            ("uuids", offset_of!(SharedRegion, uuids), 64),
            ("limit", offset_of!(SharedRegion, limit), 1600),
            ("sm_limit", offset_of!(SharedRegion, sm_limit), 1728),
            ("procs", offset_of!(SharedRegion, procs), 1856),
            ("proc_num", offset_of!(SharedRegion, proc_num), 2_008_896),
            (
                "utilization_switch",
                offset_of!(SharedRegion, utilization_switch),
                2_008_900,
            ),
            (
                "recent_kernel",
                offset_of!(SharedRegion, recent_kernel),
                2_008_904,
            ),
            ("priority", offset_of!(SharedRegion, priority), 2_008_908),
            (
                "last_kernel_time",
                offset_of!(SharedRegion, last_kernel_time),
                2_008_912,
            ),
            (
                "sem_postinit",
                offset_of!(SharedRegion, sem_postinit),
                2_008_920,
            ),
        ];
        for (name, got, want) in cases {
            assert_eq!(got, want, "{name}");
        }
        // HAMi's Go mirror puts procs[i] at 1856 + i*1960; the last slot ends
        // exactly at proc_num.
        assert_eq!(1856 + MAX_PROCS * 1960, 2_008_896);
        assert_eq!(MAGIC.to_le_bytes(), [0x4e, 0xf7, 0x2f, 0x01]);
    }
}
