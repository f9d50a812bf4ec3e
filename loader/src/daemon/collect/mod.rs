//! What a scan reads: nothing here decides or writes.
//!
//! - [`libs`] finds the libcuda files to probe (host and containers);
//! - [`procfs`] reads what `/proc` says;
//! - [`nvml`] samples the driver's own view;
//! - [`region_cache`] keeps the region files open and their last
//!   snapshots (what a region means is `crate::regions`'), [`root_regions`]
//!   opens those found by listing the regions root;
//! - [`container_identity`] names containers from their cgroups,
//!   [`region_owner`] says whose a region is from the kernel's view,
//!   [`pods`] names the pods.

pub mod container_identity;
pub mod libs;
pub mod nvml;
pub mod pods;
pub mod procfs;
pub mod region_cache;
pub mod region_owner;
pub mod root_regions;
