//! What a launch costs: its standalone GPU time, learnt per launch key from
//! sampled event timings.
//!
//! A timing between two events around a launch is the kernel's own time,
//! plus anything that delayed it: other processes' work on the GPU, and,
//! when the stream was idle, the host's launch latency. All of these only
//! *inflate* a sample, so the estimate is a minimum. It is not a minimum for
//! ever: each window of samples ends with the estimate at that window's
//! minimum, so it also follows the kernel's time *up*, a real change of the
//! work or a GPU slowing down under its power cap (a minimum kept for ever
//! would remember the boost clock of an idle GPU and undercharge a loaded
//! one, by more than the headroom of a 90 % limit). Keys never timed yet cost the device's running average, and the
//! difference is settled once `AGREE` samples agree on a cost.
//!
//! No single sample raises an estimate: a launch that waited behind other
//! contexts' work (a neighbour's queue when the stream was idle, a long
//! kernel, a suspended neighbour resuming) reads its wait too. The first
//! estimate is the minimum of `AGREE` samples, taken on consecutive
//! launches, so all but the first start behind this stream's own work and
//! not behind the neighbour's; later raises need a whole window.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

pub use crate::sm::tuning::{AGREE, DEFAULT_COST_NS, EARLY_SAMPLES, SAMPLE_EVERY, SAMPLE_GAP_NS};
use crate::sm::tuning::{COST_WINDOW as WINDOW, FALLBACK_WEIGHT, MAX_KEYS};
use vgpu_common::region::MAX_DEVICES;

/// What identifies "the same work": the function and its geometry, or the
/// executable graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Kernel {
        func: usize,
        grid: [u32; 3],
        block: [u32; 3],
    },
    Graph {
        exec: usize,
    },
}

impl Key {
    /// The driver handle (function or graph exec).
    pub fn handle(&self) -> usize {
        match *self {
            Key::Kernel { func, .. } => func,
            Key::Graph { exec } => exec,
        }
    }
}

/// Three words per kernel key: the derived `Hash` would feed each `[u32; 3]`
/// to the hasher byte by byte.
impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        // Only a hash: components wider than their field may collide, `Eq`
        // tells them apart.
        let pack = |d: &[u32; 3]| u64::from(d[0]) | u64::from(d[1]) << 32 | u64::from(d[2]) << 48;
        match self {
            Key::Kernel { func, grid, block } => {
                h.write_usize(*func);
                h.write_u64(pack(grid));
                h.write_u64(pack(block));
            }
            Key::Graph { exec } => h.write_usize(!*exec),
        }
    }
}

/// A cheap multiply-rotate hasher: keys are handles and small integers
/// chosen by the driver, not by an adversary, and this runs per launch.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

/// The estimate of one key.
#[derive(Debug, Clone, Default)]
pub struct Estimate {
    /// Standalone GPU ns; `None` until `AGREE` samples.
    pub est: Option<u64>,
    pub samples: u32,
    pub launches: u64,
    /// The launch count at which the next occasional sample is due...
    next_sample: u64,
    /// ...and the earliest instant (CLOCK_MONOTONIC ns).
    next_sample_ns: u64,
    window_min: u64,
    window_n: u32,
    /// The minimum of the samples before the estimate exists.
    early_min: u64,
    /// Launches charged a guess before the first sample, and their sum.
    guessed: u64,
    guessed_ns: u64,
}

impl Estimate {
    /// Adds a sample; returns the GPU ns still owed (or to refund) for
    /// launches that were charged a guess, once the estimate exists.
    pub fn add(&mut self, ns: u64) -> i64 {
        let ns = ns.max(1);
        self.samples = self.samples.saturating_add(1);
        self.window_min = if self.window_n == 0 {
            ns
        } else {
            self.window_min.min(ns)
        };
        self.window_n += 1;
        let Some(est) = self.est else {
            self.early_min = if self.samples == 1 {
                ns
            } else {
                self.early_min.min(ns)
            };
            if self.samples < AGREE {
                return 0;
            }
            self.est = Some(self.early_min);
            let owed = (self.early_min as i128 * self.guessed as i128 - self.guessed_ns as i128)
                .clamp(i64::MIN as i128, i64::MAX as i128) as i64;
            self.guessed = 0;
            self.guessed_ns = 0;
            return owed;
        };
        let mut est = est.min(ns);
        if self.window_n >= WINDOW {
            est = self.window_min;
            self.window_n = 0;
        }
        self.est = Some(est);
        0
    }

    /// Whether the launch about to happen (already counted) should be
    /// timed. `idle_stream`: the launch follows a throttling sleep, so its
    /// timing would include the launch latency (only early samples take
    /// that; an occasional one waits for a later launch that did not
    /// sleep).
    pub fn want_sample(&self, idle_stream: bool, now: u64) -> bool {
        self.samples < EARLY_SAMPLES
            || (!idle_stream && self.launches >= self.next_sample && now >= self.next_sample_ns)
    }

    /// Launches that may go by, after this one, before a sample is due:
    /// what a thread may charge from its cache without asking the table.
    pub fn until_due(&self) -> u64 {
        if self.est.is_none() || self.samples < EARLY_SAMPLES {
            return 0;
        }
        if self.next_sample > self.launches {
            self.next_sample - self.launches - 1
        } else {
            // Due by count but not taken (too soon after the last one, or
            // this launch followed a sleep): look again after as many
            // launches as between two samples.
            SAMPLE_EVERY - 1
        }
    }
}

/// Per-device fallback: a running average of the keys' estimates.
#[derive(Debug, Clone, Copy, Default)]
struct Fallback {
    avg: u64,
    n: u32,
}

/// The process's cost table.
#[derive(Debug, Default)]
pub struct Costs {
    keys: HashMap<Key, Estimate, BuildHasherDefault<KeyHasher>>,
    fallback: [Fallback; MAX_DEVICES],
}

/// The charge decided for one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub cost_ns: u64,
    pub sample: bool,
    /// See [`Estimate::until_due`] (0 while the cost is still a guess).
    pub until_due: u64,
}

impl Costs {
    /// The cost to charge for a launch of `key` on `dev` at `now`, counting
    /// the launch and `skipped` earlier ones a thread charged from its cache.
    pub fn charge(
        &mut self,
        dev: usize,
        key: Key,
        idle_stream: bool,
        skipped: u64,
        now: u64,
    ) -> Charge {
        if self.keys.len() >= MAX_KEYS && !self.keys.contains_key(&key) {
            self.keys.clear();
        }
        let fb = self.fallback_ns(dev);
        let e = self.keys.entry(key).or_default();
        e.launches = e.launches.saturating_add(skipped + 1);
        let sample = e.want_sample(idle_stream, now);
        if sample {
            e.next_sample = e.launches.saturating_add(SAMPLE_EVERY);
            e.next_sample_ns = now.saturating_add(SAMPLE_GAP_NS);
        }
        let until_due = e.until_due();
        let cost_ns = match e.est {
            Some(v) => v,
            None => {
                e.guessed += 1;
                e.guessed_ns = e.guessed_ns.saturating_add(fb);
                fb
            }
        };
        Charge {
            cost_ns,
            sample,
            until_due,
        }
    }

    /// A launch charged with [`Self::charge`] did not happen.
    pub fn uncharge(&mut self, key: Key, cost_ns: u64) {
        if let Some(e) = self.keys.get_mut(&key) {
            if e.est.is_none() && e.guessed > 0 {
                e.guessed -= 1;
                e.guessed_ns = e.guessed_ns.saturating_sub(cost_ns);
            }
        }
    }

    /// Records a timing of `key` on `dev`; returns GPU ns owed (see
    /// [`Estimate::add`]).
    pub fn sample(&mut self, dev: usize, key: Key, ns: u64) -> i64 {
        let Some(e) = self.keys.get_mut(&key) else {
            return 0;
        };
        let owed = e.add(ns);
        // Only an agreed estimate feeds the average: a lone sample may be
        // a wait behind someone else's work.
        let Some(est) = e.est else {
            return owed;
        };
        if let Some(f) = self.fallback.get_mut(dev) {
            f.avg = if f.n == 0 {
                est
            } else {
                (f.avg.saturating_mul(FALLBACK_WEIGHT - 1) + est) / FALLBACK_WEIGHT
            };
            f.n = f.n.saturating_add(1);
        }
        owed
    }

    pub fn fallback_ns(&self, dev: usize) -> u64 {
        match self.fallback.get(dev) {
            Some(f) if f.n > 0 => f.avg.max(1),
            _ => DEFAULT_COST_NS,
        }
    }

    #[cfg(test)]
    pub fn estimate(&self, key: &Key) -> Option<u64> {
        self.keys.get(key).and_then(|e| e.est)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: Key = Key::Kernel {
        func: 1,
        grid: [1, 1, 1],
        block: [32, 1, 1],
    };

    #[test]
    fn minimum_filters_contention() {
        let mut c = Costs::default();
        for ns in [30_000, 10_500, 55_000, 10_000, 80_000, 12_000] {
            c.charge(0, K, false, 0, 0);
            c.sample(0, K, ns);
        }
        assert_eq!(c.estimate(&K), Some(10_000));
    }

    #[test]
    fn a_real_change_is_followed() {
        let mut c = Costs::default();
        c.charge(0, K, false, 0, 0);
        c.sample(0, K, 10_000);
        for i in 0..2 * WINDOW {
            c.sample(0, K, 40_000 + u64::from(i));
        }
        let e = c.estimate(&K).unwrap();
        assert!((40_000..40_100).contains(&e), "{e}");
    }

    #[test]
    fn a_slow_gpu_is_followed_but_one_window_of_noise_keeps_the_minimum() {
        let mut c = Costs::default();
        c.charge(0, K, false, 0, 0);
        // Power-capped: the kernel now takes 10 % longer, with one fast
        // outlier per window; the estimate is the window's minimum.
        for i in 0..2 * WINDOW {
            c.sample(0, K, if i % WINDOW == 5 { 10_500 } else { 11_000 });
        }
        assert_eq!(c.estimate(&K), Some(10_500));
        for _ in 0..WINDOW {
            c.sample(0, K, 11_000);
        }
        assert_eq!(c.estimate(&K), Some(11_000));
    }

    #[test]
    fn guesses_are_settled_once_samples_agree() {
        let mut c = Costs::default();
        for _ in 0..5 {
            assert_eq!(c.charge(0, K, false, 0, 0).cost_ns, DEFAULT_COST_NS);
        }
        // Five launches charged 20 µs each, really 1 ms each; the first
        // timing also waited 80 ms behind another context's queue. Until
        // `AGREE` samples are in, launches are still charged the guess and
        // nothing is settled.
        assert_eq!(c.sample(0, K, 81_000_000), 0);
        assert_eq!(c.estimate(&K), None);
        assert_eq!(c.charge(0, K, false, 0, 0).cost_ns, DEFAULT_COST_NS);
        assert_eq!(c.sample(0, K, 1_000_000), 0);
        // The third sample agrees on 1 ms: six guessed launches settled at
        // their minimum, not at the 81 ms outlier.
        assert_eq!(c.sample(0, K, 1_000_100), 6 * (1_000_000 - 20_000));
        assert_eq!(c.estimate(&K), Some(1_000_000));
        assert_eq!(c.charge(0, K, false, 0, 0).cost_ns, 1_000_000);
        assert_eq!(c.sample(0, K, 1_000_000), 0);
        // Unseen keys now default to the device's average of agreed
        // estimates (the outlier is not in it).
        let k2 = Key::Graph { exec: 9 };
        assert_eq!(c.charge(0, k2, false, 0, 0).cost_ns, 1_000_000);
        assert_eq!(c.charge(1, k2, false, 0, 0).cost_ns, DEFAULT_COST_NS);
        let k3 = Key::Graph { exec: 10 };
        assert_eq!(c.charge(1, k3, false, 0, 0).cost_ns, DEFAULT_COST_NS);
    }

    #[test]
    fn a_lone_outlier_never_raises_an_estimate() {
        let mut c = Costs::default();
        c.charge(0, K, false, 0, 0);
        for _ in 0..AGREE {
            c.sample(0, K, 10_000);
        }
        // A neighbour's long kernel, or its queue after it resumed, delays
        // one timing in each window: the estimate stays.
        for i in 0..3 * WINDOW {
            c.sample(0, K, if i % WINDOW == 7 { 50_000_000 } else { 10_000 });
        }
        assert_eq!(c.estimate(&K), Some(10_000));
    }

    #[test]
    fn sampling_is_early_then_occasional_and_not_after_a_sleep() {
        let mut c = Costs::default();
        let mut sampled = 0;
        // One launch per ms: the count, not the time, spaces the samples.
        let mut now = 0;
        let mut launch = |c: &mut Costs, idle| {
            now += 1_000_000;
            c.charge(0, K, idle, 0, now).sample
        };
        for _ in 0..(EARLY_SAMPLES as u64 + 10 * SAMPLE_EVERY) {
            if launch(&mut c, false) {
                sampled += 1;
                c.sample(0, K, 1000);
            }
        }
        assert_eq!(sampled, EARLY_SAMPLES as u64 + 10);
        let mut idle = 0;
        for _ in 0..(10 * SAMPLE_EVERY) {
            if launch(&mut c, true) {
                idle += 1;
            }
        }
        assert_eq!(idle, 0);
        // The first launch that did not sleep takes the overdue sample.
        assert!(launch(&mut c, false));
    }

    #[test]
    fn a_fast_loop_is_sampled_at_most_once_per_gap() {
        let mut c = Costs::default();
        let mut now = 0;
        let mut at = Vec::new();
        // 100,000 launches/s for 100 ms.
        for _ in 0..10_000 {
            now += 10_000;
            if c.charge(0, K, false, 0, now).sample {
                c.sample(0, K, 1000);
                at.push(now);
            }
        }
        let occasional = &at[EARLY_SAMPLES as usize..];
        assert!(
            occasional.windows(2).all(|w| w[1] - w[0] >= SAMPLE_GAP_NS),
            "{at:?}"
        );
        // 100 ms / 4 ms, give or take the first.
        assert!(
            (24..=26).contains(&occasional.len()),
            "{}",
            occasional.len()
        );
    }

    #[test]
    fn launches_charged_from_a_cache_count_toward_the_next_sample() {
        let mut c = Costs::default();
        for _ in 0..EARLY_SAMPLES {
            assert!(c.charge(0, K, false, 0, 0).sample);
            c.sample(0, K, 1000);
        }
        // Nothing is cached while the cost is a guess or still early.
        let k2 = Key::Graph { exec: 3 };
        assert_eq!(c.charge(0, k2, false, 0, 0).until_due, 0);
        let ch = c.charge(0, K, false, 0, 0);
        assert!(!ch.sample);
        assert_eq!(ch.until_due, SAMPLE_EVERY - 2);
        // A thread charged those from its cache; the next one is due by
        // count, but not before the gap has passed.
        let ch = c.charge(0, K, false, ch.until_due, SAMPLE_GAP_NS - 1);
        assert!(!ch.sample);
        assert_eq!(ch.until_due, SAMPLE_EVERY - 1);
        let ch = c.charge(0, K, false, ch.until_due, SAMPLE_GAP_NS);
        assert!(ch.sample);
        assert_eq!(ch.until_due, SAMPLE_EVERY - 1);
    }

    #[test]
    fn kernel_keys_hash_by_all_their_words() {
        use std::hash::BuildHasher;
        let h = BuildHasherDefault::<KeyHasher>::default();
        let k = |g: u32, b: u32| Key::Kernel {
            func: 7,
            grid: [g, 1, 1],
            block: [b, 1, 1],
        };
        assert_ne!(h.hash_one(k(1, 32)), h.hash_one(k(2, 32)));
        assert_ne!(h.hash_one(k(1, 32)), h.hash_one(k(1, 64)));
        assert_ne!(h.hash_one(Key::Graph { exec: 7 }), h.hash_one(k(1, 32)));
    }
}
