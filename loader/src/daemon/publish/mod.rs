//! What a scan shows.
//!
//! - [`region_view`] sums each region into the series' view, [`snapshot`]
//!   holds all a scan publishes;
//! - [`metrics`] renders Prometheus text, [`legacy_metrics`] adds HAMi
//!   2.5–2.8's names, [`self_metrics`] the daemon's own build and
//!   `process_*` series;
//! - [`exposition`] derives the classic text format and picks the one a
//!   client asks for.

pub mod exposition;
pub mod legacy_metrics;
pub mod metrics;
pub mod region_view;
pub mod self_metrics;
pub mod snapshot;
