//! Tracking tables: key (device pointer, handle) → what was counted.
//!
//! 64 shards, each a `Mutex<HashMap>`; a key's shard comes from a
//! multiplicative hash, so threads allocating at once almost never meet on
//! a shard. An uncontended std mutex is two atomic operations and no
//! syscall, which meets the hot-path goal without a lock-free map.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::driver::Context;
use crate::region::Kind;

const SHARDS: usize = 64;

/// What one tracked object counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub dev: usize,
    pub bytes: u64,
    pub kind: Kind,
    /// The context the object dies with (`cuCtxDestroy`), 0 when it is
    /// not bound to one (VMM handles, pool and graph memory) or unknown.
    pub ctx: u64,
}

impl Entry {
    /// An object of the calling thread's current context, as the driver
    /// `d` names it.
    pub fn here(d: &impl Context, dev: usize, bytes: u64, kind: Kind) -> Self {
        Self {
            dev,
            bytes,
            kind,
            ctx: d.context().map_or(0, |c| c as u64),
        }
    }

    /// An object that outlives the context it was made in.
    pub fn unbound(dev: usize, bytes: u64, kind: Kind) -> Self {
        Self {
            dev,
            bytes,
            kind,
            ctx: 0,
        }
    }
}

#[derive(Debug)]
pub struct Tracker {
    shards: Vec<Mutex<HashMap<u64, Entry>>>,
}

impl Default for Tracker {
    fn default() -> Self {
        Self::new()
    }
}

impl Tracker {
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        let i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, key: u64, e: Entry) -> Option<Entry> {
        self.shard(key).insert(key, e)
    }

    pub fn remove(&self, key: u64) -> Option<Entry> {
        self.shard(key).remove(&key)
    }

    /// Removes and returns every entry for which `f` holds.
    pub fn drain_where(&self, f: impl Fn(&Entry) -> bool) -> Vec<Entry> {
        let mut out = Vec::new();
        for s in &self.shards {
            let mut m = s.lock().unwrap_or_else(|p| p.into_inner());
            m.retain(|_, e| {
                if f(e) {
                    out.push(*e);
                    false
                } else {
                    true
                }
            });
        }
        out
    }

    /// Whether some entry satisfies `f`.
    pub fn any(&self, f: impl Fn(&Entry) -> bool) -> bool {
        self.shards
            .iter()
            .any(|s| s.lock().unwrap_or_else(|p| p.into_inner()).values().any(&f))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |m| m.len()))
            .sum()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
