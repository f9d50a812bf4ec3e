//! Errors of the simulator core.

use std::path::PathBuf;

/// Anything that can go wrong inside the simulator core.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Not enough device memory left for a reservation.
    #[error("out of device memory: {requested} bytes requested, {free} free")]
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes free at the time.
        free: u64,
    },
    /// A device index outside the configured devices.
    #[error("no such device {0}")]
    InvalidDevice(u32),
    /// This process holds no slot (an NVML-only client, or the table is full).
    #[error("this process has no slot in the process table")]
    NoSlot,
    /// The server could not be reached or started.
    #[error("simgpu server at {path}: {reason}")]
    Server {
        /// The socket path.
        path: PathBuf,
        /// What happened.
        reason: String,
    },
    /// The state file is missing, short, or has the wrong magic/version.
    #[error("simgpu state file {path}: {reason}")]
    State {
        /// The state file path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A `SIMGPU_*` variable could not be parsed.
    #[error("{var}={value:?}: {reason}")]
    Config {
        /// Variable name.
        var: &'static str,
        /// Its value.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// An I/O error with context.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl SimError {
    /// Wraps an I/O error with a description of what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SimError::Io {
            what: what.into(),
            source,
        }
    }
}
