//! The container's share of a device as NVML's figures give it: the
//! device's own utilization when the container is alone on it, else the
//! device's utilization split in the proportions of NVML's per-process
//! samples (docs/sm-limit.md, "Feedback"). `device` is the device's reading
//! (utilization, host pids of every compute process), `samples` NVML's
//! per-process `(host pid, sm %)`.

#![forbid(unsafe_code)]

/// Whether the container is alone on the device: every compute process
/// NVML lists (`device`: utilization, host pids) is one of its `pids`.
pub(crate) fn alone(device: Option<&(f64, Vec<u32>)>, pids: &[u32]) -> bool {
    device
        .is_some_and(|(_, running)| !running.is_empty() && running.iter().all(|p| pids.contains(p)))
}

/// Whether another container's process is on the device (NVML lists a
/// compute process that is not one of `pids`).
pub(crate) fn shared(device: Option<&(f64, Vec<u32>)>, pids: &[u32]) -> bool {
    device.is_some_and(|(_, running)| running.iter().any(|p| !pids.contains(p)))
}

/// The container's share of the device over the last window, from the
/// device's reading `device` and NVML's per-process `samples`. Alone on the
/// device, that is the device's own utilization, the figure `nvidia-smi`
/// shows and the limit is a share of; NVML's per-process SM samples read
/// several points below it (docs/sm-limit.md). Sharing the device,
/// its utilization is split by the per-process samples' proportions;
/// without a device reading, the container's samples are taken as read.
pub(crate) fn measure(
    device: Option<&(f64, Vec<u32>)>,
    samples: &[(u32, u32)],
    pids: &[u32],
) -> f64 {
    match device {
        Some((util, _)) if alone(device, pids) => *util,
        _ => attributed(device, samples, pids),
    }
}

/// Whether NVML's process list is the caller's PID namespace's view: it
/// shows this process under its own (namespace) PID `me`, and none of the
/// container's host PIDs `pids`, which differ from it.
pub(crate) fn namespace_view(device: Option<&(f64, Vec<u32>)>, pids: &[u32], me: u32) -> bool {
    device.is_some_and(|(_, listed)| {
        !pids.contains(&me) && listed.contains(&me) && !pids.iter().any(|p| listed.contains(p))
    })
}

/// `pids`' part of the device's utilization (see [`measure`]); what the
/// leader publishes as each process's `sm_util`.
pub(crate) fn attributed(
    device: Option<&(f64, Vec<u32>)>,
    samples: &[(u32, u32)],
    pids: &[u32],
) -> f64 {
    device
        .and_then(|(util, _)| attributed_share(samples, pids, *util))
        .unwrap_or_else(|| container_share(samples, pids))
}

/// Per-process samples `(host pid, sm %)` summed over `pids`: each pid's
/// samples are averaged (NVML returns one per internal sample period since
/// the last poll), then the container's pids are added up.
pub(crate) fn container_share(samples: &[(u32, u32)], pids: &[u32]) -> f64 {
    pid_sum(samples, pids).min(100.0)
}

/// The container's part of the device's utilization `device`: its
/// per-process samples over all processes' samples, times `device`. NVML's
/// per-process figures do not add up to the device counter (a lone process
/// reads below the device), but their proportions attribute it.
/// `None` without any sample.
pub(crate) fn attributed_share(samples: &[(u32, u32)], pids: &[u32], device: f64) -> Option<f64> {
    let mut all: Vec<u32> = samples.iter().map(|(p, _)| *p).collect();
    all.sort_unstable();
    all.dedup();
    let total = pid_sum(samples, &all);
    (total > 0.0).then(|| (pid_sum(samples, pids) / total * device.clamp(0.0, 100.0)).min(100.0))
}

/// Each pid's samples averaged, then added up over `pids` (uncapped).
fn pid_sum(samples: &[(u32, u32)], pids: &[u32]) -> f64 {
    pids.iter()
        .map(|p| {
            let (n, sum) = samples
                .iter()
                .filter(|(q, _)| q == p)
                .fold((0u32, 0u64), |(n, s), (_, u)| (n + 1, s + u64::from(*u)));
            if n == 0 {
                0.0
            } else {
                sum as f64 / f64::from(n)
            }
        })
        .sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_sums_pid_averages() {
        let s = [(10, 20), (10, 40), (11, 5), (99, 90)];
        assert_eq!(container_share(&s, &[10, 11]), 35.0);
        assert_eq!(container_share(&s, &[12]), 0.0);
    }

    #[test]
    fn the_device_counter_is_split_by_the_samples_proportions() {
        // Two samples of pid 1 (avg 20), one of pid 2 (40), one of pid 3 (0):
        // pid 1 has a third of the attributed 90.
        let s = [(1, 18), (1, 22), (2, 40), (3, 0)];
        let a = attributed_share(&s, &[1], 90.0).unwrap();
        assert!((a - 30.0).abs() < 1e-9, "{a}");
        let a = attributed_share(&s, &[1, 2], 90.0).unwrap();
        assert!((a - 90.0).abs() < 1e-9, "{a}");
        assert_eq!(attributed_share(&s, &[7], 90.0), Some(0.0));
        assert_eq!(attributed_share(&[], &[1], 90.0), None);
        assert_eq!(attributed_share(&[(1, 0)], &[1], 90.0), None);
    }

    #[test]
    fn alone_shared_and_the_namespace_view() {
        let dev = Some((80.0, vec![10, 11]));
        assert!(alone(dev.as_ref(), &[10, 11, 12]));
        assert!(!shared(dev.as_ref(), &[10, 11]));
        assert!(shared(dev.as_ref(), &[10]) && !alone(dev.as_ref(), &[10]));
        assert_eq!(measure(dev.as_ref(), &[(10, 30)], &[10, 11]), 80.0);
        // Shared: the device's 80 split 1:3.
        let s = [(10, 10), (11, 30)];
        assert_eq!(measure(dev.as_ref(), &s, &[10]), 20.0);
        // NVML lists this process (ns pid 11) and none of the host pids.
        assert!(namespace_view(dev.as_ref(), &[500, 501], 11));
        assert!(!namespace_view(dev.as_ref(), &[10, 501], 11));
        assert!(!namespace_view(None, &[500], 11));
    }
}
