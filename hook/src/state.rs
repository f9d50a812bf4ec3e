//! The hook's process state: one immutable [`Config`] and one [`Process`]
//! (the region attachment plus the tracking tables), built lazily on the
//! first CUDA or NVML call, so the library is inert in processes (shells…)
//! that never touch either.
//!
//! After `fork` the child gets a fresh `Process` (its own open file
//! description for the lock, its own slot, empty tables) on its first call:
//! the atfork child handler only bumps a generation counter, which the hot
//! path compares with one atomic load.

use std::collections::HashMap;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64};
use std::sync::{Mutex, Once};

use vgpu_common::region::MAX_DEVICES;

use crate::config::Config;
use crate::memory::track::{Entry, Tracker};
use crate::memory::vmm_table::Lifetimes;
use crate::region::Attachment;

/// Context size not measured yet.
pub const UNKNOWN: u64 = u64::MAX;

/// Everything the hook keeps per process (per fork generation).
#[derive(Debug)]
pub struct Process {
    gen: u64,
    pub att: Attachment,
    /// Device pointers: cuMemAlloc*, managed, async, pool, IPC imports.
    pub ptrs: Tracker,
    /// cuMemCreate handles.
    pub handles: Tracker,
    /// References and mappings of the counted cuMemCreate handles.
    pub vmm: Lifetimes,
    /// CUarray and CUmipmappedArray handles.
    pub arrays: Tracker,
    /// Contexts from cuCtxCreate.
    pub contexts: Tracker,
    /// Graph memory-alloc nodes per graph, released with the graph.
    pub graphs: Mutex<HashMap<usize, Vec<Entry>>>,
    /// Primary-context retain counts per device.
    pub primary: Mutex<[u32; MAX_DEVICES]>,
    /// Measured context footprint per device (`UNKNOWN` until measured).
    pub ctx_size: [AtomicU64; MAX_DEVICES],
    /// GPU code and data counted since the context was measured, per
    /// device (`memory::modules`).
    pub module_bytes: [AtomicU64; MAX_DEVICES],
    /// When the background look next compares NVML with the count (ns).
    pub module_check: AtomicU64,
    /// How far NVML read under the count at the last look, per device.
    pub module_deficit: [AtomicU64; MAX_DEVICES],
}

impl Process {
    /// Attaches to the region of `cfg` for `pid`.
    pub fn new(cfg: &Config, pid: i32, gen: u64) -> Result<Self, crate::region::AttachError> {
        Ok(Self {
            gen,
            att: Attachment::open(cfg, pid)?,
            ptrs: Tracker::new(),
            handles: Tracker::new(),
            vmm: Lifetimes::new(),
            arrays: Tracker::new(),
            contexts: Tracker::new(),
            graphs: Mutex::new(HashMap::new()),
            primary: Mutex::new([0; MAX_DEVICES]),
            ctx_size: std::array::from_fn(|_| AtomicU64::new(UNKNOWN)),
            module_bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            module_check: AtomicU64::new(0),
            module_deficit: std::array::from_fn(|_| AtomicU64::new(0)),
        })
    }
}

static CURRENT: AtomicPtr<Process> = AtomicPtr::new(std::ptr::null_mut());
static FORK_GEN: AtomicU64 = AtomicU64::new(0);
static FAILED_GEN: AtomicU64 = AtomicU64::new(u64::MAX);
/// Spin lock around attaching (reset in a fork child, unlike a mutex).
static ATTACHING: AtomicBool = AtomicBool::new(false);
static PROCESS_HOOKS: Once = Once::new();

/// The configuration (`crate::config::get`).
pub use crate::config::get as config;

/// This process's state, attaching on first use. `None` means "forward
/// everything unchanged": the region could not be used (already logged).
///
/// The state outlives `exit()`: its slot stays registered and counted
/// until the process is dead (the driver releases its memory only then),
/// so threads still running during exit, and exit handlers, stay limited.
/// A sibling's registration or refused reservation, a sibling's
/// memory query, or `vgpu cleanup` frees the slot once the process is
/// provably dead.
pub fn process() -> Option<&'static Process> {
    let gen = FORK_GEN.load(Acquire);
    let p = CURRENT.load(Acquire);
    if !p.is_null() {
        // SAFETY: `CURRENT` only ever holds pointers from `Box::leak`, never
        // freed, so the reference is valid for the rest of the process.
        let pr: &'static Process = unsafe { &*p };
        if pr.gen == gen {
            return Some(pr);
        }
    }
    attach_slow(gen)
}

/// This process's state if it is already attached, never attaching (the
/// launch path counts launches only in a slot it already has).
#[inline]
pub fn attached() -> Option<&'static Process> {
    let gen = FORK_GEN.load(Acquire);
    let p = CURRENT.load(Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: `CURRENT` only ever holds pointers from `Box::leak`, never
    // freed, so the reference is valid for the rest of the process.
    let pr: &'static Process = unsafe { &*p };
    (pr.gen == gen).then_some(pr)
}

fn attach_slow(gen: u64) -> Option<&'static Process> {
    if FAILED_GEN.load(Relaxed) == gen {
        return None;
    }
    while ATTACHING
        .compare_exchange_weak(false, true, Acquire, Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
    let result = attach_locked(gen);
    ATTACHING.store(false, Release);
    result
}

fn attach_locked(gen: u64) -> Option<&'static Process> {
    let p = CURRENT.load(Acquire);
    if !p.is_null() {
        // SAFETY: as in `process`: leaked, never freed.
        let pr: &'static Process = unsafe { &*p };
        if pr.gen == gen {
            return Some(pr);
        }
    }
    if FAILED_GEN.load(Relaxed) == gen {
        return None;
    }
    let cfg = config();
    let pid = std::process::id() as i32;
    match Process::new(cfg, pid, gen) {
        Ok(proc_) => {
            let leaked: &'static Process = Box::leak(Box::new(proc_));
            CURRENT.store(leaked as *const Process as *mut Process, Release);
            install_process_hooks();
            if let Some(w) = leaked.att.status_word() {
                crate::suspend::register(w);
            }
            Some(leaked)
        }
        Err(e) => {
            vlog!(
                crate::log::ERROR,
                "{e}; memory limits are NOT enforced in this process, CUDA calls are forwarded unchanged"
            );
            FAILED_GEN.store(gen, Relaxed);
            None
        }
    }
}

extern "C" {
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> libc::c_int;
}

fn install_process_hooks() {
    PROCESS_HOOKS.call_once(|| {
        // SAFETY: registering `extern "C"` functions that live as long as the
        // library (a preloaded library is never unloaded).
        unsafe {
            pthread_atfork(None, None, Some(on_fork_child));
        }
    });
}

/// pthread_atfork child: the next call attaches afresh. Only atomics here.
extern "C" fn on_fork_child() {
    FORK_GEN.fetch_add(1, SeqCst);
    ATTACHING.store(false, SeqCst);
    CURRENT.store(std::ptr::null_mut(), SeqCst);
    crate::suspend::on_fork_child();
}
