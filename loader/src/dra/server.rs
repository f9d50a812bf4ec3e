//! The two gRPC services on their Unix sockets: plugin registration (what
//! kubelet's plugin watcher asks first) and DRA v1 (prepare, unprepare).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::api::{ApiError, ApiServer};
use super::claim::ClaimError;
use super::devices::Gpu;
use super::nvidia::NvidiaDevices;
use super::pb::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use super::pb::dra::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use super::pb::registration::registration_server::{Registration, RegistrationServer};
use super::pb::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::state::{Prepared, State, StateError};

/// `PluginInfo.type` of a DRA driver.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA service version this plugin serves, as kubelet names it.
pub const DRA_VERSION: &str = "v1.DRAPlugin";

/// Why one claim was not prepared or unprepared; its text goes to kubelet.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("kubelet named claim {namespace}/{name} without a UID")]
    NoUid { namespace: String, name: String },
    #[error("reading the claim")]
    Api(#[from] ApiError),
    #[error(
        "ResourceClaim {namespace}/{name} has UID {found}, not {asked}: \
         it was deleted and made anew"
    )]
    UidMismatch {
        namespace: String,
        name: String,
        found: String,
        asked: String,
    },
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error("writing the claim's files")]
    State(#[from] StateError),
}

/// The plugin: its identity, the node's GPUs, the API server, and what it
/// prepared. Calls are served one claim at a time.
pub struct Plugin {
    pub driver: String,
    /// The pool of this node's devices (the node's name).
    pub pool: String,
    /// The node's GPUs as NVML last listed them; replaced when that
    /// changes (a GPU added, lost or replaced).
    pub gpus: tokio::sync::RwLock<Vec<Gpu>>,
    pub api: ApiServer,
    pub state: tokio::sync::Mutex<State>,
    /// The DRA socket, as `GetInfo` tells kubelet.
    pub endpoint: PathBuf,
    /// Where NVIDIA's CDI spec may be (read at each prepare: the toolkit
    /// may write it after the plugin started).
    pub nvidia_cdi_dirs: Vec<PathBuf>,
}

impl Plugin {
    async fn prepare(&self, c: &Claim) -> Result<Prepared, PrepareError> {
        if c.uid.is_empty() {
            return Err(PrepareError::NoUid {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
            });
        }
        let mut state = self.state.lock().await;
        if let Some(p) = state.get(&c.uid) {
            return Ok(p.clone());
        }
        let claim = self.api.resource_claim(&c.namespace, &c.name).await?;
        if claim.metadata.uid != c.uid {
            return Err(PrepareError::UidMismatch {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                found: claim.metadata.uid,
                asked: c.uid.clone(),
            });
        }
        let mut plan = claim.plan(&self.driver, &self.pool, &self.gpus.read().await)?;
        let nvidia = NvidiaDevices::find(&self.nvidia_cdi_dirs, |f| state.is_own_spec(f));
        plan.nvidia = plan
            .devices
            .iter()
            .map(|d| nvidia.device_of(&d.uuid, d.index))
            .collect();
        Ok(state.prepare(&plan)?)
    }

    async fn unprepare(&self, c: &Claim) -> Result<(), PrepareError> {
        Ok(self.state.lock().await.unprepare(&c.uid)?)
    }

    /// Unprepares each checkpointed claim the API server no longer has (or
    /// has under another UID): deleted while the plugin was down. A claim
    /// that cannot be looked up is kept.
    pub async fn clean_deleted(&self) {
        let prepared: Vec<(String, String, String)> = self
            .state
            .lock()
            .await
            .prepared()
            .map(|(uid, p)| (uid.clone(), p.namespace.clone(), p.name.clone()))
            .collect();
        for (uid, ns, name) in prepared {
            let gone = match self.api.resource_claim(&ns, &name).await {
                Ok(c) => c.metadata.uid != uid,
                Err(ApiError::NotFound { .. }) => true,
                Err(e) => {
                    tracing::warn!(
                        "cannot tell whether claim {ns}/{name} still exists: {}",
                        chain(&e)
                    );
                    false
                }
            };
            if gone {
                match self.state.lock().await.unprepare(&uid) {
                    Ok(()) => tracing::info!("claim {ns}/{name} ({uid}) is gone: unprepared"),
                    Err(e) => tracing::warn!("unpreparing gone claim {uid}: {}", chain(&e)),
                }
            }
        }
    }
}

/// An error and its causes, `a: b: c`.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[tonic::async_trait]
impl DraPlugin for Plugin {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut out = NodePrepareResourcesResponse::default();
        for c in request.into_inner().claims {
            let answer = match self.prepare(&c).await {
                Ok(p) => {
                    tracing::info!("prepared claim {}/{} ({})", c.namespace, c.name, c.uid);
                    NodePrepareResourceResponse {
                        devices: p
                            .devices
                            .into_iter()
                            .map(|d| Device {
                                request_names: d.requests,
                                pool_name: d.pool,
                                device_name: d.device,
                                cdi_device_ids: d.cdi_ids,
                                share_id: None,
                            })
                            .collect(),
                        error: String::new(),
                    }
                }
                Err(e) => {
                    let error = chain(&e);
                    tracing::warn!("claim {}/{} ({}): {error}", c.namespace, c.name, c.uid);
                    NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    }
                }
            };
            out.claims.insert(c.uid.clone(), answer);
        }
        Ok(Response::new(out))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut out = NodeUnprepareResourcesResponse::default();
        for c in request.into_inner().claims {
            let error = match self.unprepare(&c).await {
                Ok(()) => {
                    tracing::info!("unprepared claim {}/{} ({})", c.namespace, c.name, c.uid);
                    String::new()
                }
                Err(e) => {
                    let error = chain(&e);
                    tracing::warn!("unprepare {}/{} ({}): {error}", c.namespace, c.name, c.uid);
                    error
                }
            };
            out.claims
                .insert(c.uid.clone(), NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(out))
    }
}

/// The registration service; it only describes the plugin.
pub struct Registrar {
    pub driver: String,
    pub endpoint: PathBuf,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_owned(),
            name: self.driver.clone(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: vec![DRA_VERSION.to_owned()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            tracing::info!("kubelet registered the plugin {}", self.driver);
        } else {
            tracing::error!("kubelet did not register the plugin: {}", s.error);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// How long a stop waits for calls in flight.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Why the sockets could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{what} socket {path}")]
    Bind {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serving the {what} socket")]
    Serve {
        what: &'static str,
        #[source]
        source: tonic::transport::Error,
    },
}

/// Binds `path` afresh (a socket left by a former run is removed).
fn bind(what: &'static str, path: &Path) -> Result<UnixListener, ServeError> {
    let err = |source| ServeError::Bind {
        what,
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    UnixListener::bind(path).map_err(err)
}

/// Serves DRA on `plugin.endpoint` and registration on `registration`
/// until `shutdown` resolves, then removes both sockets. The DRA socket is
/// up before the registration socket appears, so kubelet never dials a
/// plugin it cannot call.
pub async fn serve(
    plugin: Arc<Plugin>,
    registration: PathBuf,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let dra_path = plugin.endpoint.clone();
    let dra = bind("DRA", &dra_path)?;
    let registrar = Registrar {
        driver: plugin.driver.clone(),
        endpoint: dra_path.clone(),
    };
    let reg = bind("registration", &registration)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let dra_server = tonic::transport::Server::builder()
        .add_service(DraPluginServer::from_arc(plugin))
        .serve_with_incoming_shutdown(UnixListenerStream::new(dra), stopped(stop_rx.clone()));
    let reg_server = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(registrar))
        .serve_with_incoming_shutdown(UnixListenerStream::new(reg), stopped(stop_rx));
    let servers = async { tokio::join!(dra_server, reg_server) };
    // A graceful stop waits for clients to hang up, and kubelet keeps its
    // connections: calls in flight get SHUTDOWN_GRACE, then the rest are
    // dropped.
    let stop = async {
        shutdown.await;
        let _ = stop_tx.send(true);
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let (a, b) = tokio::select! {
        r = servers => r,
        () = stop => (Ok(()), Ok(())),
    };
    let _ = std::fs::remove_file(&registration);
    let _ = std::fs::remove_file(&dra_path);
    a.map_err(|source| ServeError::Serve {
        what: "DRA",
        source,
    })?;
    b.map_err(|source| ServeError::Serve {
        what: "registration",
        source,
    })
}
