//! Survives the truncation of a file the hook maps shared.
//!
//! The region, its `.sm` sidecar and the node's tables are files other
//! processes can write, and so truncate: a sibling in the container, or (the
//! node tables in the shared `/tmp/vgpulock`) any container of the node.
//! An access to a page past a mapped file's end raises SIGBUS, which would
//! kill the application in the middle of a CUDA call.
//!
//! Every such mapping is registered here, and a SIGBUS handler whose fault
//! address lies in one **re-attaches** it: it opens the file's path again
//! (no symlink, a regular file only), extends it back to the mapping's
//! length, maps it shared at the same address (`MAP_FIXED`), lets the owner
//! refill what it knows ([`Repair`]: the region's limits and the process's
//! own slot) and returns: the faulting access is retried and succeeds.
//! Every process of the container faults on its next access, or finds the
//! file already extended by a sibling, so all of them share one file again:
//! the container's limits keep holding for the container as a whole, not
//! once per process (a private copy each would multiply the container's
//! share by its process count). What the file held is lost (its words
//! restart from zero: one bucket's burst, the container's usage until each
//! process re-publishes its own, `region::attach`).
//!
//! Only when the file cannot be re-opened (the path is no longer a regular
//! file the process may write) is the mapping replaced with private zero
//! pages, as the last resort that keeps the application alive; the loss is
//! logged. References into the mapping stay valid either way, so the launch
//! and allocation paths need no check of their own. Everything here is
//! async-signal-safe system calls (`open`, `fstat`, `ftruncate`, `mmap`,
//! `close`) and atomics.
//!
//! A SIGBUS at any other address, or one sent by kill(2), goes to the
//! handler the application had installed before, or (none) is re-raised
//! with the default action, so an unrelated fault still kills as it would
//! have. An application that
//! installs its own SIGBUS handler later replaces this one, and then a
//! truncation kills it again, as without the hook.

pub(crate) mod shared;

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::Path;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize};
use std::sync::Once;

use crate::signal::Previous;

/// Refills a re-attached or replaced mapping (`len` bytes at `base`, zeroed
/// by the truncation) from what the process knows; `ctx` is the word given
/// to [`guard`].
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
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Region),
            2 => Some(Self::Sidecar),
            _ => None,
        }
    }

    /// What a re-attached file restarts from.
    fn restart(self) -> &'static str {
        match self {
            Self::Region => "the region: its limits and this process's usage are published again",
            Self::Sidecar => "the SM sidecar: the container's buckets restart empty",
        }
    }

    /// What the process goes on with.
    fn consequence(self) -> &'static str {
        match self {
            Self::Region => {
                "the region: this process keeps its limits and its own usage, counted alone"
            }
            Self::Sidecar => {
                "the SM sidecar: this process now takes its part of the container's SM limit"
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
    /// The file's path (a leaked `CString`; 0 = none: never re-attached).
    path: AtomicUsize,
    /// Re-attachments so far, and how many of them were logged.
    reattached: AtomicUsize,
    reattached_logged: AtomicUsize,
    /// The mapped file's device and inode (0: unknown), to notice a file
    /// replaced at the path ([`follow_replaced`]).
    dev: AtomicU64,
    ino: AtomicU64,
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
        path: AtomicUsize::new(0),
        reattached: AtomicUsize::new(0),
        reattached_logged: AtomicUsize::new(0),
        dev: AtomicU64::new(0),
        ino: AtomicU64::new(0),
    }
}; SLOTS];
/// Entries handed out (never returned: mappings are never unmapped).
static USED: AtomicUsize = AtomicUsize::new(0);
/// Mappings replaced so far (for the log, read outside the handler).
static REPLACED: AtomicUsize = AtomicUsize::new(0);
/// Mappings re-attached so far (likewise).
static REATTACHED: AtomicUsize = AtomicUsize::new(0);

static PREV: Previous = Previous::new();
static INSTALL: Once = Once::new();

/// Registers `len` bytes of `path` mapped shared at `base` (page aligned)
/// and installs the handler on first use. False when the mapping could not
/// be guarded (logged): a truncation then kills the process, as without the
/// hook. `path: None` (or one with a NUL byte): a truncation leaves the
/// process a private copy instead of re-attaching the file.
pub fn guard(
    kind: Kind,
    base: *const u8,
    len: usize,
    path: Option<&Path>,
    repair: Option<Repair>,
    ctx: usize,
) -> bool {
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
    // Absolute now: the handler must find the same file whatever the
    // application's working directory is by then.
    let abs = path.map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_owned()));
    let (dev, ino) = abs.as_deref().map_or((0, 0), identity);
    g.dev.store(dev, Relaxed);
    g.ino.store(ino, Relaxed);
    let c_path = abs.and_then(|p| CString::new(p.into_os_string().into_encoded_bytes()).ok());
    // Leaked: the handler reads it for the process's whole life.
    g.path
        .store(c_path.map_or(0, |c| CString::into_raw(c) as usize), Relaxed);
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

/// Whether the mapping containing `addr` was replaced with private pages
/// (the file could not be re-attached). A slow-path check: a scan of the
/// registered mappings.
pub fn is_lost(addr: *const u8) -> bool {
    find(addr as usize).is_some_and(|g| g.state.load(Acquire) == LOST)
}

/// How many mappings were replaced so far.
#[cfg(test)]
pub fn replaced() -> usize {
    REPLACED.load(Relaxed)
}

/// How many times the mapping containing `addr` was re-attached.
#[cfg(test)]
pub fn reattached(addr: *const u8) -> usize {
    find(addr as usize).map_or(0, |g| g.reattached.load(Acquire))
}

/// Logs each mapping lost since the last call, once (slow paths call it:
/// the handler itself cannot log).
pub fn report_losses() {
    if REPLACED.load(Relaxed) == 0 && REATTACHED.load(Relaxed) == 0 {
        return;
    }
    let n = USED.load(Acquire).min(SLOTS);
    for g in GUARDED.iter().take(n) {
        let r = g.reattached.load(Acquire);
        if g.reattached_logged.swap(r, Relaxed) != r {
            if let Some(kind) = Kind::from_u8(g.kind.load(Relaxed)) {
                vlog!(
                    crate::log::WARN,
                    "a shared file was truncated or replaced by another process; re-attached to it ({r} time(s) so far): {}",
                    kind.restart()
                );
            }
        }
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

/// Re-attaches (or, failing that, replaces) the guarded mapping containing
/// `addr`; false when none does or the kernel refused. Async-signal-safe.
/// Threads faulting on one mapping at once: the first re-attaches it, the
/// others wait for that and retry.
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
            // Re-attached (MAPPED) or replaced (LOST): retry the access.
            return true;
        }
    }
    let (base, len) = (g.base.load(Relaxed), g.len.load(Acquire));
    let repair = g.repair.load(Relaxed);
    let path = g.path.load(Relaxed);
    if let Some((dev, ino)) = (path != 0)
        .then(|| reattach(base, len, path as *const c_char))
        .flatten()
    {
        g.dev.store(dev, Relaxed);
        g.ino.store(ino, Relaxed);
        run_repair(repair, base, len, g.ctx.load(Acquire));
        g.reattached.fetch_add(1, AcqRel);
        REATTACHED.fetch_add(1, Relaxed);
        g.state.store(MAPPED, Release);
        return true;
    }
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
    run_repair(repair, base, len, g.ctx.load(Acquire));
    REPLACED.fetch_add(1, Relaxed);
    g.state.store(LOST, Release);
    true
}

fn run_repair(repair: usize, base: usize, len: usize, ctx: usize) {
    if repair != 0 {
        // SAFETY: only `guard` stores this word, from a `Repair`.
        let f: Repair = unsafe { std::mem::transmute::<usize, Repair>(repair) };
        f(base, len, ctx);
    }
}

/// The device and inode of the regular file at `path` (not following a
/// symlink); `(0, 0)` when there is none.
fn identity(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_file())
        .map_or((0, 0), |m| (m.dev(), m.ino()))
}

/// Least interval between two looks for replaced files.
const FOLLOW_EVERY_NS: u64 = 1_000_000_000;
/// CLOCK_MONOTONIC ns of the next look.
static NEXT_FOLLOW: AtomicU64 = AtomicU64::new(0);

/// At most once a second (`now`: CLOCK_MONOTONIC ns), re-attaches every
/// guarded mapping whose path now names another regular file than the one
/// mapped: a tenant that renames a fresh file over its sidecar or region
/// would otherwise have the processes started since on one file and the
/// older ones on another, each set with its own bucket or usage sum. The
/// owner's repair runs on the new file (the region's limits and this
/// process's own slot). One `stat` per mapping when due; one relaxed load
/// otherwise. Returns how many were re-attached.
pub fn follow_replaced(now: u64) -> usize {
    let next = NEXT_FOLLOW.load(Relaxed);
    if now < next
        || NEXT_FOLLOW
            .compare_exchange(next, now.saturating_add(FOLLOW_EVERY_NS), Relaxed, Relaxed)
            .is_err()
    {
        return 0;
    }
    let n = USED.load(Acquire).min(SLOTS);
    let mut done = 0;
    for g in GUARDED.iter().take(n) {
        let (len, path) = (g.len.load(Acquire), g.path.load(Acquire));
        if len == 0 || path == 0 || g.state.load(Acquire) != MAPPED {
            continue;
        }
        // SAFETY: `path` is a leaked NUL-terminated `CString` (`guard`).
        let c = unsafe { std::ffi::CStr::from_ptr(path as *const c_char) };
        let p =
            Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(c.to_bytes()));
        let now_id = identity(p);
        if now_id == (0, 0) || now_id == (g.dev.load(Relaxed), g.ino.load(Relaxed)) {
            continue;
        }
        if g.state
            .compare_exchange(MAPPED, REPLACING, AcqRel, Acquire)
            .is_err()
        {
            continue;
        }
        let base = g.base.load(Relaxed);
        if let Some((dev, ino)) = reattach(base, len, path as *const c_char) {
            g.dev.store(dev, Relaxed);
            g.ino.store(ino, Relaxed);
            run_repair(g.repair.load(Relaxed), base, len, g.ctx.load(Acquire));
            g.reattached.fetch_add(1, AcqRel);
            REATTACHED.fetch_add(1, Relaxed);
            done += 1;
        }
        g.state.store(MAPPED, Release);
    }
    done
}

/// Maps the file at `path` (NUL-terminated) shared over `[base, base +
/// len)`, extending it to `len` bytes first; its device and inode, or
/// `None` when it is not a regular file this process can open read-write
/// (not following a symlink), or a call fails. Async-signal-safe: system
/// calls only.
fn reattach(base: usize, len: usize, path: *const c_char) -> Option<(u64, u64)> {
    let flags = libc::O_RDWR
        | libc::O_CREAT
        | libc::O_NOFOLLOW
        | libc::O_NONBLOCK
        | libc::O_NOCTTY
        | libc::O_CLOEXEC;
    // SAFETY: `path` is a leaked NUL-terminated `CString` (`guard`); the
    // calls are plain system calls on a descriptor opened here and closed
    // before returning, and on `[base, base + len)`, a mapping this process
    // made and never unmaps: mapping the file over it at the same address
    // keeps every reference into it valid (all atomics, any bytes valid).
    unsafe {
        let fd = libc::open(path, flags, 0o666 as libc::c_uint);
        if fd < 0 {
            return None;
        }
        let mut st: libc::stat = std::mem::zeroed();
        let usable = libc::fstat(fd, &mut st) == 0
            && st.st_mode & libc::S_IFMT == libc::S_IFREG
            && (u64::try_from(st.st_size).unwrap_or(0) >= len as u64
                || libc::ftruncate(fd, len as libc::off_t) == 0);
        let p = if usable {
            libc::mmap(
                base as *mut c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        };
        libc::close(fd);
        (p != libc::MAP_FAILED).then_some((st.st_dev, st.st_ino))
    }
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
        let p = map_shared(&file, len);
        (file, p)
    }

    /// A new shared read-write mapping of `file`'s first `len` bytes.
    fn map_shared(file: &std::fs::File, len: usize) -> *const u8 {
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
        p as *const u8
    }

    /// A fault outside the guarded mappings, and a SIGBUS sent by raise(3),
    /// still kill (the default action, re-raised) in an application that
    /// had no handler of its own.
    #[test]
    fn other_sigbus_keeps_its_default_action() {
        let dir = tempfile::tempdir().unwrap();
        let (_file, base) = mapped(dir.path(), 4096);
        assert!(guard(Kind::Sidecar, base, 4096, None, None, 0));
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
        assert!(guard(Kind::Sidecar, base, len, None, Some(count_repair), 0));
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
        assert!(guard(Kind::Sidecar, base, len, None, Some(repair), 42));
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

    /// Writes `ctx` into the first word, counting nothing.
    fn stamp(base: usize, _len: usize, ctx: usize) {
        // SAFETY: `base` is the start of the re-attached, writable mapping.
        let w = unsafe { &*(base as *const AtomicU64) };
        w.store(ctx as u64, SeqCst);
    }

    /// A file renamed over a mapped one is followed, at most once per
    /// `FOLLOW_EVERY_NS`: the mapping then shows the new file, and the
    /// owner's repair runs on it.
    #[test]
    fn a_file_renamed_over_the_mapped_one_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let len = 4096;
        let (_file, base) = mapped(dir.path(), len);
        let path = dir.path().join("f");
        assert!(guard(Kind::Sidecar, base, len, Some(&path), Some(stamp), 9));
        // SAFETY: inside the mapping, 8-aligned.
        let w = unsafe { &*(base.add(8) as *const AtomicU64) };
        w.store(1, SeqCst);
        let fresh = dir.path().join("g");
        let mut bytes = vec![0u8; len];
        bytes[8] = 42;
        std::fs::write(&fresh, &bytes).unwrap();
        std::fs::rename(&fresh, &path).unwrap();
        let t0 = 1u64 << 62;
        assert!(follow_replaced(t0) >= 1);
        assert_eq!(w.load(SeqCst), 42, "the new file is mapped");
        // SAFETY: as above.
        let first = unsafe { &*(base as *const AtomicU64) };
        assert_eq!(first.load(SeqCst), 9, "repaired in the new file");
        assert_eq!(reattached(base), 1);
        // Not looked at again within a second, and nothing to follow after.
        std::fs::write(&fresh, vec![0u8; len]).unwrap();
        std::fs::rename(&fresh, &path).unwrap();
        assert_eq!(follow_replaced(t0 + 1), 0);
        assert!(follow_replaced(t0 + FOLLOW_EVERY_NS) >= 1);
        assert_eq!(w.load(SeqCst), 0);
        assert_eq!(follow_replaced(t0 + 2 * FOLLOW_EVERY_NS), 0);
    }

    /// A truncated file that can be re-opened is re-attached, not copied:
    /// extended back to the mapping's length and shared again, so another
    /// mapping of the file (a sibling process) sees this one's writes, and
    /// the owner's repair runs on the shared file.
    #[test]
    fn a_truncated_file_is_reattached_and_shared_again() {
        let dir = tempfile::tempdir().unwrap();
        let len = 2 * 4096;
        let (file, base) = mapped(dir.path(), len);
        let path = dir.path().join("f");
        assert!(guard(Kind::Region, base, len, Some(&path), Some(stamp), 5));
        file.set_len(0).unwrap();
        // SAFETY: inside the mapping, 8-aligned.
        let w = unsafe { &*(base.add(4096) as *const AtomicU64) };
        assert_eq!(w.load(SeqCst), 0, "would be SIGBUS");
        assert_eq!(reattached(base), 1);
        assert!(!is_lost(base));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len as u64);
        // SAFETY: as above.
        let first = unsafe { &*(base as *const AtomicU64) };
        assert_eq!(first.load(SeqCst), 5, "repaired in the shared file");
        let (_f2, sibling) = {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let p = map_shared(&f, len);
            (f, p)
        };
        w.store(77, SeqCst);
        // SAFETY: inside the sibling's mapping, 8-aligned.
        let seen = unsafe { &*(sibling.add(4096) as *const AtomicU64) };
        assert_eq!(seen.load(SeqCst), 77);
        // Truncated again: re-attached again.
        file.set_len(0).unwrap();
        assert_eq!(w.load(SeqCst), 0);
        assert_eq!(reattached(base), 2);
        // The path replaced by a directory: no file to share, a private
        // copy keeps the process alive.
        file.set_len(0).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert_eq!(w.load(SeqCst), 0);
        assert!(is_lost(base));
    }
}
