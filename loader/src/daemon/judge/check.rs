//! The accounting cross-check: what the hook tracked for a process against
//! what the kernel saw it allocate (probes) and what the driver says it uses
//! (NVML). Pure decisions, so they can be tested without a GPU.

use std::collections::HashMap;
use std::hash::Hash;

/// 1 MiB.
pub const MIB: u64 = 1 << 20;

/// When a difference counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// A difference at or below this many bytes is noise.
    pub min_bytes: u64,
    /// … or at or below this fraction of the larger of the two values.
    pub ratio: f64,
    /// Consecutive scans over the threshold before it is a finding.
    pub scans: u32,
}

impl Default for Thresholds {
    /// max(16 MiB, 2 %) for 2 consecutive scans.
    fn default() -> Self {
        Self {
            min_bytes: 16 * MIB,
            ratio: 0.02,
            scans: 2,
        }
    }
}

impl Thresholds {
    /// The allowed difference between `observed` and `tracked`.
    pub fn allowance(&self, observed: u64, tracked: u64) -> u64 {
        let rel = (observed.max(tracked) as f64 * self.ratio) as u64;
        self.min_bytes.max(rel)
    }
}

/// One process's numbers in one scan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Bytes the probes saw allocated minus freed; `None` when not probed.
    pub probe_bytes: Option<u64>,
    /// NVML's used memory of the process (context included); `None`
    /// without NVML or when the process is not in its list.
    pub nvml_bytes: Option<u64>,
    /// The slot's `data_size`, summed over devices (0 without a slot).
    pub tracked_data: u64,
    /// The slot's `total` (context + modules + data), summed over devices.
    pub tracked_total: u64,
}

/// Which view saw more than the hook tracked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The uprobes on libcuda (compared with `data_size`).
    Probes,
    /// NVML per-process used memory (compared with `total`).
    Nvml,
}

/// Bytes that escaped the hook in one scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Excess {
    pub bytes: u64,
    pub source: Source,
}

/// The larger excess of the two views, if either is over its allowance.
/// Probes are compared with the slot's data (they see no context), NVML
/// with its total (NVML counts the context). The hook tracking more than
/// the kernel saw is not an escape (arrays and graph nodes are not probed).
pub fn excess(obs: &Observation, th: &Thresholds) -> Option<Excess> {
    let probe = obs.probe_bytes.and_then(|seen| {
        let over = seen.saturating_sub(obs.tracked_data);
        (over > th.allowance(seen, obs.tracked_data)).then_some(Excess {
            bytes: over,
            source: Source::Probes,
        })
    });
    let nvml = obs.nvml_bytes.and_then(|used| {
        let over = used.saturating_sub(obs.tracked_total);
        (over > th.allowance(used, obs.tracked_total)).then_some(Excess {
            bytes: over,
            source: Source::Nvml,
        })
    });
    match (probe, nvml) {
        (Some(a), Some(b)) => Some(if b.bytes > a.bytes { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Consecutive-scan streaks per key: a difference becomes a finding only
/// when it persists (an allocation in flight is reserved in the slot before
/// the driver call but seen by NVML a moment later, or the other way round).
#[derive(Debug, Default)]
pub struct Streaks<K> {
    runs: HashMap<K, u32>,
}

impl<K: Eq + Hash + Clone> Streaks<K> {
    /// Records this scan's result for `key`; returns the excess once it has
    /// held for `th.scans` consecutive scans, and keeps returning it while it
    /// holds.
    pub fn update(&mut self, key: &K, now: Option<Excess>, th: &Thresholds) -> Option<Excess> {
        match now {
            Some(e) => {
                let n = self.runs.entry(key.clone()).or_insert(0);
                *n = n.saturating_add(1);
                (*n >= th.scans.max(1)).then_some(e)
            }
            None => {
                self.runs.remove(key);
                None
            }
        }
    }

    /// Forgets keys not in `live`.
    pub fn retain(&mut self, live: impl Fn(&K) -> bool) {
        self.runs.retain(|k, _| live(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(probe: Option<u64>, nvml: Option<u64>, data: u64, total: u64) -> Observation {
        Observation {
            probe_bytes: probe,
            nvml_bytes: nvml,
            tracked_data: data,
            tracked_total: total,
        }
    }

    #[test]
    fn allowance_is_the_larger_of_floor_and_ratio() {
        let th = Thresholds::default();
        assert_eq!(th.allowance(0, 0), 16 * MIB);
        assert_eq!(th.allowance(100 * MIB, 0), 16 * MIB);
        // 2 % of 10 GiB is 204.8 MiB.
        assert_eq!(
            th.allowance(10 << 30, 1 << 30),
            ((10u64 << 30) as f64 * 0.02) as u64
        );
    }

    #[test]
    fn small_or_negative_differences_are_not_findings() {
        let th = Thresholds::default();
        // Hook matches the kernel and NVML (NVML includes a 500 MiB context).
        assert_eq!(
            excess(
                &obs(Some(256 * MIB), Some(756 * MIB), 256 * MIB, 756 * MIB),
                &th
            ),
            None
        );
        // 16 MiB exactly is within the allowance.
        assert_eq!(excess(&obs(Some(16 * MIB), None, 0, 0), &th), None);
        // The hook tracks more than the kernel saw (arrays): not an escape.
        assert_eq!(
            excess(&obs(Some(0), Some(0), 64 * MIB, 564 * MIB), &th),
            None
        );
        // 1.5 % over on 10 GiB: within 2 %.
        let ten = 10u64 << 30;
        assert_eq!(
            excess(&obs(Some(ten + ten * 15 / 1000), None, ten, ten), &th),
            None
        );
    }

    #[test]
    fn escapes_are_measured_from_the_right_counter() {
        let th = Thresholds::default();
        // Probes compare with data: 64 MiB allocated behind the hook's back.
        let e = excess(&obs(Some(320 * MIB), None, 256 * MIB, 756 * MIB), &th).unwrap();
        assert_eq!((e.bytes, e.source), (64 * MIB, Source::Probes));
        // NVML compares with total: a second context (500 MiB) plus 64 MiB.
        let e = excess(
            &obs(Some(256 * MIB), Some(1320 * MIB), 256 * MIB, 756 * MIB),
            &th,
        )
        .unwrap();
        assert_eq!((e.bytes, e.source), (564 * MIB, Source::Nvml));
        // No slot at all: everything observed is untracked.
        let e = excess(&obs(Some(100 * MIB), Some(600 * MIB), 0, 0), &th).unwrap();
        assert_eq!((e.bytes, e.source), (600 * MIB, Source::Nvml));
    }

    #[test]
    fn a_finding_needs_consecutive_scans() {
        let th = Thresholds::default();
        let mut s = Streaks::default();
        let e = Some(Excess {
            bytes: 64 * MIB,
            source: Source::Probes,
        });
        assert_eq!(s.update(&1u32, e, &th), None);
        assert_eq!(s.update(&1u32, e, &th), e);
        assert_eq!(s.update(&1u32, e, &th), e);
        // One clean scan resets the streak.
        assert_eq!(s.update(&1u32, None, &th), None);
        assert_eq!(s.update(&1u32, e, &th), None);
        // Keys are independent.
        assert_eq!(s.update(&2u32, e, &th), None);
        s.retain(|k| *k == 2);
        assert_eq!(s.update(&1u32, e, &th), None);
        assert_eq!(s.update(&2u32, e, &th), e);
    }
}
