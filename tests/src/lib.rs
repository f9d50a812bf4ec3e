//! Helpers for the integration tests (artifact paths, containers).
