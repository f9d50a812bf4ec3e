//! This process's line of NVML's process list, as the context's
//! measurement (`context`) and the check of code loaded after it
//! (`modules`) both read it.

use crate::driver::Nvml;

/// One observation around the creation: NVML's process list and the
/// device's used memory.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub procs: Option<Vec<(u32, u64)>>,
    pub used: Option<u64>,
}

impl Snapshot {
    pub(super) fn take(d: &impl Nvml, dev: usize) -> Self {
        Self {
            procs: d.processes(dev),
            used: d.device_used(dev),
        }
    }
}

/// The PID to find ourselves under in NVML's list: the known host PID, or,
/// when the list lacks it, our namespace PID if listed (a driver that
/// lists a container's processes with namespace PIDs).
pub fn own_listed(host: Option<u32>, ns: Option<u32>, after: &Snapshot) -> Option<u32> {
    let listed = |pid: u32| {
        after
            .procs
            .as_ref()
            .is_some_and(|l| l.iter().any(|(p, _)| *p == pid))
    };
    match host {
        Some(h) if !listed(h) => ns.filter(|n| listed(*n)).or(Some(h)),
        other => other,
    }
}

/// The memory NVML's process list charges `pid` (all its lines summed).
pub fn used_by(list: &[(u32, u64)], pid: u32) -> u64 {
    list.iter()
        .filter(|(p, _)| *p == pid)
        .map(|(_, u)| *u)
        .sum()
}
