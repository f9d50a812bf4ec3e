//! `vgpu daemon`: the always-on eBPF observer of a GPU node. Each scan
//! collects, judges and publishes; whatever it decides to write into a
//! tenant's file is made by [`apply`], the one place that writes there.
//!
//! - [`collect`] reads the facts: the libcuda files to probe, `/proc`, the
//!   driver's NVML view, the region files (kept open by
//!   [`collect::region_cache`]) and whose each is;
//! - [`judge`] decides from them: usage that escaped the hook, each
//!   container's limits and tampering with them, dead slots to free, host
//!   PIDs to fill, utilization;
//! - [`plan`] makes the node's plan of turns and priority holds, on its
//!   own thread, from each scan's roster, and writes each container its
//!   own through [`apply`];
//! - [`publish`] renders what the scan found: Prometheus text in both
//!   exposition formats, HAMi's legacy names, the daemon's own series;
//! - [`state`] keeps the findings across scans and restarts;
//! - [`http`] serves the metrics and probes on the sockets it binds;
//! - [`apply`] makes the writes the judging and publishing decide, each
//!   only while the field still holds what was judged;
//! - [`observer`] ties them together, polled by `cmd/daemon.rs`.
//!
//! See docs/daemon.md.

pub mod apply;
pub mod collect;
pub mod http;
pub mod judge;
pub mod observer;
pub mod plan;
pub mod publish;
pub mod state;
