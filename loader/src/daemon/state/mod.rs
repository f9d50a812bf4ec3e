//! What the daemon keeps across scans and restarts: [`findings`] records
//! what is wrong (and writes the state file), [`retention`] keeps it once
//! resolved and counts violations.

pub mod findings;
pub mod retention;
