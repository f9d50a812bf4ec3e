//! A **stand-in for kubelet** in front of `vgpu dra-plugin`: the calls
//! kubelet makes on a DRA kubelet plugin's Unix sockets, as a tonic client
//! (plugin registration's `GetInfo` and `NotifyRegistrationStatus`, DRA
//! v1's `NodePrepareResources` and `NodeUnprepareResources`). Nothing of
//! kubelet's own logic (retries, its checkpoint) is reproduced: each test
//! makes the calls kubelet would, in the order it would.
#![expect(
    clippy::expect_used,
    reason = "test helpers panic with a message when the plugin cannot be called"
)]

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// The gRPC clients generated from `loader/proto/` by build.rs.
#[expect(clippy::allow_attributes_without_reason, reason = "generated code")]
pub mod pb {
    pub mod dra {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
}

use pb::dra::dra_plugin_client::DraPluginClient;
use pb::dra::{
    Claim, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodeUnprepareResourceResponse,
    NodeUnprepareResourcesRequest,
};
use pb::registration::registration_client::RegistrationClient;
use pb::registration::{InfoRequest, PluginInfo, RegistrationStatus};

/// The stand-in kubelet: a runtime to make its calls on.
pub struct StandInKubelet {
    rt: tokio::runtime::Runtime,
}

impl Default for StandInKubelet {
    fn default() -> Self {
        Self::new()
    }
}

impl StandInKubelet {
    pub fn new() -> Self {
        Self {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime"),
        }
    }

    /// A gRPC channel over the Unix socket at `path`.
    async fn channel(path: &Path) -> Channel {
        let path: PathBuf = path.to_owned();
        // The URI is required by the API and never dialled.
        Endpoint::from_static("http://[::1]:1")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    tokio::net::UnixStream::connect(path)
                        .await
                        .map(TokioIo::new)
                }
            }))
            .await
            .expect("connect to the plugin's socket")
    }

    /// What the plugin watcher does on finding `registration_socket`:
    /// `GetInfo`, then `NotifyRegistrationStatus` with `registered` (and
    /// `error` when not).
    pub fn register(
        &self,
        registration_socket: &Path,
        registered: bool,
        error: &str,
    ) -> PluginInfo {
        self.rt.block_on(async {
            let mut c = RegistrationClient::new(Self::channel(registration_socket).await);
            let info = c
                .get_info(InfoRequest {})
                .await
                .expect("GetInfo")
                .into_inner();
            c.notify_registration_status(RegistrationStatus {
                plugin_registered: registered,
                error: error.to_owned(),
            })
            .await
            .expect("NotifyRegistrationStatus");
            info
        })
    }

    /// `NodePrepareResources` for `claims` (namespace, name, UID): the
    /// answer per claim UID.
    pub fn prepare(
        &self,
        dra_socket: &Path,
        claims: &[(&str, &str, &str)],
    ) -> std::collections::HashMap<String, NodePrepareResourceResponse> {
        self.rt.block_on(async {
            let mut c = DraPluginClient::new(Self::channel(dra_socket).await);
            c.node_prepare_resources(NodePrepareResourcesRequest {
                claims: claims.iter().map(claim).collect(),
            })
            .await
            .expect("NodePrepareResources")
            .into_inner()
            .claims
        })
    }

    /// `NodeUnprepareResources` for `claims`.
    pub fn unprepare(
        &self,
        dra_socket: &Path,
        claims: &[(&str, &str, &str)],
    ) -> std::collections::HashMap<String, NodeUnprepareResourceResponse> {
        self.rt.block_on(async {
            let mut c = DraPluginClient::new(Self::channel(dra_socket).await);
            c.node_unprepare_resources(NodeUnprepareResourcesRequest {
                claims: claims.iter().map(claim).collect(),
            })
            .await
            .expect("NodeUnprepareResources")
            .into_inner()
            .claims
        })
    }
}

fn claim(&(namespace, name, uid): &(&str, &str, &str)) -> Claim {
    Claim {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
    }
}
