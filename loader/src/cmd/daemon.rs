//! `vgpu daemon` (the node's eBPF observer) and `vgpu findings` (what it found).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::MissedTickBehavior;
use vgpu_common::event::sizes;
use vgpu_common::paths::{HOOK_DIR, METRICS_PORT, PODS_LOG_DIR, REGION_ROOTS_IN_HOOK_DIR};

use super::bounds::{number, seconds};
use crate::daemon::collect::libs::LibWatch;
use crate::daemon::collect::nvml::NvmlView;
use crate::daemon::collect::procfs::Procfs;
use crate::daemon::http::listen::{self, Listen};
use crate::daemon::http::tls;
use crate::daemon::http::{self, Published, Shared};
use crate::daemon::judge::check::{Thresholds, MIB};
use crate::daemon::judge::integrity::decide::Policy;
use crate::daemon::judge::integrity::spec::{SpecPattern, DEFAULT_SPECS};
use crate::daemon::judge::integrity::Config as IntegrityConfig;
use crate::daemon::observer::{Observer, ObserverSettings};
use crate::daemon::plan::planner::{self, Handle as PlanHandle};
use crate::daemon::state::findings::{read_earlier, write_state, write_state_file, FILE_NAME};
use crate::daemon::state::retention::DEFAULT_RETENTION;
use crate::host_pidns;
use crate::logging;
use crate::printable::escape_controls;
use crate::probes::{btf, Options, ProbeError, ProbeSet};

/// The node daemon: host PIDs for the hook, an accounting cross-check, metrics.
///
/// Puts uprobes on the real libcuda (the host's, and every container's,
/// found under /proc/<pid>/root and rescanned every few seconds; each file
/// once by inode) at driver init, context creation and every allocation and
/// free entry point. Never on a kernel launch: the launch path pays nothing.
///
/// For each CUDA process it writes the host PID into the process's slot of
/// its shared region (CUDA_DEVICE_MEMORY_SHARED_CACHE in /proc/<pid>/environ,
/// resolved under /proc/<pid>/root), which the hook cannot learn inside a
/// PID namespace and without which per-container utilization reads 0. The
/// slot is the one recording the process's namespace PID, PID namespace and
/// start time. Slots whose process is then proven dead (its host PID gone or
/// another process) are freed, as `vgpu cleanup` would, so that a
/// container's last exit does not leave its usage counted.
///
/// It compares what the kernel saw each process allocate, what its slot
/// tracks and what NVML says it uses. A persistent difference (default
/// max(16 MiB, 2 %) for 2 scans) is an `untracked_allocation` finding; a CUDA
/// process without a region or slot is `no_region`. Findings are logged,
/// exported as metrics, written to <state-dir>/findings.json and served at
/// /findings (see `vgpu findings`).
///
/// Limit integrity: each container's limits are known from its OCI
/// runtime spec (the environment the device plugin gave it, which the
/// container cannot change) and admins' `vgpu set-*-limit` changes. A
/// region whose limits differ is `limit_tampered`, a process whose own
/// limit variables are unset or looser is `unlimited_process`, one naming
/// another region `private_region`, and a container holding more than its
/// limit by the kernel's count `over_limit`; --on-violation says what
/// happens then.
///
/// Turns and priority: the daemon alone plans how SM-limited containers on
/// a GPU take turns and how lower-priority containers hold for higher ones,
/// from each container's runtime spec (limit, CUDA_TASK_PRIORITY) and NVML's
/// view of who uses the GPU, and writes each container its plan into its
/// own sidecar (`<region>.sm`); no container reads another's words. Without
/// the daemon, containers do not coordinate and each keeps its own SM limit.
/// `vgpu turns` shows the plan.
///
/// HTTP (default 0.0.0.0:9396): /metrics (Prometheus text, HAMi monitor's
/// metric names plus vgpu_*), /readyz (200 once the probes are loaded and
/// the first scan is done, whether or not a libcuda was found yet; 503 with
/// the reason when not in the host's PID namespace, where it frees no
/// slot), /healthz, /findings. Served on its own thread with a 3 s header
/// timeout, 10 s per connection, 16 KiB requests and at most 256
/// connections (16 per client address). See docs/daemon.md.
///
/// Region files and paths that containers control are treated as hostile:
/// opened with openat2 inside the process's root, never through a symlink,
/// never mapped (read with pread), at most 4 per container directory under
/// --regions-root (docs/daemon.md, "Threat model").
///
/// Needs root or CAP_BPF+CAP_PERFMON+CAP_SYS_PTRACE (to read other
/// processes' /proc entries). SIGINT/SIGTERM detach everything and exit.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Probe only this libcuda file (repeatable); disables the host and
    /// container scan. E.g. the simulated driver in tests. A path not there
    /// yet is looked for again every --rescan seconds.
    #[arg(long, value_name = "PATH")]
    libcuda: Vec<PathBuf>,

    /// Address of the HTTP endpoint: IP:PORT (`0.0.0.0:9396`), `[IPv6]:PORT`
    /// (`[::1]:9396`), :PORT (every interface, IPv4 and IPv6) or HOST:PORT
    /// (`localhost:9396`: every address the name resolves to at startup).
    #[arg(long, value_name = "ADDR", default_value_t = Listen::Addr(SocketAddr::from(([0, 0, 0, 0], METRICS_PORT))))]
    listen: Listen,

    /// Serve HTTPS only on --listen, with this PEM certificate chain (leaf
    /// first; a Kubernetes TLS Secret's `tls.crt`). Needs --tls-key. Both
    /// files are read at startup: restart the daemon after a rotation. A
    /// plain HTTP request is then closed unanswered, so the kubelet's
    /// probes and Prometheus must use https (deploy/components/tls).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1; a TLS
    /// Secret's `tls.key`). Needs --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Directory of the state file (findings.json).
    #[arg(long, value_name = "DIR", default_value = "/run/vgpu")]
    state_dir: PathBuf,

    /// A root of region directories (`<podUID>_<ctr>/` or `<claimUID>/`),
    /// exported when present; repeat for several. Default: under
    /// --hook-dir, HAMi's `containers`, Volcano's vGPU device plugin's
    /// `vgpu/containers` and HAMi's DRA driver's `claims`.
    #[arg(long, value_name = "DIR")]
    regions_root: Vec<PathBuf>,

    /// The host directory HAMi-core's hosts keep libvgpu.so and the region
    /// directories in (HAMi's `<gpuHookPath>/vgpu`): the default roots of
    /// --regions-root lie under it.
    #[arg(long, value_name = "DIR", default_value = HOOK_DIR)]
    hook_dir: PathBuf,

    /// The kubelet's pod log directory: its `<namespace>_<pod>_<uid>`
    /// entries name the pods in metric labels (no API-server access).
    #[arg(long, value_name = "DIR", default_value = PODS_LOG_DIR)]
    pods_log_dir: PathBuf,

    /// This node's name, the `node` label of the host GPU series (HAMi's)
    /// and of the findings' series; the DaemonSet sets NODE_NAME from the
    /// downward API. Empty: no `node` label (not the host name, which in a
    /// pod without hostNetwork is the pod's).
    #[arg(long, value_name = "NAME", env = "NODE_NAME", default_value = "")]
    node_name: String,

    /// Also export HAMi 2.5–2.8's series (HostGPUMemoryUsage,
    /// vGPU_device_memory_usage_in_bytes, ... with their label names), for
    /// the dashboards of those versions; HAMi 2.9+'s flag. Off by default.
    #[arg(long, env = "VGPU_LEGACY_METRICS")]
    legacy_metrics: bool,

    /// Seconds between cross-check scans (findings, metrics).
    #[arg(long, value_name = "SECS", default_value_t = 0.5, value_parser = seconds(0.05, 3600.0))]
    interval: f64,

    /// Milliseconds between polls of the probe maps (host-PID fill).
    #[arg(long, value_name = "MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(10..=10_000))]
    poll_ms: u64,

    /// Seconds between rescans for new libcuda files (containers).
    #[arg(long, value_name = "SECS", default_value_t = 5.0, value_parser = seconds(0.5, 3600.0))]
    rescan: f64,

    /// A difference below this many MiB is never a finding.
    #[arg(long, value_name = "MIB", default_value_t = 16, value_parser = clap::value_parser!(u64).range(0..=1 << 20))]
    min_untracked_mib: u64,

    /// … nor one below this percentage of the larger value.
    #[arg(long, value_name = "PCT", default_value_t = 2.0, value_parser = number(0.0, 100.0, "percent"))]
    untracked_percent: f64,

    /// Consecutive scans a difference must persist.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    scans: u32,

    /// Seconds a CUDA process may run without a slot before it is a finding.
    #[arg(long, value_name = "SECS", default_value_t = 3.0, value_parser = seconds(0.0, 3600.0))]
    slot_grace: f64,

    /// Processes the probes track at once (their per-process maps). A process
    /// beyond it is counted in vgpu_probe_lost_events{reason="procs_full"},
    /// and the first such miss on each CPU is logged.
    #[arg(long, value_name = "N", default_value_t = sizes::PROCS, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    max_procs: u32,

    /// Do not use NVML (no per-process used memory, no host GPU metrics).
    #[arg(long)]
    no_nvml: bool,

    /// Where container runtimes keep a container's OCI spec (repeatable;
    /// the first existing file wins): `{id}` is the container id from the
    /// cgroup path, `*` any one directory (containerd's namespace).
    #[arg(long, value_name = "PATTERN", default_values = DEFAULT_SPECS)]
    runtime_spec: Vec<SpecPattern>,

    /// What to do about an integrity finding (docs/daemon.md, Limit
    /// integrity). The default, restore, undoes exactly the tenant's write
    /// and stops no workload on a false positive. A container whose spec
    /// sets ACTIVE_OOM_KILLER=true gets kill whatever this says.
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = Policy::Restore)]
    on_violation: Policy,

    /// Seconds a resolved finding (a restored limit, a killed process, one
    /// the tenant undid) stays in /findings and `vgpu findings`, marked
    /// resolved. Every violation is also counted in vgpu_violations_total.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_RETENTION.as_secs_f64(), value_parser = seconds(0.0, 30.0 * 86_400.0))]
    findings_retention: f64,
}

/// Runs `vgpu daemon`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("vgpu daemon: starting the async runtime")?;
    rt.block_on(daemon(args))
}

fn sentence(e: ProbeError) -> anyhow::Error {
    match e {
        // No source to keep: the sentence reads "vgpu daemon needs root ...".
        ProbeError::Permission { .. } => anyhow::anyhow!("vgpu daemon {e}"),
        e => anyhow::Error::new(e).context("vgpu daemon"),
    }
}

fn secs(s: f64, min: f64) -> Duration {
    Duration::from_secs_f64(if s.is_finite() { s.max(min) } else { min })
}

async fn daemon(args: Args) -> anyhow::Result<ExitCode> {
    let listeners = args.listen.bind().context("vgpu daemon")?;
    // Read before any probe is attached, so a bad Secret fails at once.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key).context("vgpu daemon")?),
        // clap's `requires` leaves only both or neither.
        _ => None,
    };
    let serving = listen::describe(&listeners, tls.is_some());
    let host_pids = host_pidns::check(std::path::Path::new("/proc"));
    if let Err(e) = &host_pids {
        tracing::error!(
            "vgpu daemon cannot see host PIDs: {e}. It will free no slot, fill no host PID and \
             track no process; /readyz answers 503"
        );
    }
    let offsets = match btf::running_kernel_offsets() {
        Ok(o) => Some(o),
        Err(e) => {
            tracing::warn!("namespace pids from /proc instead of the probes: {e}");
            None
        }
    };
    let probes = ProbeSet::load(Options {
        emit_events: false,
        aggregate: true,
        offsets,
        max_procs: Some(args.max_procs),
        perf_uprobes: false,
    })
    .map_err(sentence)?;
    let nvml = if args.no_nvml {
        None
    } else {
        match NvmlView::init() {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!("NVML unavailable, cross-checking against the probes only: {e}");
                None
            }
        }
    };
    let settings = ObserverSettings {
        thresholds: Thresholds {
            min_bytes: args.min_untracked_mib.saturating_mul(MIB),
            ratio: args.untracked_percent.max(0.0) / 100.0,
            scans: args.scans.max(1),
        },
        slot_grace: secs(args.slot_grace, 0.0),
        regions_roots: if args.regions_root.is_empty() {
            REGION_ROOTS_IN_HOOK_DIR
                .iter()
                .map(|r| args.hook_dir.join(r))
                .collect()
        } else {
            args.regions_root.clone()
        },
        pods_log_dir: args.pods_log_dir.clone(),
        node: args.node_name.clone(),
        legacy_metrics: args.legacy_metrics,
        integrity: Some(IntegrityConfig {
            specs: args.runtime_spec.clone(),
            state_dir: args.state_dir.clone(),
            policy: args.on_violation,
        }),
        host_pids: host_pids.clone(),
        findings_retention: secs(args.findings_retention, 0.0),
        planner: host_pids.is_ok().then(PlanHandle::default),
    };
    if let Some(h) = &settings.planner {
        planner::spawn(h.clone(), args.state_dir.clone()).context("starting the planner")?;
    }
    let libs = LibWatch::new(Procfs::default(), args.libcuda.clone());
    let mut obs = Observer::new(settings, probes, libs, nvml);
    let (earlier, written) = read_earlier(&args.state_dir);
    obs.carry_over_findings(earlier, written);
    obs.attach_new_libs().map_err(sentence)?;
    if obs.attached_libs() == 0 {
        tracing::warn!("no libcuda found yet; looking again every {}s", args.rescan);
    }

    let shared: Shared = Arc::new(Mutex::new(Published {
        not_ready: host_pids
            .err()
            .map(|e| format!("{e}; no slot is freed and no host PID filled\n").into()),
        ..Published::default()
    }));
    http::spawn(listeners, shared.clone(), tls).context("vgpu daemon")?;
    logging::notice(&format!(
        "vgpu daemon: {} libcuda file(s) probed; {serving}; state {}",
        obs.attached_libs(),
        args.state_dir.join(FILE_NAME).display()
    ));

    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut poll = tokio::time::interval(Duration::from_millis(args.poll_ms.max(10)));
    let mut scan = tokio::time::interval(secs(args.interval, 0.05));
    let mut rescan = tokio::time::interval(secs(args.rescan, 0.5));
    for t in [&mut poll, &mut scan, &mut rescan] {
        t.set_missed_tick_behavior(MissedTickBehavior::Skip);
    }
    rescan.tick().await;
    let mut state_warned = false;
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = poll.tick() => {
                if let Err(e) = obs.poll() {
                    tracing::warn!("reading the probe maps: {e}");
                }
                if let Ok(mut p) = shared.lock() {
                    p.last_poll = Instant::now();
                }
            }
            _ = scan.tick() => {
                let out = obs.scan();
                tracing::trace!("scan: {} finding(s)", out.findings);
                let util = crate::daemon::judge::utilization::FILE_NAME;
                match write_state(&args.state_dir, &out.findings_json)
                    .and_then(|()| write_state_file(&args.state_dir, util, &out.utilization_json))
                {
                    Ok(()) => state_warned = false,
                    Err(e) if !state_warned => {
                        tracing::warn!("{e}");
                        state_warned = true;
                    }
                    Err(_) => {}
                }
                if let Ok(mut p) = shared.lock() {
                    p.metrics = out.metrics;
                    p.findings = out.findings_json.into();
                    // Ready once the probes are loaded and a scan ran, with or
                    // without a libcuda yet: on an idle node the driver's
                    // library may only arrive with the first GPU pod, and a
                    // rollout must not wait for a workload.
                    p.ready = true;
                }
            }
            _ = rescan.tick() => {
                if let Err(e) = obs.attach_new_libs() {
                    tracing::warn!("attaching to a new libcuda: {e}");
                }
            }
        }
    }
    drop(obs); // detaches every probe
    logging::notice("vgpu daemon: probes detached, exiting");
    Ok(ExitCode::SUCCESS)
}

/// Show what `vgpu daemon` found: open findings and recently resolved ones.
///
/// Untracked allocations, CUDA processes without a region, and limit
/// integrity findings (tampered limits, processes without their
/// container's limit or region, containers past their limit), open ones
/// and those resolved within the daemon's --findings-retention. Reads the
/// daemon's state file (format in docs/daemon.md).
///
/// Exit status: 0 when no finding is open (resolved ones are still listed,
/// marked), 3 when one is, 1 when the state file cannot be read.
#[derive(clap::Args, Debug)]
pub struct FindingsArgs {
    /// The daemon's --state-dir.
    #[arg(long, value_name = "DIR", default_value = "/run/vgpu")]
    state_dir: PathBuf,

    /// Print the state file's JSON unchanged.
    #[arg(long)]
    json: bool,
}

/// Runs `vgpu findings`.
pub fn run_findings(args: FindingsArgs) -> anyhow::Result<ExitCode> {
    let path = args.state_dir.join(FILE_NAME);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (is vgpu daemon running?)", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let list = v["findings"].as_array().cloned().unwrap_or_default();
    // Written with `?`, not println!: a reader that goes away (`| head`)
    // ends the command quietly instead of a panic.
    let mut w = std::io::stdout().lock();
    if args.json {
        write!(w, "{text}")?;
    } else if list.is_empty() {
        writeln!(w, "no findings")?;
    } else {
        let now = crate::daemon::state::findings::now_ms();
        for f in &list {
            let resolved = f["resolved_unix_ms"].as_u64().map_or(String::new(), |t| {
                format!(" [resolved {} s ago]", now.saturating_sub(t) / 1000)
            });
            // Messages quote process names and paths tenants chose.
            writeln!(
                w,
                "{:<22} {}{resolved}",
                escape_controls(f["kind"].as_str().unwrap_or("?")),
                escape_controls(f["message"].as_str().unwrap_or(""))
            )?;
        }
    }
    // A resolved finding is on record, not wrong now: only an open one makes
    // the status say so, as `vgpu_findings` does.
    let open = list.iter().any(|f| f.get("resolved_unix_ms").is_none());
    Ok(if open {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}
