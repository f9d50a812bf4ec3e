//! Launch witnesses for single processes: the return of every launch entry
//! point of one libcuda, probed for one process only, counting the launches
//! the driver accepted. The daemon watches the containers whose statement of
//! activity can hold a neighbour back, so that what holds others is work the
//! driver took, not what a tenant wrote or how much CPU it burned.
//!
//! A probe scoped to one process traps only in that process (the kernel
//! puts its breakpoint in that process's memory alone): nobody else pays.

use std::collections::HashMap;
use std::num::NonZeroU32;

use aya::maps::{MapData, PerCpuHashMap};
use aya::programs::uprobe::{
    UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeLinkId, UProbeScope,
};
use aya::programs::UProbe;
use vgpu_common::event::{names, Func, FuncClass};

use super::libcuda::{self, Libcuda};
use super::{ProbeError, ProbeSet};

/// One watched process's attachments.
#[derive(Debug)]
pub struct Watched {
    links: Vec<UProbeLinkId>,
}

impl ProbeSet {
    /// Probes the returns of `lib`'s launch entry points for process `pid`
    /// (host PID) alone. Entry points at one address are probed once.
    pub fn watch_launches(
        &mut self,
        lib: &Libcuda,
        pid: NonZeroU32,
    ) -> Result<Watched, ProbeError> {
        let funcs: Vec<Func> = Func::ALL
            .into_iter()
            .filter(|f| matches!(f.class(), FuncClass::Launch | FuncClass::GraphLaunch))
            .collect();
        let names_: Vec<&str> = funcs.iter().map(|f| f.symbol()).collect();
        let offsets = libcuda::symbol_offsets(&lib.io_path(), &names_)?;
        let prog = self.launch_done()?;
        let mut links = Vec::new();
        let mut seen = Vec::new();
        for f in funcs {
            let Some(&off) = offsets.get(f.symbol()) else {
                continue;
            };
            if seen.contains(&off) {
                continue;
            }
            seen.push(off);
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(off),
                cookie: None,
            };
            match prog.attach(point, lib.io_path(), UProbeScope::OneProcess(pid)) {
                Ok(id) => links.push(id),
                Err(e) => {
                    // Leave nothing half-attached.
                    for id in links {
                        let _ = prog.detach(id);
                    }
                    return Err(ProbeError::classify("watching launches", e));
                }
            }
        }
        Ok(Watched { links })
    }

    /// Takes `w`'s attachments out; dropping what is returned detaches
    /// them, which the kernel does slowly (a grace period each): drop them
    /// off the caller's hot path.
    pub fn unwatch(&mut self, w: Watched) -> Vec<UProbeLink> {
        let Ok(prog) = self.launch_done() else {
            return Vec::new();
        };
        w.links
            .into_iter()
            .filter_map(|id| prog.take_link(id).ok())
            .collect()
    }

    /// Successful launches counted per watched process (host PID), summed
    /// over CPUs.
    pub fn launched(&self) -> Result<HashMap<u32, u64>, ProbeError> {
        Ok(self.per_cpu_sums(names::LAUNCHED)?.into_iter().collect())
    }

    /// Drops `pid`'s count (it is no longer watched, or has exited).
    pub fn forget_launched(&mut self, pid: u32) {
        if let Some(map) = self.ebpf.map_mut(names::LAUNCHED) {
            if let Ok(mut m) = PerCpuHashMap::<&mut MapData, u32, u64>::try_from(map) {
                let _ = m.remove(&pid);
            }
        }
    }

    fn launch_done(&mut self) -> Result<&mut UProbe, ProbeError> {
        self.ebpf
            .program_mut(names::PROG_LAUNCH_DONE)
            .ok_or(ProbeError::MissingProgram(names::PROG_LAUNCH_DONE))?
            .try_into()
            .map_err(|e| ProbeError::classify("watching launches", e))
    }
}
