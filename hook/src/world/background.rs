//! The process's one background thread: work whose cost (NVML queries,
//! milliseconds each on a real GPU) must stay off the launch and allocation
//! paths, and work that must happen while the application makes no CUDA call
//! at all (a training loop past its first steps, whose caching allocator no
//! longer calls the driver).
//!
//! Each [`Job`] is registered once and keeps its own schedule; the thread
//! wakes every [`TICK`] and runs every registered job. One thread serves
//! every job and every context of the process. A forked child, which has no
//! copy of its parent's thread, starts its own when a job is next
//! registered (a new context: CUDA state does not survive a fork).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// How often the thread wakes: a tenth of the SM limiter's feedback period,
/// so a due step waits at most that long.
pub const TICK: Duration = Duration::from_nanos(crate::sm::tuning::BACKGROUND_NS);

/// The work the thread runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// The SM limiter's feedback steps (`sm::controller`).
    SmFeedback,
    /// The look that counts device memory no entry point sees
    /// (`memory::modules`).
    MemoryLook,
}

const JOBS: usize = 2;

static REGISTERED: [OnceLock<fn()>; JOBS] = [OnceLock::new(), OnceLock::new()];

/// The PID whose thread runs (0: none yet).
static OWNER: AtomicU32 = AtomicU32::new(0);
static STARTING: Mutex<()> = Mutex::new(());
/// Set when the thread could not be started: callers then do a job's work
/// where they can (one atomic load, no system call).
static FAILED: AtomicBool = AtomicBool::new(false);

/// Whether starting the thread failed in this process.
pub fn failed() -> bool {
    FAILED.load(Relaxed)
}

/// Registers `run` as `job` (a job's first registration stays) and makes
/// sure this process's thread runs; `false` when it cannot be started (the
/// caller then does the work itself or goes without). Not for the launch or
/// allocation path: it reads the PID (a system call).
pub fn ensure(job: Job, run: fn()) -> bool {
    let _ = REGISTERED[job as usize].set(run);
    let pid = std::process::id();
    if OWNER.load(Acquire) == pid {
        return true;
    }
    // Another thread is starting it (or a fork caught the lock held): the
    // caller does this round itself.
    let Ok(_g) = STARTING.try_lock() else {
        return false;
    };
    if OWNER.load(Acquire) == pid {
        return true;
    }
    match std::thread::Builder::new()
        .name("vgpu-bg".into())
        .spawn(|| loop {
            std::thread::sleep(TICK);
            tick();
        }) {
        Ok(_) => {
            OWNER.store(pid, Release);
            FAILED.store(false, Relaxed);
            true
        }
        Err(e) => {
            FAILED.store(true, Relaxed);
            vlog_once!(
                crate::log::WARN,
                "cannot start the hook's background thread ({e}): SM feedback steps run on the \
                 launch path, and memory no CUDA call shows is counted when memory info is asked"
            );
            false
        }
    }
}

/// One wake-up: each registered job once. A job that panics is logged and
/// runs again at the next tick; the others are not affected.
fn tick() {
    for (i, job) in REGISTERED.iter().enumerate() {
        let Some(run) = job.get() else { continue };
        if catch_unwind(AssertUnwindSafe(run)).is_err() {
            vlog_once!(
                crate::log::WARN,
                "a background job ({i}) failed; it is retried each tick"
            );
        }
    }
}
