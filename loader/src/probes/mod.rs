//! The eBPF probes on libcuda: load the programs, attach them to a libcuda
//! file by symbol offset (once per inode), and read what they recorded.
//!
//! Used by `vgpu trace`; meant for the daemon too: load with the options it
//! needs (aggregate, no per-call events for launches), [`ProbeSet::attach`]
//! the alloc/free entry points of every libcuda inode it finds, then read
//! [`ProbeSet::procs`] / [`ProbeSet::take_events`].

pub mod btf;
mod error;
pub mod libcuda;
mod uprobe_multi;
mod watch;

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::panic::{catch_unwind, AssertUnwindSafe};

use aya::{
    maps::{HashMap as AyaHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        UProbe,
    },
    Ebpf, EbpfLoader,
};
use aya_log::EbpfLogger;
pub use error::ProbeError;
use libcuda::Libcuda;
use uprobe_multi::MultiPrograms;
use vgpu_common::event::{
    names, sizes, AllocKey, Caller, Config, Counter, Func, FuncClass, KernelOffsets, LaunchKey,
    ProcCounters,
};
pub use watch::Watched;

/// The eBPF object built by build.rs (empty when built with `AYA_BUILD_SKIP=1`).
pub const EBPF_ELF: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/vgpu-ebpf"));

/// How the programs behave; fixed at load time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Emit one ring-buffer event per call (costly on the launch path).
    pub emit_events: bool,
    /// Aggregate into the per-process and per-kernel maps.
    pub aggregate: bool,
    /// Kernel offsets for namespace pids; `None` leaves them 0.
    pub offsets: Option<KernelOffsets>,
    /// Processes tracked at once (`PROCS`, `PROC_COUNTS`); `None`:
    /// [`sizes::PROCS`]. Beyond it a process is counted as `procs_full`.
    pub max_procs: Option<u32>,
    /// Perf-event uprobes even where uprobe_multi links would do.
    pub perf_uprobes: bool,
}

/// What [`ProbeSet::attach`] did for one libcuda.
#[derive(Clone, Debug, Default)]
pub struct AttachReport {
    /// Entry points probed.
    pub attached: Vec<Func>,
    /// Entry points the library does not export.
    pub missing: Vec<Func>,
    /// Entry points at the same address as an earlier one (counted as that one).
    pub aliased: Vec<(Func, Func)>,
    /// True when this inode was already attached (nothing was done).
    pub already: bool,
}

/// How the programs are attached.
enum Attach {
    /// uprobe_multi links, one per program and file: released together.
    Multi {
        progs: MultiPrograms,
        links: Vec<OwnedFd>,
    },
    /// One perf-event uprobe per program and entry point (kernels before
    /// 6.6): released one at a time, about 0.1 s each.
    Perf,
}

/// Loaded programs and their attachments. Dropping it detaches everything.
pub struct ProbeSet {
    // Declared first so the links close before the maps and programs go.
    attach: Attach,
    ebpf: Ebpf,
    opts: Options,
    inodes: HashSet<(u64, u64)>,
    /// The programs' rare diagnostics (aya-log), `None` if unavailable.
    diagnostics: Option<EbpfLogger<&'static dyn log::Log>>,
}

impl ProbeSet {
    /// Loads the programs into the kernel (needs CAP_BPF + CAP_PERFMON).
    pub fn load(opts: Options) -> Result<ProbeSet, ProbeError> {
        if EBPF_ELF.is_empty() {
            return Err(ProbeError::NoObject);
        }
        raise_memlock_rlimit();
        let config = Config {
            offsets: opts.offsets.unwrap_or_default(),
            emit_events: u32::from(opts.emit_events),
            aggregate: u32::from(opts.aggregate),
        };
        let max_procs = opts.max_procs.unwrap_or(sizes::PROCS).max(1);
        let mut ebpf = EbpfLoader::new()
            .override_global(names::CONFIG, &config, true)
            .map_max_entries(names::PROCS, max_procs)
            .map_max_entries(names::PROC_COUNTS, max_procs)
            .load(EBPF_ELF)
            .map_err(|e| ProbeError::classify("loading eBPF programs", e))?;
        // Before aya-log takes its map out of `ebpf`.
        let attach = if opts.perf_uprobes {
            tracing::info!("perf-event uprobes, as asked");
            load_perf_programs(&mut ebpf)?;
            Attach::Perf
        } else if uprobe_multi::kernel_may_support() {
            match MultiPrograms::load(&ebpf, EBPF_ELF, names::PROG_ENTRY, names::PROG_RETURN) {
                Ok(progs) => {
                    tracing::info!(
                        "probes attach as uprobe_multi links (one per program and file)"
                    );
                    Attach::Multi {
                        progs,
                        links: Vec::new(),
                    }
                }
                Err(e) => {
                    tracing::warn!("uprobe_multi unavailable, using perf-event uprobes: {e}");
                    load_perf_programs(&mut ebpf)?;
                    Attach::Perf
                }
            }
        } else {
            tracing::info!(
                "kernel before {}.{}: perf-event uprobes (released one at a time on exit)",
                uprobe_multi::MIN_KERNEL.0,
                uprobe_multi::MIN_KERNEL.1
            );
            load_perf_programs(&mut ebpf)?;
            Attach::Perf
        };
        // The launch witness attaches per process, through perf events.
        load_aya_programs(&mut ebpf, &[names::PROG_LAUNCH_DONE])?;
        let diagnostics = match EbpfLogger::init(&mut ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!("the eBPF programs' diagnostics will not be shown: {e}");
                None
            }
        };
        Ok(ProbeSet {
            attach,
            ebpf,
            opts,
            inodes: HashSet::new(),
            diagnostics,
        })
    }

    /// Writes the programs' pending diagnostics (a full map, a failed user
    /// read: each logged at its first occurrence per CPU) to the log, as
    /// warnings. Call it periodically.
    pub fn flush_diagnostics(&mut self) {
        let Some(logger) = self.diagnostics.as_mut() else {
            return;
        };
        // aya-log panics on a record it cannot parse; losing the diagnostics
        // must not take the caller down.
        if catch_unwind(AssertUnwindSafe(|| logger.flush())).is_err() {
            tracing::warn!("an eBPF diagnostic record could not be read; no more are shown");
            self.diagnostics = None;
        }
    }

    /// Attaches the entry probe (and the return probe where the result
    /// matters: allocations and frees always, launches only with per-call
    /// events) to each of `funcs` in `lib`. Symbols the library does not
    /// export are skipped and reported. A second call for the same inode does
    /// nothing.
    pub fn attach(&mut self, lib: &Libcuda, funcs: &[Func]) -> Result<AttachReport, ProbeError> {
        let mut report = AttachReport::default();
        if !self.inodes.insert((lib.dev, lib.ino)) {
            report.already = true;
            return Ok(report);
        }
        let names: Vec<&str> = funcs.iter().map(|f| f.symbol()).collect();
        let offsets = libcuda::symbol_offsets(&lib.io_path(), &names)?;
        // (offset, func, with a return probe), one per distinct address.
        let mut points: Vec<(u64, Func, bool)> = Vec::new();
        for &func in funcs {
            let Some(&off) = offsets.get(func.symbol()) else {
                report.missing.push(func);
                continue;
            };
            if let Some(&(_, first, _)) = points.iter().find(|(o, _, _)| *o == off) {
                report.aliased.push((func, first));
                continue;
            }
            let launchy = matches!(func.class(), FuncClass::Launch | FuncClass::GraphLaunch);
            points.push((off, func, !launchy || self.opts.emit_events));
        }
        if matches!(self.attach, Attach::Multi { .. }) {
            match self.attach_multi(lib, &points) {
                Ok(()) => {}
                Err(e) if self.multi_refused(&e) => {
                    tracing::warn!(
                        "the kernel refused a uprobe_multi link ({e}); using perf-event uprobes"
                    );
                    load_perf_programs(&mut self.ebpf)?;
                    self.attach = Attach::Perf;
                }
                Err(e) => return Err(ProbeError::classify("attaching uprobes", e)),
            }
        }
        if matches!(self.attach, Attach::Perf) {
            for &(off, func, with_return) in &points {
                self.attach_one(names::PROG_ENTRY, lib, func, off)?;
                if with_return {
                    self.attach_one(names::PROG_RETURN, lib, func, off)?;
                }
            }
        }
        report.attached = points.iter().map(|&(_, f, _)| f).collect();
        Ok(report)
    }

    /// One entry link for all `points` of `lib`, one return link for those
    /// that want it; each point's cookie is its function id.
    fn attach_multi(
        &mut self,
        lib: &Libcuda,
        points: &[(u64, Func, bool)],
    ) -> Result<(), uprobe_multi::MultiError> {
        let Attach::Multi { progs, links } = &mut self.attach else {
            return Ok(());
        };
        let path = lib.io_path();
        let (offs, cookies): (Vec<u64>, Vec<u64>) = points
            .iter()
            .map(|&(o, f, _)| (o, u64::from(f.id())))
            .unzip();
        if !offs.is_empty() {
            links.push(progs.attach_entry(&path, &offs, &cookies)?);
        }
        let (offs, cookies): (Vec<u64>, Vec<u64>) = points
            .iter()
            .filter(|p| p.2)
            .map(|&(o, f, _)| (o, u64::from(f.id())))
            .unzip();
        if !offs.is_empty() {
            links.push(progs.attach_return(&path, &offs, &cookies)?);
        }
        Ok(())
    }

    /// True when `e` says this kernel cannot make uprobe_multi links at all
    /// (not one was made yet, and the errno is the one of a missing
    /// feature), so falling back to perf-event uprobes is right.
    fn multi_refused(&self, e: &uprobe_multi::MultiError) -> bool {
        let none_yet = matches!(&self.attach, Attach::Multi { links, .. } if links.is_empty());
        none_yet
            && matches!(
                e.link_errno(),
                Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS)
            )
    }

    fn attach_one(
        &mut self,
        prog: &'static str,
        lib: &Libcuda,
        func: Func,
        offset: u64,
    ) -> Result<(), ProbeError> {
        let p: &mut UProbe = self
            .ebpf
            .program_mut(prog)
            .ok_or(ProbeError::MissingProgram(prog))?
            .try_into()
            .map_err(|e| ProbeError::classify("attaching uprobes", e))?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: Some(u64::from(func.id())),
        };
        p.attach(point, lib.io_path(), UProbeScope::AllProcesses)
            .map_err(|e| ProbeError::classify("attaching uprobes", e))?;
        Ok(())
    }

    /// Loads only the empty program and attaches it to every launch entry
    /// point of `lib`: the cost of the trap alone, for overhead baselines.
    /// Returns the loaded object (dropping it detaches) and the entry
    /// points probed.
    pub fn attach_floor(lib: &Libcuda) -> Result<(Ebpf, Vec<Func>), ProbeError> {
        if EBPF_ELF.is_empty() {
            return Err(ProbeError::NoObject);
        }
        raise_memlock_rlimit();
        let mut ebpf = EbpfLoader::new()
            .load(EBPF_ELF)
            .map_err(|e| ProbeError::classify("loading eBPF programs", e))?;
        let prog: &mut UProbe = ebpf
            .program_mut(names::PROG_FLOOR)
            .ok_or(ProbeError::MissingProgram(names::PROG_FLOOR))?
            .try_into()
            .map_err(|e| ProbeError::classify("loading eBPF programs", e))?;
        prog.load()
            .map_err(|e| ProbeError::classify("loading eBPF programs", e))?;
        let launches: Vec<Func> = Func::ALL
            .iter()
            .copied()
            .filter(|f| matches!(f.class(), FuncClass::Launch | FuncClass::GraphLaunch))
            .collect();
        let names: Vec<&str> = launches.iter().map(|f| f.symbol()).collect();
        let offsets = libcuda::symbol_offsets(&lib.io_path(), &names)?;
        let mut attached = Vec::new();
        let mut seen = HashSet::new();
        for func in launches {
            let Some(&off) = offsets.get(func.symbol()) else {
                continue;
            };
            if !seen.insert(off) {
                continue;
            }
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(off),
                cookie: None,
            };
            prog.attach(point, lib.io_path(), UProbeScope::AllProcesses)
                .map_err(|e| ProbeError::classify("attaching uprobes", e))?;
            attached.push(func);
        }
        Ok((ebpf, attached))
    }

    /// Takes the ring buffer of per-call events (once).
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>, ProbeError> {
        let map = self
            .ebpf
            .take_map(names::EVENTS)
            .ok_or(ProbeError::MissingMap(names::EVENTS))?;
        RingBuf::try_from(map).map_err(|e| ProbeError::Map(names::EVENTS, e))
    }

    /// Totals of the "could not record" counters, by [`Counter`].
    pub fn counters(&self) -> Result<Vec<(Counter, u64)>, ProbeError> {
        let map = self
            .ebpf
            .map(names::COUNTERS)
            .ok_or(ProbeError::MissingMap(names::COUNTERS))?;
        let arr: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(map).map_err(|e| ProbeError::Map(names::COUNTERS, e))?;
        let mut out = Vec::new();
        for c in Counter::ALL {
            let v = arr
                .get(&(c as u32), 0)
                .map_err(|e| ProbeError::Map(names::COUNTERS, e))?;
            out.push((c, v.iter().sum()));
        }
        Ok(out)
    }

    /// Per-process identity and counters (summed over CPUs).
    pub fn procs(&self) -> Result<Vec<(Caller, ProcCounters)>, ProbeError> {
        let who = self
            .ebpf
            .map(names::PROCS)
            .ok_or(ProbeError::MissingMap(names::PROCS))?;
        let who: AyaHashMap<&MapData, u32, Caller> =
            AyaHashMap::try_from(who).map_err(|e| ProbeError::Map(names::PROCS, e))?;
        let counts = self
            .ebpf
            .map(names::PROC_COUNTS)
            .ok_or(ProbeError::MissingMap(names::PROC_COUNTS))?;
        let counts: PerCpuHashMap<&MapData, u32, ProcCounters> =
            PerCpuHashMap::try_from(counts).map_err(|e| ProbeError::Map(names::PROC_COUNTS, e))?;
        let mut out = Vec::new();
        for item in counts.iter() {
            let (tgid, per_cpu) = item.map_err(|e| ProbeError::Map(names::PROC_COUNTS, e))?;
            let total = per_cpu
                .iter()
                .fold(ProcCounters::default(), |a, c| a.add(c));
            let caller = who.get(&tgid, 0).unwrap_or(Caller {
                host_tgid: tgid,
                ..Caller::default()
            });
            out.push((caller, total));
        }
        Ok(out)
    }

    /// Launch counts per (process, entry point, function, grid, block), summed over CPUs.
    pub fn launches(&self) -> Result<Vec<(LaunchKey, u64)>, ProbeError> {
        self.per_cpu_sums(names::LAUNCHES)
    }

    /// Each key of the per-CPU count map `name` with its count summed over
    /// CPUs.
    fn per_cpu_sums<K: aya::Pod>(&self, name: &'static str) -> Result<Vec<(K, u64)>, ProbeError> {
        let map = self.ebpf.map(name).ok_or(ProbeError::MissingMap(name))?;
        let map: PerCpuHashMap<&MapData, K, u64> =
            PerCpuHashMap::try_from(map).map_err(|e| ProbeError::Map(name, e))?;
        let mut out = Vec::new();
        for item in map.iter() {
            let (k, v) = item.map_err(|e| ProbeError::Map(name, e))?;
            out.push((k, v.iter().fold(0u64, |a, &c| a.wrapping_add(c))));
        }
        Ok(out)
    }
}

impl ProbeSet {
    /// Drops everything recorded about process `tgid` (call when it has
    /// exited, so the maps do not fill up over a long session).
    pub fn forget(&mut self, tgid: u32) -> Result<(), ProbeError> {
        macro_rules! map_mut {
            ($name:expr) => {
                self.ebpf
                    .map_mut($name)
                    .ok_or(ProbeError::MissingMap($name))?
            };
        }
        let mut procs: AyaHashMap<&mut MapData, u32, Caller> =
            AyaHashMap::try_from(map_mut!(names::PROCS))
                .map_err(|e| ProbeError::Map(names::PROCS, e))?;
        let _ = procs.remove(&tgid);
        let mut counts: PerCpuHashMap<&mut MapData, u32, ProcCounters> =
            PerCpuHashMap::try_from(map_mut!(names::PROC_COUNTS))
                .map_err(|e| ProbeError::Map(names::PROC_COUNTS, e))?;
        let _ = counts.remove(&tgid);
        let mut launches: PerCpuHashMap<&mut MapData, LaunchKey, u64> =
            PerCpuHashMap::try_from(map_mut!(names::LAUNCHES))
                .map_err(|e| ProbeError::Map(names::LAUNCHES, e))?;
        let keys: Vec<LaunchKey> = launches
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.tgid == tgid)
            .collect();
        for k in keys {
            let _ = launches.remove(&k);
        }
        let mut allocs: AyaHashMap<&mut MapData, AllocKey, u64> =
            AyaHashMap::try_from(map_mut!(names::ALLOCS))
                .map_err(|e| ProbeError::Map(names::ALLOCS, e))?;
        let keys: Vec<AllocKey> = allocs
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.tgid == tgid)
            .collect();
        for k in keys {
            let _ = allocs.remove(&k);
        }
        Ok(())
    }
}

/// Loads the programs for perf-event uprobes (aya's own path).
fn load_perf_programs(ebpf: &mut Ebpf) -> Result<(), ProbeError> {
    load_aya_programs(ebpf, &[names::PROG_ENTRY, names::PROG_RETURN])
}

/// Loads `progs` through aya, for perf-event attachment.
fn load_aya_programs(ebpf: &mut Ebpf, progs: &[&'static str]) -> Result<(), ProbeError> {
    for &name in progs {
        let prog: &mut UProbe = ebpf
            .program_mut(name)
            .ok_or(ProbeError::MissingProgram(name))?
            .try_into()
            .map_err(|e| ProbeError::classify("loading eBPF programs", e))?;
        prog.load()
            .map_err(|e| ProbeError::classify("loading eBPF programs", e))?;
    }
    Ok(())
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; lift it (best effort).
fn raise_memlock_rlimit() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid, initialized rlimit struct.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
    if rc != 0 {
        tracing::debug!("setrlimit(RLIMIT_MEMLOCK) failed; fine on kernels >= 5.11");
    }
}
