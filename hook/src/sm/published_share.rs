//! The process's published share: every `PUBLISH_NS` it writes the GPU time
//! it was charged on each limited device, as percent of wall time, into its
//! slot's `device_util[dev].sm_util`, so HAMi's
//! `hami_container_device_utilization_ratio` works without host PIDs.
//! While the feedback leader measured recently it writes NVML's figure
//! there instead (`correction::nvml_feedback`), and this process skips its own.

#![forbid(unsafe_code)]

use std::sync::atomic::AtomicI64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

use vgpu_common::region::{SharedRegion, MAX_DEVICES};
use vgpu_common::sidecar::SmShared;

use crate::sm::tuning::{MEASURED_FRESH_NS, PUBLISH_NS};

#[derive(Debug, Default)]
struct Last {
    at: u64,
    charged: [i64; MAX_DEVICES],
}

/// GPU ns this process was charged per device, and what it last published.
#[derive(Debug, Default)]
pub(crate) struct PublishedShare {
    charged: [AtomicI64; MAX_DEVICES],
    last: Mutex<Last>,
}

impl PublishedShare {
    /// Counts `ns` (negative: taken back) charged to this process on `dev`.
    pub(crate) fn add(&self, dev: usize, ns: i64) {
        self.charged[dev].fetch_add(ns, Relaxed);
    }

    /// GPU ns charged to this process on `dev`.
    #[cfg(test)]
    pub(crate) fn charged_ns(&self, dev: usize) -> i64 {
        self.charged.get(dev).map_or(0, |c| c.load(Relaxed))
    }

    /// Writes the share of each device in `mask` (or charged since the last
    /// time) into slot `slot`, when due at `now`.
    pub(crate) fn publish(
        &self,
        region: &SharedRegion,
        slot: usize,
        buckets: &SmShared,
        mask: u32,
        now: u64,
    ) {
        let Ok(mut p) = self.last.try_lock() else {
            return;
        };
        if p.at == 0 {
            p.at = now;
            return;
        }
        let dt = now.saturating_sub(p.at);
        if dt < PUBLISH_NS {
            return;
        }
        p.at = now;
        let Some(s) = region.procs.get(slot) else {
            return;
        };
        for (d, b) in buckets.devs.iter().enumerate() {
            let c = self.charged[d].load(Relaxed);
            let m = b.measured_at.load(Relaxed);
            if m != 0 && now.saturating_sub(m) < MEASURED_FRESH_NS {
                // The feedback leader publishes NVML's measurement.
                p.charged[d] = c;
                continue;
            }
            let delta = c.saturating_sub(p.charged[d]).max(0) as u64;
            p.charged[d] = c;
            if mask & (1 << d) != 0 || delta > 0 {
                let pct = (delta.saturating_mul(100) / dt.max(1)).min(100);
                s.device_util[d].sm_util.store(pct, Relaxed);
            }
        }
    }
}
