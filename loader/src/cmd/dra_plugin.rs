//! `vgpu dra-plugin`: the Kubernetes DRA kubelet plugin (crate::dra).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, Result};

use crate::dra::api::ApiServer;
use crate::dra::cdi::{self, Layout};
use crate::dra::server::{self, chain, Plugin};
use crate::dra::{devices, slice, state::State};

/// Serve GPU shares to Kubernetes DRA claims, enforced by vgpu's hook.
///
/// A kubelet plugin: it publishes the node's GPUs as a ResourceSlice (one
/// device per GPU, `gpu-<index>`, with consumable capacity `memory` and
/// `cores`), registers with kubelet through a socket in kubelet's plugin
/// registry, and serves kubelet's DRA v1 service on its own socket. It
/// lists the GPUs again every `--rescan-interval` and replaces the slice
/// when they changed. For each claim kubelet prepares, it reads the claim's
/// allocation from the API server (its devices, the consumed capacity
/// `memory` and `cores`, and the opaque `VgpuConfig` parameters: priority,
/// oversubscription, core policy), writes one CDI spec per claim into
/// `--cdi-dir` and answers the CDI device `<driver>/claim=<claim UID>`.
/// Where the node has NVIDIA's CDI spec naming the claim's GPUs, NVIDIA's
/// devices are answered too and bring the device nodes and driver files.
/// The spec gives the container the claim's GPUs, vgpu's `libvgpu.so` and
/// `/etc/ld.so.preload` read-only, a region directory of its own
/// (`<hook-dir>/claims/<claim UID>/`, where `vgpu daemon` finds it) and
/// the limits: `CUDA_DEVICE_MEMORY_LIMIT_<i>` and `CUDA_DEVICE_SM_LIMIT_<i>`
/// in the order the container sees its GPUs, `CUDA_TASK_PRIORITY`,
/// `CUDA_OVERSUBSCRIBE`. A claim vgpu cannot prepare (another driver's, a
/// malformed config, more than a GPU has) gets an error kubelet shows in
/// the pod's events, and nothing is written. Preparing twice answers the
/// same, also after a restart (a checkpoint in `--state-dir`); unprepare
/// removes the spec, the claim's directory and the checkpoint entry. At
/// start, specs the checkpoint does not name are removed, and so are
/// claims the API server no longer has. docs/kubernetes.md, "Without HAMi".
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The DRA driver name: the ResourceSlice's and DeviceClass's driver,
    /// and the CDI vendor.
    #[arg(long, default_value = "vgpu.dev")]
    driver: String,
    /// This node's name: the pool of its devices.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The API server, `https://host:port` or `http://host:port` (a
    /// `kubectl proxy`) [default: in a pod, the cluster's
    /// (`KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`) with the
    /// service account's token and CA].
    #[arg(long, env = "VGPU_API_SERVER")]
    api_server: Option<String>,
    /// A bearer token to send the API server, read before each request
    /// [default: in a pod, the service account's].
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The CA the API server's certificate must chain to (PEM), for HTTPS
    /// [default: in a pod, the service account's `ca.crt`].
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// Where CDI specs are written; the container runtime reads them there.
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// The host's hook directory: `libvgpu.so`, `ld.so.preload` (as
    /// `vgpu install-hook` leaves them) and the claims' region directories
    /// under `claims/`.
    #[arg(long, default_value = "/usr/local/vgpu")]
    hook_dir: PathBuf,
    /// Where containers see the hook directory.
    #[arg(long, default_value = "/usr/local/vgpu")]
    container_hook_dir: PathBuf,
    /// Where the plugin keeps its checkpoint of prepared claims.
    #[arg(long, default_value = "/var/lib/vgpu/dra")]
    state_dir: PathBuf,
    /// kubelet's plugin registry: the registration socket
    /// `<driver>-reg.sock` goes there.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    registry_dir: PathBuf,
    /// The plugin's own directory: its DRA socket `dra.sock` goes there
    /// [default: /var/lib/kubelet/plugins/<driver>].
    #[arg(long)]
    plugin_dir: Option<PathBuf>,
    /// Where the host's GPU device nodes are, to list them in the specs.
    #[arg(long, default_value = "/dev")]
    dev_dir: PathBuf,
    /// Seconds between two listings of the node's GPUs through NVML; when
    /// the list changes (a GPU added, lost or replaced), the ResourceSlice
    /// is replaced and claims are planned against the new list.
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    rescan_interval: f64,
    /// Where to look for NVIDIA's CDI spec (kind `nvidia.com/gpu`); where
    /// it names each of a claim's GPUs, kubelet gets NVIDIA's device beside
    /// the claim's and the claim's spec lists no device nodes. Repeat for
    /// several directories.
    #[arg(long, default_values = ["/etc/cdi", "/var/run/cdi"])]
    nvidia_cdi_dir: Vec<PathBuf>,
}

/// A positive, finite number of seconds.
fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

/// Runs the plugin until SIGTERM or SIGINT.
pub fn run(args: Args) -> Result<ExitCode> {
    if !cdi::valid_name(&args.driver) || !args.driver.contains('.') {
        anyhow::bail!(
            "--driver {:?} is not a DNS name (a CDI vendor and a DRA driver name)",
            args.driver
        );
    }
    let (gpus, driver) = devices::from_nvml().context("listing this node's GPUs")?;
    let api = api_server(&args)?;
    let layout = Layout {
        kind: format!("{}/{}", args.driver, cdi::CLASS),
        hook_dir: args.hook_dir,
        container_hook_dir: args.container_hook_dir,
        dev_dir: args.dev_dir,
    };
    let (state, cleaned) = State::open(layout, args.cdi_dir, &args.state_dir)
        .map_err(|e| anyhow::anyhow!(chain(&e)))
        .context("opening the plugin's state")?;
    for uid in cleaned {
        tracing::info!("removed the CDI spec of claim {uid}: no checkpoint names it");
    }
    let plugin_dir = args
        .plugin_dir
        .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/plugins").join(&args.driver));
    let registration = args.registry_dir.join(format!("{}-reg.sock", args.driver));
    tracing::info!(
        "{} GPU(s) in pool {}; DRA socket {}, registration socket {}",
        gpus.len(),
        args.node_name,
        plugin_dir.join("dra.sock").display(),
        registration.display()
    );
    let rescan = std::time::Duration::from_secs_f64(args.rescan_interval);
    let plugin = Arc::new(Plugin {
        driver: args.driver,
        pool: args.node_name,
        gpus: tokio::sync::RwLock::new(gpus),
        api,
        state: tokio::sync::Mutex::new(state),
        endpoint: plugin_dir.join("dra.sock"),
        nvidia_cdi_dirs: args.nvidia_cdi_dir,
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        plugin.clean_deleted().await;
        tokio::spawn(keep_slice_current(plugin.clone(), driver, rescan));
        server::serve(plugin, registration, shutdown()).await
    })
    .map_err(|e| anyhow::anyhow!(chain(&e)))?;
    Ok(ExitCode::SUCCESS)
}

/// How long to wait before publishing the ResourceSlice again after a
/// failure (at most: a shorter rescan interval wins).
const PUBLISH_RETRY: std::time::Duration = std::time::Duration::from_secs(10);

/// Publishes the node's ResourceSlice, retrying until the API server takes
/// it (claims already allocated are prepared meanwhile); then lists the
/// GPUs every `every` and publishes again when the list changed. A listing
/// that fails keeps the last one: NVML failing once is not every GPU gone.
async fn keep_slice_current(
    plugin: Arc<Plugin>,
    mut driver: devices::Driver,
    every: std::time::Duration,
) {
    let mut current = false;
    loop {
        if !current {
            let gpus = plugin.gpus.read().await.clone();
            match slice::publish(&plugin.api, &plugin.driver, &plugin.pool, &gpus, &driver).await {
                Ok(p) => {
                    tracing::info!(
                        "ResourceSlice {}: {p:?}",
                        slice::name(&plugin.pool, &plugin.driver)
                    );
                    current = true;
                }
                Err(e) => tracing::warn!(
                    "publishing the ResourceSlice (again in {:.1} s): {}",
                    PUBLISH_RETRY.min(every).as_secs_f64(),
                    chain(&e)
                ),
            }
        }
        tokio::time::sleep(if current {
            every
        } else {
            PUBLISH_RETRY.min(every)
        })
        .await;
        match tokio::task::spawn_blocking(devices::from_nvml).await {
            Ok(Ok((gpus, now))) => {
                let mut known = plugin.gpus.write().await;
                if *known != gpus || driver != now {
                    tracing::info!(
                        "the node's GPUs changed: [{}] -> [{}]",
                        uuids(&known),
                        uuids(&gpus)
                    );
                    *known = gpus;
                    driver = now;
                    current = false;
                }
            }
            Ok(Err(e)) => tracing::warn!(
                "listing the node's GPUs again: {}; the last list stays",
                chain(&e)
            ),
            Err(e) => tracing::warn!("listing the node's GPUs again: {e}"),
        }
    }
}

/// `0:GPU-…, 1:GPU-…`, for the log.
fn uuids(gpus: &[devices::Gpu]) -> String {
    gpus.iter()
        .map(|g| format!("{}:{}", g.index, g.uuid))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The service account's files in a pod.
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The API server of `--api-server`, or the pod's cluster's.
fn api_server(args: &Args) -> Result<ApiServer> {
    let sa = std::path::Path::new(SERVICE_ACCOUNT);
    let in_pod = |name: &str| Some(sa.join(name)).filter(|p| p.exists());
    let url = match &args.api_server {
        Some(u) => u.clone(),
        None => {
            let (Ok(host), Ok(port)) = (
                std::env::var("KUBERNETES_SERVICE_HOST"),
                std::env::var("KUBERNETES_SERVICE_PORT"),
            ) else {
                anyhow::bail!(
                    "no --api-server, and not in a pod (KUBERNETES_SERVICE_HOST and \
                     KUBERNETES_SERVICE_PORT unset)"
                );
            };
            if host.contains(':') {
                format!("https://[{host}]:{port}")
            } else {
                format!("https://{host}:{port}")
            }
        }
    };
    let https = url.starts_with("https://");
    let token = args.token_file.clone().or_else(|| {
        // The pod's token goes only where the pod's CA is trusted, or
        // where --api-server was not given at all.
        (https || args.api_server.is_none())
            .then(|| in_pod("token"))
            .flatten()
    });
    let ca = args.ca_file.clone().or_else(|| in_pod("ca.crt"));
    ApiServer::new(&url, token, ca).map_err(|e| anyhow::anyhow!(chain(&e)))
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot watch SIGTERM/SIGINT; stop the plugin with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("stopping: removing the plugin's sockets");
}
