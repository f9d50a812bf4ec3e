//! How integrity findings read: the common fields and the sentences.

use super::ProcInput;
use crate::daemon::collect::container_identity::ContainerIdentity;
use crate::daemon::state::findings::{Finding, Kind, LimitMismatch, LimitName};
use crate::regions::summary::bytes;
use vgpu_common::region::rules::{memory_limit, SM_UNLIMITED};

/// A finding with the process and container fields filled.
pub(super) fn base(
    kind: Kind,
    p: Option<&ProcInput<'_>>,
    id: &ContainerIdentity,
    message: String,
) -> Finding {
    Finding {
        pid: p.map_or(0, |p| p.pid),
        ns_pid: p.map_or(0, |p| p.ns_pid),
        comm: p.map(|p| p.comm.clone()).unwrap_or_default(),
        probe_bytes: p.and_then(|p| p.probe_bytes),
        tracked_total_bytes: p.map_or(0, |p| p.tracked_bytes),
        ..Finding::new(kind, id, 0, message)
    }
}

pub(super) fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

pub(super) fn show_mem(v: u64) -> String {
    memory_limit(v).map_or("none".to_owned(), bytes)
}

pub(super) fn show_sm(v: u64) -> String {
    if v == SM_UNLIMITED {
        "none".to_owned()
    } else {
        format!("{v}%")
    }
}

/// `device 0 memory limit 64 GiB (expected 1 GiB)`, consecutive devices
/// with the same values as one range, the first few ranges.
pub(super) fn describe(m: &[LimitMismatch]) -> String {
    const SHOWN: usize = 4;
    let mut runs: Vec<(LimitMismatch, usize)> = Vec::new();
    for x in m {
        match runs.last_mut() {
            Some((first, last))
                if first.limit == x.limit
                    && first.expected == x.expected
                    && first.found == x.found
                    && *last + 1 == x.device =>
            {
                *last = x.device;
            }
            _ => runs.push((*x, x.device)),
        }
    }
    let mut parts: Vec<String> = runs
        .iter()
        .take(SHOWN)
        .map(|(x, last)| {
            let devs = if *last == x.device {
                format!("device {}", x.device)
            } else {
                format!("devices {}-{last}", x.device)
            };
            let (what, found, expected) = match x.limit {
                LimitName::MemoryBytes => ("memory", show_mem(x.found), show_mem(x.expected)),
                LimitName::SmPercent => ("SM", show_sm(x.found), show_sm(x.expected)),
            };
            format!("{devs} {what} limit {found} (expected {expected})")
        })
        .collect();
    if runs.len() > SHOWN {
        parts.push(format!("{} more", runs.len() - SHOWN));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatches_read_as_ranges() {
        let m = |device, limit, expected, found| LimitMismatch {
            device,
            limit,
            expected,
            found,
        };
        let mut all: Vec<LimitMismatch> = (0..16)
            .map(|d| m(d, LimitName::MemoryBytes, 1 << 30, 0))
            .collect();
        all.push(m(3, LimitName::SmPercent, 30, 100));
        assert_eq!(
            describe(&all),
            "devices 0-15 memory limit none (expected 1 GiB), device 3 SM limit none (expected 30%)"
        );
        assert_eq!(
            describe(&[m(0, LimitName::MemoryBytes, 1 << 30, 64 << 30)]),
            "device 0 memory limit 64 GiB (expected 1 GiB)"
        );
    }
}
