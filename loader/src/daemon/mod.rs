//! `vgpu daemon`: the always-on eBPF observer of a GPU node.
//!
//! - [`libs`] finds the libcuda files to probe (host and containers);
//! - [`hostpid`] writes host PIDs into the hook's slots ([`region_cache`]
//!   keeps the region files open and their last snapshots, [`procfs`] reads
//!   what `/proc` says; what a region means is `crate::regions`');
//! - [`reclaim`] frees the slots of processes proven dead;
//! - [`check`] decides when usage escaped the hook, [`findings`] records it,
//!   [`retention`] keeps it once resolved and counts violations;
//! - [`integrity`] knows each container's limits and reports and acts on
//!   tampering; [`node_table`] removes and demotes forged members of the
//!   node's SM tables;
//! - [`nvml`] samples the driver's own view, [`utilization`] turns its
//!   per-process samples into each container's utilization;
//! - [`observer`] ties them together, polled by `cmd/daemon.rs`;
//! - [`launches`] keeps each container's launch counter monotonic;
//! - [`metrics`] renders Prometheus text ([`region_view`] sums each region,
//!   [`region_owner`] says whose it is from the kernel's view, [`pods`]
//!   names the pods, [`legacy_metrics`] adds HAMi 2.5–2.8's names;
//!   [`self_metrics`] the daemon's own build and `process_*` series),
//!   [`exposition`] derives the classic text format and picks the one a
//!   client asks for, [`http`] serves it on the sockets [`listen`] binds.
//!
//! See docs/daemon.md.

pub mod check;
pub mod container_identity;
pub mod exposition;
pub mod findings;
pub mod hostpid;
pub mod http;
pub mod integrity;
pub mod launches;
pub mod legacy_metrics;
pub mod libs;
pub mod listen;
pub mod metrics;
pub mod node_table;
pub mod nvml;
pub mod observer;
pub mod pods;
pub mod procfs;
pub mod reclaim;
pub mod region_cache;
pub mod region_owner;
pub mod region_view;
pub mod retention;
pub mod self_metrics;
pub mod utilization;
