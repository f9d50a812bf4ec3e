//! What a launching thread keeps for itself, so that a limited launch whose
//! cost is known takes no lock: the costs of the keys it launched recently
//! (copied from the process's table, `cost::Costs`, each good for the
//! launches left before that key's next timing sample is due), and whether
//! its previous launch waited for the bucket.
//!
//! An entry may lag the table by up to `cost::SAMPLE_EVERY` launches when
//! another thread's sample changes the estimate; the table catches up at
//! the entry's next sample.

#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use super::cost::{Charge, Key};

/// Entries per thread (direct-mapped by the key's handle).
const SLOTS: usize = crate::sm::tuning::CACHE_SLOTS;

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The controller it belongs to (`0` = empty).
    owner: u64,
    key: Key,
    cost_ns: u64,
    /// Launches it may still charge.
    left: u64,
    /// Launches it charged, not yet counted in the table.
    used: u64,
}

const EMPTY: Entry = Entry {
    owner: 0,
    key: Key::Graph { exec: 0 },
    cost_ns: 0,
    left: 0,
    used: 0,
};

#[derive(Debug)]
struct Local {
    slept: bool,
    entries: [Entry; SLOTS],
}

thread_local! {
    static LOCAL: RefCell<Local> = const {
        RefCell::new(Local {
            slept: false,
            entries: [EMPTY; SLOTS],
        })
    };
}

/// A process-unique id for a controller (tests build several per thread).
pub fn new_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}

fn slot(key: &Key) -> usize {
    let h = key.handle();
    ((h >> 4) ^ (h >> 10)) % SLOTS
}

/// What the thread knows before a launch of `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    /// Its previous launch waited for the bucket.
    pub slept: bool,
    /// `Ok(cost)`: charge it, the table need not know yet. `Err(n)`: ask the
    /// table, telling it of `n` launches charged from this thread's entry.
    pub cost: Result<u64, u64>,
}

/// What a thread whose cache cannot be used (being torn down, or borrowed
/// already) knows: nothing.
const MISS: Lookup = Lookup {
    slept: false,
    cost: Err(0),
};

/// Runs `f` on this thread's cache; `None` when it cannot be used.
fn with_local<T>(f: impl FnOnce(&mut Local) -> T) -> Option<T> {
    LOCAL
        .try_with(|l| l.try_borrow_mut().ok().map(|mut l| f(&mut l)))
        .ok()
        .flatten()
}

/// Looks `key` up for `owner`'s next launch, counting it if it hits.
pub fn lookup(owner: u64, key: &Key) -> Lookup {
    with_local(|l| {
        let slept = l.slept;
        let e = &mut l.entries[slot(key)];
        let cost = if e.owner == owner && e.key == *key {
            if e.left > 0 {
                e.left -= 1;
                e.used += 1;
                Ok(e.cost_ns)
            } else {
                Err(std::mem::take(&mut e.used))
            }
        } else {
            Err(0)
        };
        Lookup { slept, cost }
    })
    .unwrap_or(MISS)
}

/// Keeps the table's answer for `key` (while no sample is due for it).
/// The entry's cost for a launch of `key` when it serves one more (no
/// sample due) and `fits(cost)` agrees, counted as a use; otherwise
/// `None`, the entry untouched (the launch then `lookup`s as usual).
pub fn take_if(owner: u64, key: &Key, fits: impl FnOnce(u64) -> bool) -> Option<u64> {
    with_local(|l| {
        let e = &mut l.entries[slot(key)];
        if e.owner != owner || e.key != *key || e.left == 0 || !fits(e.cost_ns) {
            return None;
        }
        e.left -= 1;
        e.used += 1;
        Some(e.cost_ns)
    })
    .flatten()
}

pub fn store(owner: u64, key: &Key, c: &Charge) {
    with_local(|l| {
        l.entries[slot(key)] = if c.until_due > 0 {
            Entry {
                owner,
                key: *key,
                cost_ns: c.cost_ns,
                left: c.until_due,
                used: 0,
            }
        } else {
            EMPTY
        };
    });
}

/// Records whether this thread's launch waited for the bucket.
pub fn set_slept(slept: bool) {
    with_local(|l| l.slept = slept);
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: Key = Key::Kernel {
        func: 0x7f00_1230,
        grid: [1, 1, 1],
        block: [32, 1, 1],
    };

    fn charge(cost_ns: u64, until_due: u64) -> Charge {
        Charge {
            cost_ns,
            sample: false,
            until_due,
        }
    }

    #[test]
    fn an_entry_serves_until_a_sample_is_due_then_reports_its_launches() {
        let me = new_owner();
        assert_eq!(lookup(me, &K).cost, Err(0));
        store(me, &K, &charge(5_000, 3));
        for _ in 0..3 {
            assert_eq!(lookup(me, &K).cost, Ok(5_000));
        }
        assert_eq!(lookup(me, &K).cost, Err(3));
        // Not asked again until the table answers.
        assert_eq!(lookup(me, &K).cost, Err(0));
        // A guess, or a sample due: nothing kept.
        store(me, &K, &charge(5_000, 0));
        assert_eq!(lookup(me, &K).cost, Err(0));
    }

    #[test]
    fn entries_are_per_controller_and_per_key() {
        let (a, b) = (new_owner(), new_owner());
        store(a, &K, &charge(5_000, 10));
        assert_eq!(lookup(b, &K).cost, Err(0));
        let other = Key::Kernel {
            func: 0x7f00_1230,
            grid: [2, 1, 1],
            block: [32, 1, 1],
        };
        assert_eq!(lookup(a, &other).cost, Err(0));
        assert_eq!(lookup(a, &K).cost, Ok(5_000));
    }

    #[test]
    fn the_last_sleep_is_remembered() {
        set_slept(true);
        assert!(lookup(new_owner(), &K).slept);
        set_slept(false);
        assert!(!lookup(new_owner(), &K).slept);
    }
}
