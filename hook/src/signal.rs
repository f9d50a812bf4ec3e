//! The application's previous action for a signal the hook handles
//! (SIGUSR1/SIGUSR2 for suspend, SIGBUS for truncated mappings): saved when
//! the hook installs its handler, called from it. Async-signal-safe:
//! atomics only.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicI32, AtomicUsize};

/// A three-argument (`SA_SIGINFO`) signal handler.
pub(crate) type Handler = extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void);

/// Whether `h` is a handler function, not `SIG_DFL`, `SIG_IGN` or `SIG_ERR`.
pub(crate) fn is_function(h: libc::sighandler_t) -> bool {
    h != libc::SIG_DFL && h != libc::SIG_IGN && h != libc::SIG_ERR
}

/// One signal's previous action.
pub(crate) struct Previous {
    handler: AtomicUsize,
    flags: AtomicI32,
}

impl Previous {
    /// `SIG_DFL`, until [`Self::remember`].
    pub(crate) const fn new() -> Previous {
        Previous {
            handler: AtomicUsize::new(libc::SIG_DFL),
            flags: AtomicI32::new(0),
        }
    }

    pub(crate) fn remember(&self, old: &libc::sigaction) {
        self.flags.store(old.sa_flags, Relaxed);
        self.handler.store(old.sa_sigaction, Release);
    }

    /// The saved handler (possibly `SIG_DFL`, `SIG_IGN` or `SIG_ERR`).
    pub(crate) fn handler(&self) -> libc::sighandler_t {
        self.handler.load(Acquire)
    }

    /// Calls the saved handler as it was installed (with or without
    /// `SA_SIGINFO`); false, calling nothing, when it is no function.
    pub(crate) fn call(&self, sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) -> bool {
        let h = self.handler();
        if !is_function(h) {
            return false;
        }
        if self.flags.load(Relaxed) & libc::SA_SIGINFO != 0 {
            // SAFETY: the application installed `h` with SA_SIGINFO, so it
            // is a three-argument signal handler.
            let f: Handler = unsafe { std::mem::transmute::<usize, Handler>(h) };
            f(sig, info, ctx);
        } else {
            // SAFETY: installed without SA_SIGINFO: a one-argument handler.
            let f: extern "C" fn(c_int) =
                unsafe { std::mem::transmute::<usize, extern "C" fn(c_int)>(h) };
            f(sig);
        }
        true
    }

    /// Forgets the saved handler (the default action from now on).
    #[cfg(test)]
    pub(crate) fn forget(&self) {
        self.handler.store(libc::SIG_DFL, Release);
    }
}
