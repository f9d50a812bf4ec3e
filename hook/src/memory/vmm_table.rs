//! The table behind [`vmm_lifetime`](super::vmm_lifetime): each counted
//! VMM handle's references and mappings, one per process in
//! `Process::vmm`. It knows nothing of the process, so the process can own
//! it while `vmm_lifetime` works on both.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

/// A counted handle's references and mappings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Life {
    refs: u32,
    maps: u32,
    gen: u64,
}

impl Life {
    fn dead(&self) -> bool {
        self.refs == 0 && self.maps == 0
    }
}

/// A mapping of a counted handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mapping {
    handle: u64,
    gen: u64,
}

#[derive(Debug, Default)]
struct Table {
    lives: HashMap<u64, Life>,
    /// Start address → mapping.
    maps: BTreeMap<u64, Mapping>,
    next_gen: u64,
}

impl Table {
    /// The row of `m`'s handle, if `m` was made in its generation.
    fn life_of(&mut self, m: Mapping) -> Option<&mut Life> {
        self.lives.get_mut(&m.handle).filter(|l| l.gen == m.gen)
    }
}

/// What an unmap took away, to put back if the driver refuses it.
#[derive(Debug, Default)]
pub(super) struct Unmapped {
    pub(super) maps: Vec<(u64, Mapping)>,
    /// Handles left with neither references nor mappings: (handle, generation).
    pub(super) dead: Vec<(u64, u64)>,
}

/// The lifetime table of one process's counted VMM handles.
#[derive(Debug, Default)]
pub struct Lifetimes {
    table: Mutex<Table>,
}

impl Lifetimes {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `handle` was just counted by `cuMemCreate`: one reference, no
    /// mapping (a previous row of the same value is stale: the driver
    /// freed that handle before handing the value out again).
    pub fn created(&self, handle: u64) {
        let mut t = self.lock();
        t.next_gen += 1;
        let gen = t.next_gen;
        t.lives.insert(
            handle,
            Life {
                refs: 1,
                maps: 0,
                gen,
            },
        );
    }

    pub(super) fn retained(&self, handle: u64) {
        if let Some(l) = self.lock().lives.get_mut(&handle) {
            l.refs += 1;
        }
    }

    pub(super) fn mapped(&self, ptr: u64, handle: u64) {
        let mut t = self.lock();
        let Some(l) = t.lives.get_mut(&handle) else {
            return;
        };
        l.maps += 1;
        let gen = l.gen;
        t.maps.insert(ptr, Mapping { handle, gen });
    }

    /// Drops one reference of a counted handle; `Some(gen, dead)` when
    /// `handle` is counted and referenced.
    pub(super) fn release(&self, handle: u64) -> Option<(u64, bool)> {
        let mut t = self.lock();
        let l = t.lives.get_mut(&handle).filter(|l| l.refs > 0)?;
        l.refs -= 1;
        let (gen, dead) = (l.gen, l.dead());
        if dead {
            t.lives.remove(&handle);
        }
        Some((gen, dead))
    }

    /// Puts back the reference [`Self::release`] took.
    pub(super) fn unrelease(&self, handle: u64, gen: u64) {
        let mut t = self.lock();
        let l = t.lives.entry(handle).or_insert(Life {
            refs: 0,
            maps: 0,
            gen,
        });
        if l.gen == gen {
            l.refs += 1;
        }
    }

    /// Removes the mappings that start in `[ptr, ptr + size)`.
    pub(super) fn unmap(&self, ptr: u64, size: u64) -> Unmapped {
        let mut t = self.lock();
        let end = ptr.saturating_add(size);
        let starts: Vec<u64> = t.maps.range(ptr..end).map(|(&s, _)| s).collect();
        let mut out = Unmapped::default();
        for s in starts {
            let Some(m) = t.maps.remove(&s) else {
                continue;
            };
            out.maps.push((s, m));
            let Some(l) = t.life_of(m) else {
                continue;
            };
            l.maps = l.maps.saturating_sub(1);
            if l.dead() {
                t.lives.remove(&m.handle);
                out.dead.push((m.handle, m.gen));
            }
        }
        out
    }

    /// Puts back what [`Self::unmap`] removed.
    pub(super) fn unmap_failed(&self, u: Unmapped) {
        let mut t = self.lock();
        for (handle, gen) in u.dead {
            t.lives.entry(handle).or_insert(Life {
                refs: 0,
                maps: 0,
                gen,
            });
        }
        for (s, m) in u.maps {
            t.maps.insert(s, m);
            if let Some(l) = t.life_of(m) {
                l.maps += 1;
            }
        }
    }

    #[cfg(test)]
    pub(super) fn row(&self, handle: u64) -> Option<(u32, u32)> {
        self.lock().lives.get(&handle).map(|l| (l.refs, l.maps))
    }
}
