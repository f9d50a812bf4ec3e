//! Which processes' launches the daemon watches, and which of them the
//! driver saw launch since the scan before.
//!
//! Only a container whose statement of activity can decide something for a
//! neighbour is watched (one ranked above another on a GPU they share, or
//! one taking turns there), and only through the node's own driver file: a
//! launch through a library the tenant supplied proves nothing. Its
//! statement then counts while the driver keeps accepting its launches, or
//! while NVML sees it use the GPU; never for CPU time, which any busy loop
//! spends.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::mpsc::{self, Sender};

use aya::programs::uprobe::UProbeLink;
use vgpu_common::event::sizes;

use crate::probes::libcuda::Libcuda;
use crate::probes::{ProbeSet, Watched};

/// One watched process.
#[derive(Debug)]
struct Watch {
    links: Vec<Watched>,
    /// Its count at the scan before.
    last: u64,
}

/// The watched processes.
#[derive(Debug, Default)]
pub struct LaunchWitness {
    watched: HashMap<u32, Watch>,
    /// Processes a watch failed for, not tried again.
    failed: HashSet<u32>,
    /// Said once: no driver file to watch through.
    said_no_driver: bool,
    /// Detaching takes the kernel a grace period per probe: a thread of its
    /// own drops what is no longer watched.
    reaper: Option<Sender<Vec<UProbeLink>>>,
}

impl LaunchWitness {
    /// Watches exactly `want` (host PIDs; at most `sizes::WATCHED`) through
    /// `drivers`, and returns those of them whose count of accepted launches
    /// rose since the scan before.
    pub fn sync(
        &mut self,
        probes: &mut ProbeSet,
        drivers: &[Libcuda],
        want: &HashSet<u32>,
    ) -> HashSet<u32> {
        let gone: Vec<u32> = self
            .watched
            .keys()
            .filter(|p| !want.contains(p))
            .copied()
            .collect();
        for pid in gone {
            if let Some(w) = self.watched.remove(&pid) {
                let links: Vec<UProbeLink> = w
                    .links
                    .into_iter()
                    .flat_map(|l| probes.unwatch(l))
                    .collect();
                self.reap(links);
            }
            probes.forget_launched(pid);
        }
        self.failed.retain(|p| want.contains(p));
        if drivers.is_empty() && !want.is_empty() && !self.said_no_driver {
            self.said_no_driver = true;
            tracing::warn!(
                "no libcuda of the node's driver found (--libcuda, or the host's): launches are \
                 not witnessed, and a container's activity counts only where NVML attributes it \
                 SM time"
            );
        }
        for &pid in want {
            if self.watched.len() >= sizes::WATCHED as usize {
                break;
            }
            if self.watched.contains_key(&pid) || self.failed.contains(&pid) {
                continue;
            }
            let Some(nz) = NonZeroU32::new(pid) else {
                continue;
            };
            let mut links = Vec::new();
            for lib in drivers {
                match probes.watch_launches(lib, nz) {
                    Ok(w) => links.push(w),
                    Err(e) => tracing::warn!(
                        "cannot watch the launches of process {pid} in {}: {e}",
                        lib.path.display()
                    ),
                }
            }
            if links.is_empty() {
                self.failed.insert(pid);
                continue;
            }
            self.watched.insert(pid, Watch { links, last: 0 });
        }
        let counts = match probes.launched() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("reading the launch witnesses: {e}");
                return HashSet::new();
            }
        };
        let mut rose = HashSet::new();
        for (pid, w) in &mut self.watched {
            let n = counts.get(pid).copied().unwrap_or(0);
            if n > w.last {
                rose.insert(*pid);
            }
            w.last = n;
        }
        rose
    }

    fn reap(&mut self, links: Vec<UProbeLink>) {
        if links.is_empty() {
            return;
        }
        let tx = self.reaper.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<Vec<UProbeLink>>();
            let spawned = std::thread::Builder::new()
                .name("vgpu-unwatch".into())
                .spawn(move || {
                    for links in rx {
                        drop(links);
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!("no thread to detach watches on: {e}");
            }
            tx
        });
        if let Err(mpsc::SendError(links)) = tx.send(links) {
            // No reaper: detach here, slowly.
            drop(links);
            self.reaper = None;
        }
    }
}
