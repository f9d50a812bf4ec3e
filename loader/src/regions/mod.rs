//! Shared regions as an operator (and the daemon) sees them: finding them
//! under HAMi's container directory ([`discover`]), telling whether the
//! processes in their slots are alive from the host ([`liveness`]), a
//! snapshot with findings ([`summary`]), the admin operations that write
//! them ([`admin`], one module per operation), opening them safely
//! ([`open`]), and the per-container view of `vgpu top` ([`top`]). The
//! daemon's cache of the regions it keeps open is
//! [`crate::daemon::collect::region_cache`].

pub mod admin;
pub mod discover;
pub mod liveness;
pub mod open;
pub mod summary;
pub mod top;
