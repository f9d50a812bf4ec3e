//! `vgpu trace`: live audit of CUDA allocations, frees and kernel launches.

mod devices;
mod filter;
mod output;
mod view;

use std::{
    io::Write as _,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, SignalKind},
};
use vgpu_common::event::{CallEvent, Counter, Func, FuncClass};

use crate::{
    cgroup::CgroupIndex,
    probes::{btf, libcuda::Libcuda, Options, ProbeError, ProbeSet},
};

/// Live audit of CUDA allocations, frees and launches, per process and container.
///
/// Puts uprobes on every launch entry point of libcuda (cuLaunchKernel,
/// cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch and their _ptsz
/// forms), on every allocation and free entry point, and on cuInit and the
/// context calls (cuDevicePrimaryCtxRetain, cuCtxCreate_v2/_v3/_v4), for all
/// processes using that libcuda file, in any container.
///
/// Default view: a table refreshed every --interval of launches/s, graph
/// launches/s, allocations, bytes held and devices per process, with its top
/// kernels (function handle, grid, block). It is counted in kernel maps: no
/// per-launch record leaves the kernel. --events / --json print one record per
/// call instead.
///
/// DEVICES: a context call's device is named by the caller's CUDA ordinal, the
/// device's UUID and its index in the caller's container, found from NVML and
/// the process's NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES (read from
/// /proc/<pid>/environ). Without NVML only the ordinal is shown.
///
/// OVERHEAD: a uprobe is a trap taken on every probed call, by every process
/// using the library, while vgpu trace runs. The default view counts in the
/// kernel and costs about what the bare trap costs; --json and --events
/// send an event per call and cost several times more (figures per GPU:
/// docs/benchmarks.md, "vgpu trace overhead"). Nothing is probed after
/// vgpu trace exits.
///
/// Needs root or CAP_BPF+CAP_PERFMON. Events the probes could not record
/// (full ring buffer or maps) are counted and reported, never dropped silently.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// libcuda file to probe (repeatable). Default: find libcuda.so.1 like the
    /// dynamic loader (LD_LIBRARY_PATH, /usr/local/nvidia/lib64, ld.so cache).
    #[arg(long, value_name = "PATH")]
    libcuda: Vec<PathBuf>,

    /// Print one line per call instead of the table.
    #[arg(long)]
    events: bool,

    /// Print one JSON object per call (JSON lines) instead of the table.
    #[arg(long, conflicts_with = "events")]
    json: bool,

    /// Only this process: host pid or pid inside its namespace (repeatable).
    #[arg(long, value_name = "PID")]
    pid: Vec<u32>,

    /// Only this container id (prefix of the id in the cgroup path).
    #[arg(long, value_name = "ID")]
    container: Option<String>,

    /// Only this Kubernetes pod UID (from the cgroup path).
    #[arg(long, value_name = "UID")]
    pod: Option<String>,

    /// Only this cgroup: its id (inode number) or its path under the cgroup2 mount.
    #[arg(long, value_name = "ID|PATH")]
    cgroup: Option<String>,

    /// Stop after this many seconds (prints a last table in the default view).
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,

    /// With --events/--json: stop after printing this many records.
    #[arg(long, value_name = "N")]
    count: Option<u64>,

    /// Table refresh period in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 1.0, value_parser = super::bounds::seconds(0.1, 3600.0))]
    interval: f64,

    /// Kernels listed per process in the table.
    #[arg(long, value_name = "N", default_value_t = 5)]
    top: usize,

    /// Do not probe launch entry points (allocations, frees and contexts only).
    #[arg(long)]
    no_launches: bool,

    /// Attach only an empty program to the launch entry points and print
    /// nothing: the bare-trap cost, a baseline for overhead measurements.
    #[arg(long, hide = true)]
    floor: bool,

    /// Attach perf-event uprobes even where uprobe_multi links are
    /// available: the older kernels' path, kept testable on new ones.
    #[arg(long, hide = true)]
    perf_uprobes: bool,
}

/// How long an exited process stays in the table.
const EXITED_KEEP: Duration = Duration::from_secs(30);

/// Runs `vgpu trace`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("vgpu trace: starting the async runtime")?;
    rt.block_on(trace(args))
}

/// Turns a probe error into the one sentence the user sees.
fn sentence(e: ProbeError) -> anyhow::Error {
    match e {
        // No source to keep: the sentence reads "vgpu trace needs root ...".
        ProbeError::Permission { .. } => anyhow::anyhow!("vgpu trace {e}"),
        e => anyhow::Error::new(e).context("vgpu trace"),
    }
}

async fn trace(args: Args) -> anyhow::Result<ExitCode> {
    let per_call = args.events || args.json;
    let libs = if args.libcuda.is_empty() {
        vec![Libcuda::discover().map_err(|e| sentence(e.into()))?]
    } else {
        args.libcuda
            .iter()
            .map(|p| Libcuda::open(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| sentence(e.into()))?
    };
    if args.floor {
        return floor(&libs, args.duration).await;
    }
    let offsets = match btf::running_kernel_offsets() {
        Ok(o) => Some(o),
        Err(e) => {
            tracing::warn!("namespace pids unavailable (reported as 0): {e}");
            None
        }
    };
    let mut probes = ProbeSet::load(Options {
        emit_events: per_call,
        aggregate: true,
        offsets,
        max_procs: None,
        perf_uprobes: args.perf_uprobes,
    })
    .map_err(sentence)?;
    let funcs: Vec<Func> = Func::ALL
        .into_iter()
        .filter(|f| !args.no_launches || matches!(f.class(), FuncClass::Alloc | FuncClass::Free))
        .chain(Func::CONTEXT)
        .collect();
    for lib in &libs {
        let rep = probes.attach(lib, &funcs).map_err(sentence)?;
        for f in &rep.missing {
            tracing::info!(
                "{} does not export {}: skipped",
                lib.path.display(),
                f.symbol()
            );
        }
        for (f, first) in &rep.aliased {
            tracing::info!(
                "{} is at the same address as {}: counted as it",
                f.symbol(),
                first.symbol()
            );
        }
        eprintln!(
            "vgpu trace: {} probes on {} (inode {}); Ctrl-C to stop",
            rep.attached.len(),
            lib.path.display(),
            lib.ino
        );
    }
    let filter = filter::Filter::new(&args);
    let mut cgroups = CgroupIndex::new();
    let deadline = args
        .duration
        .map(|s| tokio::time::Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let sleep_until = |d: Option<tokio::time::Instant>| async move {
        match d {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };

    if per_call {
        let ring = probes.take_events().map_err(sentence)?;
        // SAFETY: the RingBuf owns its map fd (an OwnedFd inside MapData) and
        // moves into the AsyncFd, so the fd stays open and the same for the
        // AsyncFd's whole life; `as_raw_fd` always returns that fd.
        let mut ring =
            unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
                .context("vgpu trace: polling the ring buffer")?;
        let mut out = output::EventWriter::new(args.json);
        let mut printed = 0u64;
        let limit = args.count.unwrap_or(u64::MAX);
        'outer: while printed < limit {
            tokio::select! {
                _ = sigint.recv() => break,
                _ = sigterm.recv() => break,
                () = sleep_until(deadline) => break,
                guard = ring.readable_mut() => {
                    let mut guard = guard.context("waiting on the ring buffer")?;
                    let rb = guard.get_inner_mut();
                    while let Some(item) = rb.next() {
                        let Some(ev) = CallEvent::from_bytes(&item) else { continue };
                        drop(item);
                        if !filter.matches(&ev.caller, &mut cgroups) {
                            continue;
                        }
                        if !out.write(&ev, &mut cgroups) {
                            break 'outer; // stdout closed
                        }
                        printed += 1;
                        if printed >= limit {
                            break 'outer;
                        }
                    }
                    out.flush();
                    guard.clear_ready();
                }
            }
        }
        // Records already in the ring buffer when asked to stop are still printed.
        let rb = ring.get_mut();
        while printed < limit {
            let Some(item) = rb.next() else { break };
            let Some(ev) = CallEvent::from_bytes(&item) else {
                continue;
            };
            drop(item);
            if filter.matches(&ev.caller, &mut cgroups) {
                if !out.write(&ev, &mut cgroups) {
                    break;
                }
                printed += 1;
            }
        }
        out.flush();
    } else {
        let mut table = view::Table::new(
            args.top,
            std::io::IsTerminal::is_terminal(&std::io::stdout()),
        );
        let period = Duration::from_secs_f64(args.interval.max(0.05));
        let mut tick = tokio::time::interval(period);
        tick.tick().await;
        let started = Instant::now();
        loop {
            let last = tokio::select! {
                _ = sigint.recv() => true,
                _ = sigterm.recv() => true,
                () = sleep_until(deadline) => true,
                _ = tick.tick() => false,
            };
            probes.flush_diagnostics();
            let snap = view::Snapshot::read(&probes, &filter, &mut cgroups).map_err(sentence)?;
            if !table.render(&snap, started.elapsed(), last) {
                break;
            }
            if last {
                break;
            }
            // Processes gone for a while leave the table and the kernel maps.
            for tgid in table.expired(&snap, EXITED_KEEP) {
                probes.forget(tgid).map_err(sentence)?;
            }
        }
    }
    probes.flush_diagnostics();
    report_lost(&probes)?;
    drop(probes); // detaches every probe
    Ok(ExitCode::SUCCESS)
}

/// Prints the "could not record" counters on stderr when any is non-zero.
fn report_lost(probes: &ProbeSet) -> anyhow::Result<()> {
    let counters = probes.counters().map_err(sentence)?;
    let lost: Vec<String> = counters
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(c, n)| format!("{} {n}", c.name()))
        .collect();
    let ringbuf = counters
        .iter()
        .find(|(c, _)| *c == Counter::RingbufFull)
        .map_or(0, |(_, n)| *n);
    let mut err = std::io::stderr().lock();
    if lost.is_empty() {
        let _ = writeln!(err, "vgpu trace: lost events: 0");
    } else {
        let _ = writeln!(
            err,
            "vgpu trace: lost events: {ringbuf} ({})",
            lost.join(", ")
        );
    }
    Ok(())
}

/// `--floor`: the empty program on every launch entry point until the
/// duration ends or a signal comes.
async fn floor(libs: &[Libcuda], duration: Option<f64>) -> anyhow::Result<ExitCode> {
    let mut held = Vec::new();
    for lib in libs {
        let (ebpf, funcs) = ProbeSet::attach_floor(lib).map_err(sentence)?;
        eprintln!(
            "attached the empty floor program to {} launch entry points of {}",
            funcs.len(),
            lib.path.display()
        );
        held.push(ebpf);
    }
    let wait = async {
        match duration {
            Some(s) => tokio::time::sleep(Duration::from_secs_f64(s)).await,
            None => std::future::pending::<()>().await,
        }
    };
    let mut term =
        signal(SignalKind::terminate()).context("vgpu trace: installing the SIGTERM handler")?;
    tokio::select! {
        () = wait => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(held);
    Ok(ExitCode::SUCCESS)
}
