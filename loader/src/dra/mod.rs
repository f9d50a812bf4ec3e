//! `vgpu dra-plugin`: a Kubernetes DRA kubelet plugin that hands out
//! shares of this node's GPUs and makes vgpu's hook enforce them.
//!
//! Kubelet calls `NodePrepareResources` with each claim's namespace, name
//! and UID; the plugin reads the claim's allocation from the API server
//! ([`api`]), plans it against the node's GPUs ([`claim`], [`devices`]),
//! writes one CDI spec per claim ([`cdi`]) with a claim-scoped region
//! directory and a checkpoint ([`state`]), and answers the CDI device
//! name, beside NVIDIA's device where the node has NVIDIA's CDI spec
//! ([`nvidia`]). [`server`] serves the gRPC services on kubelet's sockets;
//! [`slice`] publishes the node's GPUs as a ResourceSlice.

pub mod api;
pub mod cdi;
pub mod claim;
pub mod devices;
pub mod nvidia;
mod quantity;
pub mod server;
pub mod slice;
pub mod state;

/// The gRPC code generated from `loader/proto/` by build.rs.
#[expect(clippy::allow_attributes_without_reason, reason = "generated code")]
pub mod pb {
    pub mod dra {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
}
