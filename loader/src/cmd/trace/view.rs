//! The default view: a table per process (and its container) of launch
//! rates, allocations, bytes held and top kernels, read from kernel maps.

use std::{
    collections::HashMap,
    io::Write as _,
    time::{Duration, Instant},
};

use vgpu_common::event::{Caller, Func, LaunchKey, ProcCounters};

use super::{devices::DeviceNames, filter::Filter};
use crate::{
    cgroup::{CgroupIndex, ContainerInfo},
    printable::escape_controls,
    probes::{ProbeError, ProbeSet},
};

/// One process in a snapshot.
pub struct Row {
    /// Who.
    pub caller: Caller,
    /// Totals since the probes were attached.
    pub counts: ProcCounters,
    /// Container identity from the cgroup path.
    pub container: ContainerInfo,
    /// Kernels by launch count, most first.
    pub kernels: Vec<(LaunchKey, u64)>,
}

/// The maps read at one instant, filtered.
pub struct Snapshot {
    /// Matching processes, by host pid.
    pub rows: Vec<Row>,
    /// Records the probes could not make.
    pub lost: u64,
}

impl Snapshot {
    /// Reads the kernel maps.
    pub fn read(
        probes: &ProbeSet,
        filter: &Filter,
        cgroups: &mut CgroupIndex,
    ) -> Result<Snapshot, ProbeError> {
        let mut kernels: HashMap<u32, Vec<(LaunchKey, u64)>> = HashMap::new();
        for (k, n) in probes.launches()? {
            kernels.entry(k.tgid).or_default().push((k, n));
        }
        let mut rows = Vec::new();
        for (caller, counts) in probes.procs()? {
            if !filter.matches(&caller, cgroups) {
                continue;
            }
            let container = cgroups
                .path(caller.cgroup_id)
                .map(ContainerInfo::from_path)
                .unwrap_or_default();
            let mut ks = kernels.remove(&caller.host_tgid).unwrap_or_default();
            ks.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.func.cmp(&b.0.func)));
            rows.push(Row {
                caller,
                counts,
                container,
                kernels: ks,
            });
        }
        rows.sort_by_key(|r| r.caller.host_tgid);
        let lost = probes.counters()?.iter().map(|(_, n)| n).sum();
        Ok(Snapshot { rows, lost })
    }
}

/// Renders snapshots, computing rates from the previous one.
pub struct Table {
    top: usize,
    tty: bool,
    prev: HashMap<u32, (ProcCounters, Duration)>,
    exited: HashMap<u32, Instant>,
    devices: DeviceNames,
}

impl Table {
    /// `top` kernels per process; `tty` clears the screen between frames.
    pub fn new(top: usize, tty: bool) -> Table {
        Table {
            top,
            tty,
            prev: HashMap::new(),
            exited: HashMap::new(),
            devices: DeviceNames::new(),
        }
    }

    /// Processes of `snap` that have exited more than `keep` ago (first
    /// noticed by this call or an earlier one); they are then forgotten here.
    pub fn expired(&mut self, snap: &Snapshot, keep: Duration) -> Vec<u32> {
        let now = Instant::now();
        let mut out = Vec::new();
        for r in &snap.rows {
            let tgid = r.caller.host_tgid;
            if std::path::Path::new(&format!("/proc/{tgid}")).exists() {
                self.exited.remove(&tgid);
                continue;
            }
            let since = *self.exited.entry(tgid).or_insert(now);
            if now.duration_since(since) >= keep {
                out.push(tgid);
                self.exited.remove(&tgid);
                self.prev.remove(&tgid);
                self.devices.forget(tgid);
            }
        }
        out
    }

    /// Prints one frame; false when stdout is gone.
    pub fn render(&mut self, snap: &Snapshot, at: Duration, last: bool) -> bool {
        let mut s = String::new();
        if self.tty {
            s.push_str("\x1b[H\x1b[2J");
        }
        s.push_str(&format!(
            "vgpu trace {:.1}s{} processes {} lost {}\n",
            at.as_secs_f64(),
            if last { " final" } else { "" },
            snap.rows.len(),
            snap.lost
        ));
        s.push_str(&format!(
            "{:>8} {:>6} {:>10} {:<22} {:<15} {:>10} {:>9} {:>10} {:>8} {:>7} {:>7} {:>14} {}\n",
            "PID",
            "NSPID",
            "CGROUP",
            "CONTAINER",
            "COMM",
            "LAUNCH/s",
            "GRAPH/s",
            "LAUNCHES",
            "GRAPHS",
            "ALLOCS",
            "FREES",
            "HELD_BYTES",
            "DEVICES"
        ));
        for r in &snap.rows {
            let c = &r.counts;
            let (launch_rate, graph_rate) = match self.prev.get(&r.caller.host_tgid) {
                Some((p, t)) if at > *t => {
                    let dt = (at - *t).as_secs_f64();
                    (
                        c.launches.saturating_sub(p.launches) as f64 / dt,
                        c.graph_launches.saturating_sub(p.graph_launches) as f64 / dt,
                    )
                }
                _ => {
                    let dt = at.as_secs_f64().max(1e-3);
                    (c.launches as f64 / dt, c.graph_launches as f64 / dt)
                }
            };
            self.prev.insert(r.caller.host_tgid, (*c, at));
            let held = c.bytes_allocated.saturating_sub(c.bytes_freed);
            let devices = self.devices_column(r.caller.host_tgid, c.devices);
            s.push_str(&format!(
                "{:>8} {:>6} {:>10} {:<22} {:<15} {:>10.1} {:>9.1} {:>10} {:>8} {:>7} {:>7} {:>14} {}\n",
                r.caller.host_tgid,
                r.caller.ns_tgid,
                r.caller.cgroup_id,
                r.container.short(),
                escape_controls(&r.caller.comm_str()),
                launch_rate,
                graph_rate,
                c.launches,
                c.graph_launches,
                c.allocs,
                c.frees,
                held,
                devices
            ));
            for (k, n) in r.kernels.iter().take(self.top) {
                let name = Func::from_id(k.func).map_or("?", Func::symbol);
                s.push_str(&format!(
                    "{:>8} kernel {:#x} {} grid {}x{}x{} block {}x{}x{} launches {}\n",
                    "",
                    k.handle,
                    name,
                    k.grid[0],
                    k.grid[1],
                    k.grid[2],
                    k.block[0],
                    k.block[1],
                    k.block[2],
                    n
                ));
            }
        }
        let mut out = std::io::stdout().lock();
        out.write_all(s.as_bytes()).is_ok() && out.flush().is_ok()
    }
}

impl Table {
    /// The DEVICES column: the container index of each device the process
    /// made a context on (bit `i` of `ordinals`: CUDA ordinal `i`), in
    /// order; `c<ordinal>` where the index is unknown; `-` for none.
    fn devices_column(&mut self, tgid: u32, ordinals: u64) -> String {
        let mut names: Vec<(bool, usize, String)> = (0..64)
            .filter(|i| ordinals & (1u64 << i) != 0)
            .map(|i| {
                let l = self.devices.label(tgid, i);
                let key = l.device.as_ref().map_or(i as usize, |d| d.index);
                (l.device.is_none(), key, l.short())
            })
            .collect();
        if names.is_empty() {
            return "-".to_owned();
        }
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|(_, _, n)| n)
            .collect::<Vec<_>>()
            .join(",")
    }
}
