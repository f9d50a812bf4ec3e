//! The cross-process lock over the state file.
//!
//! A word in the header holds the owner id (slot + 1, or [`SERVER_OWNER`]).
//! It is taken with a compare-and-swap and waited for by spinning, then
//! yielding, then short sleeps. No pthread mutex: a robust mutex records
//! namespace TIDs, which collide between containers (every `unshare --pid`
//! child is PID 1). A holder killed by SIGKILL cannot wedge anyone: the
//! server, which sees every client's connection close, clears the word if
//! the dead process held it ([`release_if_owner`]). Every update done under
//! the lock is a single atomic store, so a half-finished critical section
//! leaves consistent state.
//!
//! Threads of one process are serialized first by an in-process mutex, so
//! the owner id only has to tell processes apart.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::shm::Shm;

/// Owner id the server uses.
pub const SERVER_OWNER: u32 = u32::MAX;

static IN_PROCESS: Mutex<()> = Mutex::new(());

/// Holds the cross-process lock until dropped.
pub struct ShmLock<'a> {
    word: &'a AtomicU32,
    owner: u32,
    _local: MutexGuard<'static, ()>,
}

impl<'a> ShmLock<'a> {
    /// Takes the lock of `shm` as `owner` (slot + 1, or [`SERVER_OWNER`]).
    pub fn acquire(shm: &'a Shm, owner: u32) -> ShmLock<'a> {
        let local = IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        let word = &shm.shared().header.lock;
        let mut spins = 0u32;
        loop {
            if word
                .compare_exchange_weak(0, owner, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return ShmLock {
                    word,
                    owner,
                    _local: local,
                };
            }
            spins = spins.saturating_add(1);
            if spins < 100 {
                std::hint::spin_loop();
            } else if spins < 1_000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
}

impl Drop for ShmLock<'_> {
    fn drop(&mut self) {
        let _ = self
            .word
            .compare_exchange(self.owner, 0, Ordering::Release, Ordering::Relaxed);
    }
}

/// Clears the lock if `owner` holds it (the server calls this when that
/// owner's process is gone). Returns whether it did.
pub fn release_if_owner(shm: &Shm, owner: u32) -> bool {
    shm.shared()
        .header
        .lock
        .compare_exchange(owner, 0, Ordering::Release, Ordering::Relaxed)
        .is_ok()
}
