//! What a scan decides from what it collected.
//!
//! - [`check`] decides when usage escaped the hook;
//! - [`integrity`] knows each container's limits and reports and acts on
//!   tampering;
//! - [`reclaim`] frees the slots of processes proven dead;
//! - [`hostpid`] matches slots to processes and fills their host PIDs;
//! - [`utilization`] turns NVML's per-process samples into each
//!   container's utilization;
//! - [`launches`] keeps each container's launch counter monotonic.

pub mod check;
pub mod hostpid;
pub mod integrity;
pub mod launches;
pub mod reclaim;
pub mod utilization;
