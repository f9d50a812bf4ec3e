//! Suspend / resume (HAMi-core's protocol): `SIGUSR2` sets this
//! process's slot `status` to 2 (suspended), `SIGUSR1` back to 1 (running);
//! allocations and launches wait while suspended ([`ensure_running`]).
//!
//! The handlers only do atomic stores: to [`SUSPENDED`] and, through a
//! pointer published before they are installed, to the slot's `status`
//! (lock-free `AtomicI32`, async-signal-safe). They then *chain* to the
//! handler the application had installed before (called as it expects:
//! `sa_sigaction` with `SA_SIGINFO`, else `sa_handler`). A previous
//! `SIG_DFL` (terminate) is not chained, that being the point of catching
//! the signals; nor is `SIG_IGN` (nothing to call — the signal no longer
//! goes unnoticed, but has no other effect; a child `exec`'d later gets
//! `SIG_DFL` instead of the inherited `SIG_IGN`). The previous handler's
//! mask and `SA_RESTART`/`SA_ONSTACK`/`SA_NODEFER` are kept; its
//! `SA_RESETHAND` is not honoured (it is chained every time). An
//! application that installs its own handler later replaces ours; it is
//! then simply not suspendable (as with HAMi, whose handlers replace the
//! application's).

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr};
use std::sync::Once;
use std::time::Duration;

use vgpu_common::region::status;

use crate::signal::{is_function, Handler, Previous};

/// Set by SIGUSR2, cleared by SIGUSR1: the one load of the hot path.
static SUSPENDED: AtomicBool = AtomicBool::new(false);
/// This process's slot `status` (null before registration and in a fork
/// child until it registers its own slot).
static STATUS: AtomicPtr<AtomicI32> = AtomicPtr::new(std::ptr::null_mut());

/// The application's previous actions for the two signals.
static PREV_USR1: Previous = Previous::new();
static PREV_USR2: Previous = Previous::new();
static INSTALL: Once = Once::new();

/// Waits while this process is suspended. One relaxed load when it is not.
#[inline]
pub fn ensure_running() {
    if SUSPENDED.load(Relaxed) {
        wait_while_suspended();
    }
}

#[cold]
fn wait_while_suspended() {
    vlog!(crate::log::INFO, "suspended (SIGUSR2); waiting for SIGUSR1");
    while SUSPENDED.load(Acquire) {
        let p = STATUS.load(Acquire);
        // SAFETY: `STATUS` only holds a pointer into the region mapping of
        // the current `Process`, which is never unmapped.
        if !p.is_null() && unsafe { (*p).load(SeqCst) } == status::RUNNING {
            // Resumed by a direct write of the status word.
            SUSPENDED.store(false, SeqCst);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    vlog!(crate::log::INFO, "resumed");
}

/// Publishes this process's slot `status` word, then installs the handlers
/// (once per process; they survive `fork`).
pub fn register(status_word: &'static AtomicI32) {
    STATUS.store(status_word as *const AtomicI32 as *mut AtomicI32, Release);
    INSTALL.call_once(|| {
        install(libc::SIGUSR1, &PREV_USR1, on_sigusr1);
        install(libc::SIGUSR2, &PREV_USR2, on_sigusr2);
    });
}

/// `pthread_atfork` child: the parent's slot is not ours any more.
pub fn on_fork_child() {
    STATUS.store(std::ptr::null_mut(), SeqCst);
    SUSPENDED.store(false, SeqCst);
}

fn install(sig: c_int, prev: &'static Previous, handler: Handler) {
    // SAFETY: `sigaction` structs are plain C data, zero is a valid
    // starting value; the calls only read/write these locals.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            vlog!(
                crate::log::WARN,
                "sigaction({sig}) query failed; suspend/resume unavailable"
            );
            return;
        }
        prev.remember(&old);
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = handler as *const () as usize;
        let keep = libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER;
        new.sa_flags = if is_function(old.sa_sigaction) {
            new.sa_mask = old.sa_mask;
            libc::SA_SIGINFO | (old.sa_flags & keep)
        } else {
            libc::sigemptyset(&mut new.sa_mask);
            libc::SA_SIGINFO | libc::SA_RESTART
        };
        let mut raced: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, &new, &mut raced) != 0 {
            vlog!(
                crate::log::WARN,
                "sigaction({sig}) failed; suspend/resume unavailable"
            );
            return;
        }
        // Another thread may have installed a handler in between.
        if raced.sa_sigaction != old.sa_sigaction {
            prev.remember(&raced);
        }
    }
}

fn set_status(v: i32) {
    let p = STATUS.load(Acquire);
    if !p.is_null() {
        // SAFETY: see `wait_while_suspended`; a lock-free atomic store is
        // async-signal-safe.
        unsafe { (*p).store(v, SeqCst) };
    }
}

extern "C" fn on_sigusr1(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    SUSPENDED.store(false, SeqCst);
    set_status(status::RUNNING);
    PREV_USR1.call(sig, info, ctx);
}

extern "C" fn on_sigusr2(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    SUSPENDED.store(true, SeqCst);
    set_status(status::SUSPENDED);
    PREV_USR2.call(sig, info, ctx);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    static APP_CALLS: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn app_handler(_sig: c_int) {
        APP_CALLS.fetch_add(1, SeqCst);
    }

    /// The handlers flip the status word and the flag, and chain to an
    /// application handler installed before them.
    #[test]
    fn signals_flip_the_status_and_chain() {
        // SAFETY: installs a plain one-argument handler for SIGUSR1.
        unsafe { libc::signal(libc::SIGUSR1, app_handler as *const () as usize) };
        let word: &'static AtomicI32 = Box::leak(Box::new(AtomicI32::new(status::RUNNING)));
        register(word);
        // SAFETY: raising a signal we now handle.
        unsafe { libc::raise(libc::SIGUSR2) };
        assert_eq!(word.load(SeqCst), status::SUSPENDED);
        assert!(SUSPENDED.load(SeqCst));
        let t = std::thread::spawn(ensure_running);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "ensure_running returned while suspended");
        // SAFETY: as above.
        unsafe { libc::raise(libc::SIGUSR1) };
        t.join().unwrap();
        assert_eq!(word.load(SeqCst), status::RUNNING);
        assert_eq!(APP_CALLS.load(SeqCst), 1);
    }
}
