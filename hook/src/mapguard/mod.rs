//! Survives the truncation of a file the hook maps shared.
//!
//! The region, its `.sm` sidecar and the node's tables are files other
//! processes can write, and so truncate: a sibling in the container, or (the
//! node tables in the shared `/tmp/vgpulock`) any container of the node.
//! An access to a page past a mapped file's end raises SIGBUS, which would
//! kill the application in the middle of a CUDA call.
//!
//! Every such mapping is registered here, and a SIGBUS handler whose fault
//! address lies in one replaces that whole mapping, at the same address,
//! with private zero pages (`MAP_FIXED`, one async-signal-safe syscall),
//! lets the owner refill what it can ([`Repair`]), marks it lost and
//! returns: the faulting access is retried and succeeds. References into
//! the mapping stay valid, so the launch and allocation paths need no check
//! of their own. The process goes on detached from that file: what it
//! shared with others through it (the container's usage sum, the
//! container's buckets, the node's schedule) becomes process-private.
//!
//! A SIGBUS at any other address, or one sent by kill(2), goes to the
//! handler the application had installed before, or (none) is re-raised
//! with the default action, so an unrelated fault still kills as it would
//! have. An application that
//! installs its own SIGBUS handler later replaces this one, and then a
//! truncation kills it again, as without the hook.

pub(crate) mod shared;

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize};
use std::sync::Once;

use crate::signal::Previous;

/// Refills a replaced mapping (zeroed, `len` bytes at `base`) from what the
/// process knows; `ctx` is the word given to [`guard`].
/// Runs inside the signal handler: atomics only, no allocation, no lock.
pub type Repair = fn(base: usize, len: usize, ctx: usize);

/// Mappings a process can hold: the region and the sidecar per fork
/// generation, and a node table per GPU.
const SLOTS: usize = 64;

/// What a guarded mapping is, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Region = 1,
    Sidecar = 2,
    NodeTable = 3,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Region),
            2 => Some(Self::Sidecar),
            3 => Some(Self::NodeTable),
            _ => None,
        }
    }

    /// What the process goes on with.
    fn consequence(self) -> &'static str {
        match self {
            Self::Region => {
                "the region: this process keeps its limits and its own usage, counted alone"
            }
            Self::Sidecar => "the SM sidecar: the SM limit now holds for this process alone",
            Self::NodeTable => {
                "the node's SM table: this container no longer takes turns with the others"
            }
        }
    }
}

struct Guarded {
    kind: AtomicU8,
    /// The loss was logged.
    reported: AtomicBool,
    base: AtomicUsize,
    /// 0 = entry not (yet) usable.
    len: AtomicUsize,
    repair: AtomicUsize,
    ctx: AtomicUsize,
    /// `MAPPED`, `REPLACING` or `LOST`.
    state: AtomicU8,
}

const MAPPED: u8 = 0;
/// One thread is replacing the mapping; others that fault meanwhile wait.
const REPLACING: u8 = 1;
const LOST: u8 = 2;

static GUARDED: [Guarded; SLOTS] = [const {
    Guarded {
        kind: AtomicU8::new(0),
        reported: AtomicBool::new(false),
        base: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        repair: AtomicUsize::new(0),
        ctx: AtomicUsize::new(0),
        state: AtomicU8::new(MAPPED),
    }
}; SLOTS];
/// Entries handed out (never returned: mappings are never unmapped).
static USED: AtomicUsize = AtomicUsize::new(0);
/// Mappings replaced so far (for the log, read outside the handler).
static REPLACED: AtomicUsize = AtomicUsize::new(0);

static PREV: Previous = Previous::new();
static INSTALL: Once = Once::new();

/// Registers `len` bytes mapped at `base` (page aligned) and installs the
/// handler on first use. False when the mapping could not be guarded
/// (logged): a truncation then kills the process, as without the hook.
pub fn guard(kind: Kind, base: *const u8, len: usize, repair: Option<Repair>, ctx: usize) -> bool {
    INSTALL.call_once(install);
    let i = USED.fetch_add(1, SeqCst);
    let Some(g) = GUARDED.get(i) else {
        vlog_once!(
            crate::log::WARN,
            "more than {SLOTS} shared mappings; later ones are not guarded against truncation"
        );
        return false;
    };
    g.kind.store(kind as u8, Relaxed);
    g.reported.store(false, Relaxed);
    g.base.store(base as usize, Relaxed);
    g.repair.store(repair.map_or(0, |f| f as usize), Relaxed);
    g.ctx.store(ctx, Relaxed);
    g.state.store(MAPPED, Relaxed);
    g.len.store(len, Release);
    true
}

/// Forgets the mapping at `base` before its owner unmaps it (the range may
/// then be reused by anything).
pub fn unguard(base: *const u8) {
    if let Some(g) = find(base as usize) {
        g.len.store(0, SeqCst);
    }
}

/// Whether the mapping containing `addr` was replaced after a truncation.
#[cfg(test)]
pub fn is_lost(addr: *const u8) -> bool {
    find(addr as usize).is_some_and(|g| g.state.load(Acquire) == LOST)
}

/// How many mappings were replaced so far.
#[cfg(test)]
pub fn replaced() -> usize {
    REPLACED.load(Relaxed)
}

/// Logs each mapping lost since the last call, once (slow paths call it:
/// the handler itself cannot log).
pub fn report_losses() {
    if REPLACED.load(Relaxed) == 0 {
        return;
    }
    let n = USED.load(Acquire).min(SLOTS);
    for g in GUARDED.iter().take(n) {
        if g.state.load(Acquire) == LOST && !g.reported.swap(true, Relaxed) {
            if let Some(kind) = Kind::from_u8(g.kind.load(Relaxed)) {
                vlog!(
                    crate::log::WARN,
                    "a shared file was truncated by another process; going on with a private copy of {}",
                    kind.consequence()
                );
            }
        }
    }
}

fn find(addr: usize) -> Option<&'static Guarded> {
    let n = USED.load(Acquire).min(SLOTS);
    GUARDED.iter().take(n).find(|g| {
        let len = g.len.load(Acquire);
        let base = g.base.load(Relaxed);
        len != 0 && addr >= base && addr - base < len
    })
}

fn install() {
    // SAFETY: `sigaction` structs are plain C data, zero is a valid
    // starting value; the calls only read/write these locals.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
            vlog!(
                crate::log::WARN,
                "sigaction(SIGBUS) query failed; a truncated shared file would kill the process"
            );
            return;
        }
        PREV.remember(&old);
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = on_sigbus as *const () as usize;
        libc::sigemptyset(&mut new.sa_mask);
        // SA_ONSTACK: a fault may come from a thread on an alternate stack.
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        let mut raced: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, &new, &mut raced) != 0 {
            vlog!(
                crate::log::WARN,
                "sigaction(SIGBUS) failed; a truncated shared file would kill the process"
            );
            return;
        }
        if raced.sa_sigaction != old.sa_sigaction {
            PREV.remember(&raced);
        }
    }
}

extern "C" fn on_sigbus(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // Only a fault carries an address (`si_code > 0`); a SIGBUS sent with
    // kill(2) or raise(3) is never ours.
    let addr = if info.is_null() {
        0
    } else {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO
        // handler; a null one (a broken raise) is treated as "not ours".
        unsafe {
            if (*info).si_code > 0 {
                (*info).si_addr() as usize
            } else {
                0
            }
        }
    };
    if addr != 0 && replace(addr) {
        return;
    }
    chain(sig, info, ctx);
}

/// Replaces the guarded mapping containing `addr`; false when none does or
/// the kernel refused. Async-signal-safe. Threads faulting on one mapping at
/// once: the first replaces it, the others wait for that and retry.
fn replace(addr: usize) -> bool {
    let Some(g) = find(addr) else {
        return false;
    };
    match g.state.compare_exchange(MAPPED, REPLACING, AcqRel, Acquire) {
        Ok(_) => {}
        // Replaced already (the fault raced the replacement): retry.
        Err(LOST) => return true,
        Err(_) => {
            while g.state.load(Acquire) == REPLACING {
                std::hint::spin_loop();
            }
            return g.state.load(Acquire) == LOST;
        }
    }
    let (base, len) = (g.base.load(Relaxed), g.len.load(Acquire));
    // SAFETY: `[base, base + len)` is a mapping this process made and never
    // unmaps; replacing it with private anonymous pages of the same size at
    // the same address keeps every reference into it valid (all atomics, any
    // bytes are a valid value). mmap is a plain system call.
    let p = unsafe {
        libc::mmap(
            base as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        g.state.store(MAPPED, Release);
        return false;
    }
    let repair = g.repair.load(Relaxed);
    if repair != 0 {
        // SAFETY: only `guard` stores this word, from a `Repair`.
        let f: Repair = unsafe { std::mem::transmute::<usize, Repair>(repair) };
        f(base, len, g.ctx.load(Acquire));
    }
    REPLACED.fetch_add(1, Relaxed);
    g.state.store(LOST, Release);
    true
}

fn chain(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    if PREV.call(sig, info, ctx) {
        return;
    }
    // The default action (or SIG_IGN, which a fault would loop on): restore
    // it and re-raise; the signal is delivered as this handler returns (a
    // fault would also recur).
    // SAFETY: plain system calls on a zeroed, then filled, sigaction.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        libc::raise(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::AtomicU64;

    static REPAIRED: AtomicUsize = AtomicUsize::new(0);

    fn repair(base: usize, _len: usize, ctx: usize) {
        // SAFETY: `base` is the start of the replaced, writable mapping.
        let w = unsafe { &*(base as *const AtomicU64) };
        w.store(ctx as u64, SeqCst);
        REPAIRED.fetch_add(1, SeqCst);
    }

    /// A shared mapping of a fresh `len`-byte file in `dir`.
    fn mapped(dir: &std::path::Path, len: usize) -> (std::fs::File, *const u8) {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("f"))
            .unwrap();
        file.set_len(len as u64).unwrap();
        // SAFETY: a fresh shared mapping of the file's `len` bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        (file, p as *const u8)
    }

    /// A fault outside the guarded mappings, and a SIGBUS sent by raise(3),
    /// still kill (the default action, re-raised) in an application that
    /// had no handler of its own.
    #[test]
    fn other_sigbus_keeps_its_default_action() {
        let dir = tempfile::tempdir().unwrap();
        let (_file, base) = mapped(dir.path(), 4096);
        assert!(guard(Kind::Sidecar, base, 4096, None, 0));
        let other = tempfile::tempdir().unwrap();
        let (file, unguarded) = mapped(other.path(), 4096);
        file.set_len(0).unwrap();
        for fault in [true, false] {
            // SAFETY: the child only calls async-signal-safe functions (and
            // faults on purpose).
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // The test harness (Rust's std) has a SIGBUS handler of its
                // own; an application in C has none.
                PREV.forget();
                // SAFETY: reading a truncated mapping (the point), or raise.
                unsafe {
                    if fault {
                        std::ptr::read_volatile(unguarded);
                    } else {
                        libc::raise(libc::SIGBUS);
                    }
                    libc::_exit(0);
                }
            }
            let mut st = 0;
            // SAFETY: waiting for our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
            assert!(libc::WIFSIGNALED(st), "fault {fault}: status {st:#x}");
            assert_eq!(libc::WTERMSIG(st), libc::SIGBUS);
        }
        assert!(!is_lost(base));
    }

    static RACE_REPAIRS: AtomicUsize = AtomicUsize::new(0);

    fn count_repair(_base: usize, _len: usize, _ctx: usize) {
        RACE_REPAIRS.fetch_add(1, SeqCst);
    }

    /// Eight threads hitting a truncated mapping at once all survive; the
    /// mapping is replaced (and repaired) once.
    #[test]
    fn threads_faulting_at_once_replace_the_mapping_once() {
        let dir = tempfile::tempdir().unwrap();
        let len = 16 * 4096;
        let (file, base) = mapped(dir.path(), len);
        assert!(guard(Kind::NodeTable, base, len, Some(count_repair), 0));
        file.set_len(0).unwrap();
        let addr = base as usize;
        let threads: Vec<_> = (0..8)
            .map(|i| {
                std::thread::spawn(move || {
                    // SAFETY: inside the (guarded) mapping, 8-aligned.
                    let w = unsafe { &*((addr + i * 4096) as *const AtomicU64) };
                    w.fetch_add(1, SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(is_lost(base));
        assert_eq!(RACE_REPAIRS.load(SeqCst), 1);
    }

    /// A mapped file truncated under the process: the access that would
    /// raise SIGBUS reads the repaired private copy instead, and the
    /// mapping is reported lost.
    #[test]
    fn a_truncated_mapping_is_replaced_and_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let len = 3 * 4096;
        let (file, base) = mapped(dir.path(), len);
        // SAFETY: inside the mapping, 8-aligned.
        let last = unsafe { &*(base.add(2 * 4096) as *const AtomicU64) };
        // SAFETY: as above.
        let first = unsafe { &*(base as *const AtomicU64) };
        last.store(7, SeqCst);
        assert!(guard(Kind::Sidecar, base, len, Some(repair), 42));
        assert!(!is_lost(base));
        file.set_len(0).unwrap();
        // Would be SIGBUS: past the end of the file.
        assert_eq!(last.load(SeqCst), 0);
        assert!(is_lost(base));
        assert_eq!(first.load(SeqCst), 42, "repaired");
        assert_eq!(REPAIRED.load(SeqCst), 1);
        last.store(9, SeqCst);
        assert_eq!(last.load(SeqCst), 9);
        assert!(replaced() >= 1);
    }
}
