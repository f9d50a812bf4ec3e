//! Device memory no entry point sees: GPU code and its data (with lazy
//! module loading, CUDA 12's default, a library's kernels are loaded at
//! their first launch, after the context was measured: `context.rs`), and
//! peers' buffers a process maps in, which NVML charges to it. The
//! process's own line in NVML's list is the only measure of it, so once a
//! second the hook's background thread (`crate::background`) compares that
//! line with what it counted on the device and counts what NVML shows
//! beyond it as module memory (`module_size`; docs/hook.md, "Module
//! memory"; the sizes seen are in docs/benchmarks.md, "Memory of real
//! clients"). The application need make no call for it to be counted.
//!
//! Raised at once: a race with this process's own allocations can only make
//! NVML read *less* than the count (an allocation is counted before the
//! driver makes it, a free uncounted after), never more. Lowered only when
//! two looks in a row read less, and only by what this module counted;
//! the rest goes with the context (released with it).

use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use vgpu_common::region::MAX_DEVICES;

use super::nvml_line::{own_listed, used_by, Snapshot};
use crate::driver;
use crate::driver::Nvml;
use crate::region::Kind;
use crate::state::{Process, UNKNOWN};
use crate::world::{self, Background, Clock, Identity, Job, NodeFiles};

/// NVML reports whole MiB on some drivers: a difference below this is
/// rounding, not memory.
const SLACK: u64 = 2 << 20;

/// How often the background thread looks (the look costs an NVML call per
/// device, about a millisecond on a real GPU).
pub const PERIOD_NS: u64 = 1_000_000_000;

/// Counts on `dev` what NVML shows this process holding beyond what the
/// hook counted. Returns the bytes added.
pub fn reconcile(p: &Process, d: &impl Nvml, host: &impl Identity, dev: usize) -> u64 {
    // Until the context's own size is counted, NVML's extra is that
    // context, which `context::counted_context` is about to reserve.
    if p.ctx_size
        .get(dev)
        .is_none_or(|s| s.load(SeqCst) == UNKNOWN)
    {
        return 0;
    }
    let Some(total) = p.att.slot().and_then(|s| s.used.get(dev)).map(|m| &m.total) else {
        return 0;
    };
    let before = total.load(SeqCst);
    let snap = Snapshot {
        procs: d.processes(dev),
        used: None,
    };
    let counted = total.load(SeqCst);
    if counted != before {
        return 0; // an allocation or free ran meanwhile; the next look sees it settled
    }
    // Host-backed allocations are counted but NVML does not see them. Both
    // races go the safe way: their bytes are added after the reservation
    // and taken off before its release, so this reads less, never more.
    let counted = counted.saturating_sub(super::oversubscribe::on_host(dev));
    let own = host.own_host_pid().or_else(|| p.att.host_pid());
    let (Some(pid), Some(list)) = (
        own_listed(own, host.own_ns_pid(), &snap),
        snap.procs.as_ref(),
    ) else {
        return 0;
    };
    let nvml = used_by(list, pid);
    let deficit = p.module_deficit.get(dev);
    if nvml.saturating_add(SLACK) < counted {
        // An allocation in flight reads like this (counted before the
        // driver makes it), so one look lowers nothing; two in a row that
        // read less lower what this module counted (code unloaded, or a
        // transient it counted), never what the entry points counted.
        let short = counted - nvml;
        let before = deficit.map_or(0, |d| d.swap(short, SeqCst));
        let held = p.module_bytes.get(dev).map_or(0, |m| m.load(SeqCst));
        let lower = short.min(before).min(held);
        if before > SLACK && lower > 0 {
            if let Some(m) = p.module_bytes.get(dev) {
                m.fetch_sub(lower, SeqCst);
            }
            super::limit::release_counted(&p.att, dev, lower, Kind::Module);
            if let Some(d) = deficit {
                d.store(0, SeqCst);
            }
            vlog!(
                crate::log::INFO,
                "device {dev}: NVML shows {nvml} bytes, {short} fewer than counted, at two looks in a row; \
                 {lower} bytes of module memory released"
            );
        }
        return 0;
    }
    if let Some(d) = deficit {
        d.store(0, SeqCst);
    }
    if nvml <= counted.saturating_add(SLACK) {
        return 0;
    }
    let extra = nvml - counted;
    p.att.add_unchecked(dev, extra, Kind::Module);
    if let Some(m) = p.module_bytes.get(dev) {
        m.fetch_add(extra, SeqCst);
    }
    vlog!(
        crate::log::INFO,
        "device {dev}: {extra} bytes of GPU code and data loaded since the context was measured \
         (NVML shows {nvml}, counted {counted}); counted as module memory"
    );
    extra
}

/// Has the background thread look at this process's devices from now on
/// (`Job::MemoryLook`); called when a context is counted, so a
/// process that never makes one pays nothing.
pub fn watch() {
    let _ = world::live().offload(Job::MemoryLook, look);
}

/// The background look: at most once per [`PERIOD_NS`], the region
/// published again if a tenant wiped or replaced it, and [`reconcile`] on
/// each device where this process holds counted memory.
fn look() {
    let Some(p) = crate::state::process() else {
        return;
    };
    let w = world::live();
    if !due(p, w.coarse()) {
        return;
    }
    // A region the tenant truncated or renamed would miss an idle
    // process's usage from its sums (the daemon's, HAMi's monitor's, its
    // siblings' limit) until it next allocated or launched.
    w.follow_files(w.now());
    p.att.republish_if_wiped();
    let d = driver::live();
    for dev in 0..MAX_DEVICES {
        if counted_on(p, dev) > 0 {
            reconcile(p, d, w, dev);
        }
    }
}

/// Whether a look is due at `now` (ns): at most once per [`PERIOD_NS`] per
/// process, decided by one CAS.
pub fn due(p: &Process, now: u64) -> bool {
    let next = p.module_check.load(Relaxed);
    now >= next
        && p.module_check
            .compare_exchange(next, now + PERIOD_NS, Relaxed, Relaxed)
            .is_ok()
}

fn counted_on(p: &Process, dev: usize) -> u64 {
    p.att
        .slot()
        .and_then(|s| s.used.get(dev))
        .map_or(0, |m| m.total.load(Relaxed))
}

/// Releases what [`reconcile`] counted on `dev`: its contexts are gone.
pub fn released_with_context(p: &Process, dev: usize) {
    if let Some(m) = p.module_bytes.get(dev) {
        let b = m.swap(0, SeqCst);
        if b > 0 {
            super::limit::release_counted(&p.att, dev, b, Kind::Module);
        }
    }
}
