//! Records shared by the eBPF programs (`ebpf/`) and the loader (`loader/`).
//!
//! Everything here crosses the kernel boundary: `#[repr(C)]`, fixed-width
//! integers only, explicit padding fields, and a compile-time size/alignment
//! assert per type. Wire enums carry explicit discriminants; a retired value is
//! never reused.

/// Names of the maps and globals in the eBPF object, so the loader and the
/// programs cannot disagree.
pub mod names {
    /// Ring buffer of [`super::CallEvent`]s (only filled when events are asked for).
    pub const EVENTS: &str = "EVENTS";
    /// Per-CPU array of `u64` counters indexed by [`super::Counter`].
    pub const COUNTERS: &str = "COUNTERS";
    /// Per-thread pending calls: [`super::PendingKey`] -> [`super::Pending`].
    pub const PENDING: &str = "PENDING";
    /// Who each traced process is: host tgid (`u32`) -> [`super::Caller`].
    pub const PROCS: &str = "PROCS";
    /// Per-CPU per-process counters: host tgid (`u32`) -> [`super::ProcCounters`].
    pub const PROC_COUNTS: &str = "PROC_COUNTS";
    /// Per-CPU launch counts: [`super::LaunchKey`] -> `u64`.
    pub const LAUNCHES: &str = "LAUNCHES";
    /// Live allocations: [`super::AllocKey`] -> size in bytes (`u64`).
    pub const ALLOCS: &str = "ALLOCS";
    /// The global [`super::Config`] the loader sets before loading.
    pub const CONFIG: &str = "CONFIG";
    /// Program run at the entry of every probed function (uprobe).
    pub const PROG_ENTRY: &str = "vgpu_call_entry";
    /// Program run at the return of probed functions whose result matters (uretprobe).
    pub const PROG_RETURN: &str = "vgpu_call_return";
    /// An empty program, to measure the bare uprobe cost (`vgpu trace --floor`).
    pub const PROG_FLOOR: &str = "vgpu_floor";
    /// Per-CPU successful launches of the processes the daemon watches:
    /// host tgid (`u32`) -> `u64`.
    pub const LAUNCHED: &str = "LAUNCHED";
    /// Program run at the return of the launch entry points, attached for
    /// one process at a time (uretprobe): counts its successful launches.
    pub const PROG_LAUNCH_DONE: &str = "vgpu_launch_done";
}

/// Map sizes (entries). Insert failures are counted, never silent.
pub mod sizes {
    /// Ring buffer bytes (a power of two, multiple of the page size).
    pub const EVENTS_BYTES: u32 = 4 << 20;
    /// Calls in flight between entry and return, over all threads.
    pub const PENDING: u32 = 16_384;
    /// Processes tracked at once (`PROCS` and the per-CPU `PROC_COUNTS`).
    pub const PROCS: u32 = 2_048;
    /// Distinct (process, kernel, grid, block) launch keys (per-CPU map).
    pub const LAUNCHES: u32 = 16_384;
    /// Live allocations tracked at once.
    pub const ALLOCS: u32 = 262_144;
    /// Processes whose launches are watched at once (`LAUNCHED`).
    pub const WATCHED: u32 = 1_024;
}

macro_rules! gen_func {
    (
        cuda_hooks { $(fn $n:ident($($a:ident: $t:ty),*) -> $r:ty => $($p:ident)::+, cuda($base:ident @ $since:literal $(, $pt:ident)?) $(, trace($v:ident = $id:literal, $class:ident))?;)* }
        cuda_older { $($older:tt)* }
        cuda_real { $($cr:tt)* }
        nvml_hooks { $($nh:tt)* }
        nvml_real { $($nr:tt)* }
    ) => {
        /// A probed libcuda entry point: the `trace(…)` rows of
        /// [`entry_points!`](crate::entry_points). The value is the uprobe
        /// attach cookie and the `func` field of every record.
        ///
        /// Gaps are room for related entry points; retired values are never reused.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Func {
            $($(
                #[doc = concat!("`", stringify!($n), "`")]
                $v = $id,
            )?)*
        }

        impl Func {
            /// Every probed entry point, in list order.
            const EVERY: &[Func] = &[$($(Func::$v,)?)*];

            /// The inverse of [`Func::id`].
            pub const fn from_id(id: u32) -> Option<Func> {
                Some(match id {
                    $($($id => Func::$v,)?)*
                    _ => return None,
                })
            }

            /// The exported libcuda symbol (probed, and named in traces).
            pub const fn symbol(self) -> &'static str {
                match self {
                    $($(Func::$v => stringify!($n),)?)*
                }
            }

            /// What the call does.
            pub const fn class(self) -> FuncClass {
                match self {
                    $($(Func::$v => FuncClass::$class,)?)*
                }
            }

            /// Which argument (from 0) is the device the call acts on: the
            /// first one its row of [`entry_points!`](crate::entry_points)
            /// types `CUdevice` (a CUDA ordinal of the calling process).
            pub const fn device_arg(self) -> Option<usize> {
                $(device_arm!(self, [$($v)?], [$(stringify!($t)),*]);)*
                None
            }
        }
    };
}

/// One row's part of [`Func::device_arg`]: nothing for a row that is not
/// traced; else its answer, computed at compile time.
macro_rules! device_arm {
    ($f:expr, [], [$($t:expr),*]) => {};
    ($f:expr, [$v:ident], [$($t:expr),*]) => {
        if $f as u32 == Func::$v as u32 {
            return const { position_of(&[$($t),*], "CUdevice") };
        }
    };
}

/// The position of `want` in `items` (const: string equality by bytes).
const fn position_of(items: &[&str], want: &str) -> Option<usize> {
    let mut i = 0;
    while i < items.len() {
        let (a, b) = (items[i].as_bytes(), want.as_bytes());
        let mut same = a.len() == b.len();
        let mut k = 0;
        while same && k < a.len() {
            same = a[k] == b[k];
            k += 1;
        }
        if same {
            return Some(i);
        }
        i += 1;
    }
    None
}

crate::entry_points!(gen_func);

/// What a [`Func`] does, for aggregation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuncClass {
    /// Takes device memory; the pointer/handle comes back through an out-param.
    Alloc,
    /// Gives device memory back.
    Free,
    /// Launches one kernel.
    Launch,
    /// Launches a CUDA graph.
    GraphLaunch,
    /// Initialises the driver or creates a context: makes the process known
    /// to the per-process maps before it allocates anything.
    Context,
}

/// How many of [`Func::EVERY`] are (`context`) or are not context entry points.
const fn count_context(context: bool) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < Func::EVERY.len() {
        if matches!(Func::EVERY[i].class(), FuncClass::Context) == context {
            n += 1;
        }
        i += 1;
    }
    n
}

/// [`Func::EVERY`] filtered to the context entry points (`context`) or the others.
const fn pick_context<const N: usize>(context: bool) -> [Func; N] {
    let mut out = [Func::EVERY[0]; N];
    let (mut i, mut n) = (0, 0);
    while i < Func::EVERY.len() {
        if matches!(Func::EVERY[i].class(), FuncClass::Context) == context {
            out[n] = Func::EVERY[i];
            n += 1;
        }
        i += 1;
    }
    out
}

impl Func {
    /// Every probed allocation, free and launch entry point, in attach order.
    pub const ALL: [Func; count_context(false)] = pick_context(false);

    /// Driver init and context creation entry points (the daemon probes
    /// these to learn a process at its first CUDA call; not in [`Func::ALL`]).
    pub const CONTEXT: [Func; count_context(true)] = pick_context(true);

    /// The wire value (attach cookie).
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// `cuMemCreate`/`cuMemRelease` deal in allocation handles, not device
    /// pointers: their [`AllocKey`]s live in a separate key space.
    pub const fn is_handle_based(self) -> bool {
        matches!(self, Func::MemCreate | Func::MemRelease)
    }
}

/// Indexes of the per-CPU `COUNTERS` array: every event the programs could
/// not record is counted here, never dropped silently.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// The ring buffer was full: a per-call event was lost.
    RingbufFull = 0,
    /// `PENDING` was full: a call's entry could not be stashed for its return.
    PendingFull = 1,
    /// A return fired with no stashed entry (probe attached mid-call, or lost above).
    ReturnWithoutEntry = 2,
    /// `PROCS`/`PROC_COUNTS` was full: a process's aggregates are missing.
    ProcsFull = 3,
    /// `LAUNCHES` was full: some launches are not in the per-kernel table.
    LaunchesFull = 4,
    /// `ALLOCS` was full: an allocation's size will not be subtracted at free.
    AllocsFull = 5,
    /// Reading the caller's memory (out-param, launch config) or a context
    /// call's device argument failed.
    UserReadFailed = 6,
    /// Reading the kernel's task/pid structures failed (namespace pids are 0).
    TaskReadFailed = 7,
}

impl Counter {
    /// Number of counters (the `COUNTERS` array length).
    pub const COUNT: u32 = 8;
    /// All counters, by index.
    pub const ALL: [Counter; 8] = [
        Counter::RingbufFull,
        Counter::PendingFull,
        Counter::ReturnWithoutEntry,
        Counter::ProcsFull,
        Counter::LaunchesFull,
        Counter::AllocsFull,
        Counter::UserReadFailed,
        Counter::TaskReadFailed,
    ];

    /// A short name for reports.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::RingbufFull => "ringbuf_full",
            Counter::PendingFull => "pending_full",
            Counter::ReturnWithoutEntry => "return_without_entry",
            Counter::ProcsFull => "procs_full",
            Counter::LaunchesFull => "launches_full",
            Counter::AllocsFull => "allocs_full",
            Counter::UserReadFailed => "user_read_failed",
            Counter::TaskReadFailed => "task_read_failed",
        }
    }
}

/// `result` of a record whose return was not observed (no uretprobe).
pub const RESULT_NONE: u32 = u32::MAX;

/// `handle` of a context record whose device argument could not be read
/// (never a zero-extended 32-bit ordinal).
pub const DEVICE_UNKNOWN: u64 = u64::MAX;

/// Kernel structure offsets (bytes), read by the loader from the running
/// kernel's BTF and handed to the programs as part of [`Config`]; aya's Rust
/// side has no CO-RE field relocations.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct.thread_pid` (`struct pid *`).
    pub task_thread_pid: u32,
    /// `task_struct.group_leader` (`struct task_struct *`).
    pub task_group_leader: u32,
    /// `pid.level` (`unsigned int`).
    pub pid_level: u32,
    /// `pid.numbers` (`struct upid[]`).
    pub pid_numbers: u32,
    /// `sizeof(struct upid)`.
    pub upid_size: u32,
    /// `upid.nr` (`int`).
    pub upid_nr: u32,
    /// `upid.ns` (`struct pid_namespace *`).
    pub upid_ns: u32,
    /// `pid_namespace.ns` + `ns_common.inum`: the namespace's inode number.
    pub pidns_inum: u32,
}

/// Program configuration, a read-only global set by the loader at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Kernel offsets; all zero means "namespace pids unavailable".
    pub offsets: KernelOffsets,
    /// Non-zero: emit one [`CallEvent`] per call into the ring buffer.
    pub emit_events: u32,
    /// Non-zero: aggregate into `PROCS` / `PROC_COUNTS` / `LAUNCHES` / `ALLOCS`.
    pub aggregate: u32,
}

/// Who made a call: host and namespace ids of the calling thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// `bpf_get_current_cgroup_id()`: the cgroup v2 id (inode of the cgroup directory).
    pub cgroup_id: u64,
    /// Host thread-group id (process id).
    pub host_tgid: u32,
    /// Host thread id.
    pub host_pid: u32,
    /// Process id in the caller's own pid namespace (0: unavailable).
    pub ns_tgid: u32,
    /// Thread id in the caller's own pid namespace (0: unavailable).
    pub ns_pid: u32,
    /// Inode number of the caller's pid namespace (`/proc/<pid>/ns/pid`).
    pub pidns_inum: u32,
    /// Explicit padding to 8-byte alignment; always zero.
    pub _pad: u32,
    /// `comm` of the calling thread, NUL-padded.
    pub comm: [u8; 16],
}

/// One probed call, emitted at its return (or at its entry when there is no
/// return probe, then `result` is [`RESULT_NONE`]).
///
/// Field meaning by [`FuncClass`]:
/// - Alloc: `handle` = returned device pointer (or `cuMemCreate` handle) read
///   from the out-param at return; `size` = bytes asked for (pitch: pitch × height).
/// - Free: `handle` = pointer/handle freed; `size` = bytes it had, if its
///   allocation was seen (else 0).
/// - Launch: `handle` = `CUfunction`; `grid`, `block`, `shmem`, `stream`.
/// - GraphLaunch: `handle` = `CUgraphExec`; `stream`.
/// - Context: `handle` = the `CUdevice` argument (a CUDA ordinal of the
///   caller, zero-extended from 32 bits) of the entry points that take one
///   ([`Func::device_arg`]; [`DEVICE_UNKNOWN`] if it could not be read),
///   else 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallEvent {
    /// `bpf_ktime_get_ns()` at entry (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// Entry-to-return time; 0 when the return was not observed.
    pub duration_ns: u64,
    /// The caller.
    pub caller: Caller,
    /// [`Func`] id.
    pub func: u32,
    /// `CUresult`, or [`RESULT_NONE`].
    pub result: u32,
    /// See the type's doc.
    pub handle: u64,
    /// See the type's doc.
    pub size: u64,
    /// `CUstream` (0 = legacy default stream) where the call takes one.
    pub stream: u64,
    /// Grid dimensions (x, y, z).
    pub grid: [u32; 3],
    /// Block dimensions (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory bytes.
    pub shmem: u32,
    /// Explicit padding; always zero.
    pub _pad: u32,
}

/// Key of the `PENDING` map: one slot per (thread, entry point).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingKey {
    /// `bpf_get_current_pid_tgid()`.
    pub pid_tgid: u64,
    /// [`Func`] id.
    pub func: u32,
    /// Explicit padding; always zero (hash keys compare all bytes).
    pub _pad: u32,
}

/// What the entry probe stashes for the return probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    /// The event as known at entry.
    pub event: CallEvent,
    /// Out-param address (`CUdeviceptr *` / handle pointer) read at return.
    pub out_ptr: u64,
    /// Second out-param (`size_t *pitch`) for `cuMemAllocPitch_v2`.
    pub out_ptr2: u64,
}

/// Key of the `LAUNCHES` map: launches counted per process, entry point,
/// function handle and shape.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LaunchKey {
    /// `CUfunction` (or `CUgraphExec` for graph launches).
    pub handle: u64,
    /// Host tgid.
    pub tgid: u32,
    /// [`Func`] id.
    pub func: u32,
    /// Grid dimensions (zero for graph launches).
    pub grid: [u32; 3],
    /// Block dimensions (zero for graph launches).
    pub block: [u32; 3],
}

/// Key of the `ALLOCS` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocKey {
    /// Device pointer, or `cuMemCreate` handle.
    pub ptr: u64,
    /// Host tgid.
    pub tgid: u32,
    /// 0: device pointer; 1: `cuMemCreate` handle.
    pub space: u32,
}

/// Per-process counters (value of the per-CPU `PROC_COUNTS` map; the
/// loader sums the CPUs). Per-CPU so the launch path takes no shared cache
/// line and needs no atomics (the BPF target has none in `core`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcCounters {
    /// Kernel launches (all `cuLaunch*` entry points).
    pub launches: u64,
    /// `cuGraphLaunch*` calls.
    pub graph_launches: u64,
    /// Successful allocations.
    pub allocs: u64,
    /// Failed allocations.
    pub alloc_failures: u64,
    /// Successful frees.
    pub frees: u64,
    /// Bytes of successful allocations.
    pub bytes_allocated: u64,
    /// Bytes released by successful frees of allocations that were seen.
    pub bytes_freed: u64,
    /// Bit `i` set: a context was made on CUDA ordinal `i` (successful
    /// context calls with a device argument; ordinals from 64 on are not
    /// recorded). The CPUs' values are OR-ed.
    pub devices: u64,
}

impl ProcCounters {
    /// Field-wise sum, `devices` OR-ed (for adding up the CPUs).
    pub const fn add(&self, o: &ProcCounters) -> ProcCounters {
        ProcCounters {
            launches: self.launches.wrapping_add(o.launches),
            graph_launches: self.graph_launches.wrapping_add(o.graph_launches),
            allocs: self.allocs.wrapping_add(o.allocs),
            alloc_failures: self.alloc_failures.wrapping_add(o.alloc_failures),
            frees: self.frees.wrapping_add(o.frees),
            bytes_allocated: self.bytes_allocated.wrapping_add(o.bytes_allocated),
            bytes_freed: self.bytes_freed.wrapping_add(o.bytes_freed),
            devices: self.devices | o.devices,
        }
    }
}

const _: () = {
    use core::mem::{align_of, size_of};
    assert!(size_of::<Func>() == 4);
    assert!(size_of::<KernelOffsets>() == 32 && align_of::<KernelOffsets>() == 4);
    assert!(size_of::<Config>() == 40 && align_of::<Config>() == 4);
    assert!(size_of::<Caller>() == 48 && align_of::<Caller>() == 8);
    assert!(size_of::<CallEvent>() == 128 && align_of::<CallEvent>() == 8);
    assert!(size_of::<PendingKey>() == 16);
    assert!(size_of::<Pending>() == 144);
    assert!(size_of::<LaunchKey>() == 40 && align_of::<LaunchKey>() == 8);
    assert!(size_of::<AllocKey>() == 16);
    assert!(size_of::<ProcCounters>() == 64 && align_of::<ProcCounters>() == 8);
    assert!(core::mem::offset_of!(ProcCounters, devices) == 56);
};

#[cfg(feature = "user")]
mod user;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_calls_name_their_device_argument() {
        assert_eq!(Func::DevicePrimaryCtxRetain.device_arg(), Some(1));
        assert_eq!(Func::CtxCreate.device_arg(), Some(2));
        assert_eq!(Func::CtxCreateV3.device_arg(), Some(4));
        assert_eq!(Func::CtxCreateV4.device_arg(), Some(3));
        assert_eq!(Func::Init.device_arg(), None);
        for f in Func::ALL {
            assert_eq!(f.device_arg(), None, "{f:?}");
        }
    }
}
