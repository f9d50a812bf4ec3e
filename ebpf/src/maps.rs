//! Every map and global of the programs, in one place. Names and sizes come
//! from `vgpu_common::event::{names, sizes}`, which the loader uses too.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use aya_log_ebpf::warn;
use vgpu_common::event::{
    sizes, AllocKey, Caller, Config, Counter, KernelOffsets, LaunchKey, Pending, PendingKey,
    ProcCounters,
};

/// Set by the loader before loading (`EbpfLoader::set_global`).
#[no_mangle]
static CONFIG: Config = Config {
    offsets: KernelOffsets {
        task_thread_pid: 0,
        task_group_leader: 0,
        pid_level: 0,
        pid_numbers: 0,
        upid_size: 0,
        upid_nr: 0,
        upid_ns: 0,
        pidns_inum: 0,
    },
    emit_events: 0,
    aggregate: 0,
};

/// The configuration, read so the compiler cannot fold the zero defaults.
#[inline(always)]
pub(crate) fn config() -> Config {
    // SAFETY: CONFIG is a valid static; a volatile read only stops constant
    // folding (the loader rewrites .rodata before the program is loaded).
    unsafe { core::ptr::read_volatile(&raw const CONFIG) }
}

#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(sizes::EVENTS_BYTES, 0);

#[map]
pub(crate) static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

#[map]
pub(crate) static PENDING: HashMap<PendingKey, Pending> =
    HashMap::with_max_entries(sizes::PENDING, 0);

#[map]
pub(crate) static PROCS: HashMap<u32, Caller> = HashMap::with_max_entries(sizes::PROCS, 0);

#[map]
pub(crate) static PROC_COUNTS: PerCpuHashMap<u32, ProcCounters> =
    PerCpuHashMap::with_max_entries(sizes::PROCS, 0);

#[map]
pub(crate) static LAUNCHES: PerCpuHashMap<LaunchKey, u64> =
    PerCpuHashMap::with_max_entries(sizes::LAUNCHES, 0);

#[map]
pub(crate) static LAUNCHED: PerCpuHashMap<u32, u64> =
    PerCpuHashMap::with_max_entries(sizes::WATCHED, 0);

#[map]
pub(crate) static ALLOCS: HashMap<AllocKey, u64> = HashMap::with_max_entries(sizes::ALLOCS, 0);

/// Counts something that could not be recorded. Its first occurrence on
/// each CPU is also logged (aya-log, shown in the loader's log): only a
/// failure path gets here, and after that first time only the counter
/// moves, so no call pays for a log record twice per CPU.
#[inline(always)]
pub(crate) fn count(c: Counter) {
    if let Some(p) = COUNTERS.get_ptr_mut(c as u32) {
        // SAFETY: a per-CPU array slot of this CPU, valid for the program's run.
        let before = unsafe {
            let n = *p;
            *p = n + 1;
            n
        };
        if before == 0 {
            diagnose(c);
        }
    }
}

/// Logs `c`'s first occurrence on this CPU. Out of line: one copy of the
/// log record writer for every call site.
#[inline(never)]
fn diagnose(c: Counter) {
    // aya-log ignores the context argument; records go to its ring buffer.
    warn!(
        &(),
        "eBPF probes: {} (first time on this CPU; totals: vgpu_probe_lost_events_total)",
        c.name()
    );
}
