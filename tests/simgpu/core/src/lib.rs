//! The simulated GPU driver core.
