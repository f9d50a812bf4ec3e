//! Errors of the probe layer, with the "missing privilege" case singled out
//! so the CLI can say it in one sentence.

use super::{btf::BtfError, libcuda::LibcudaError};

/// Loading, attaching or reading the probes failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The kernel refused for lack of privilege (EPERM / EACCES).
    #[error("needs root or CAP_BPF+CAP_PERFMON: {action} failed with {errno}")]
    Permission {
        /// What was being done.
        action: &'static str,
        /// `EPERM` or `EACCES`.
        errno: &'static str,
    },
    /// The kernel lacks a feature the probes need.
    #[error("{action} failed: the kernel lacks {what} ({source})")]
    Unsupported {
        /// What was being done.
        action: &'static str,
        /// What is missing.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Anything else from aya while loading or attaching.
    #[error("{action} failed: {source}")]
    Aya {
        /// What was being done.
        action: &'static str,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The binary was built with `AYA_BUILD_SKIP=1`: no eBPF object inside.
    #[error("this vgpu binary was built without its eBPF programs (AYA_BUILD_SKIP=1); rebuild it")]
    NoObject,
    /// The object lacks a program it should have.
    #[error("the eBPF object has no program {0}")]
    MissingProgram(&'static str),
    /// The object lacks a map it should have.
    #[error("the eBPF object has no map {0}")]
    MissingMap(&'static str),
    /// Reading a map failed.
    #[error("reading map {0}: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
    /// Finding or parsing libcuda failed.
    #[error(transparent)]
    Libcuda(#[from] LibcudaError),
    /// Reading the kernel's BTF failed.
    #[error(transparent)]
    Btf(#[from] BtfError),
}

impl ProbeError {
    /// Wraps an aya error, recognizing missing privileges and kernel features
    /// anywhere in its source chain.
    pub(crate) fn classify<E>(action: &'static str, e: E) -> ProbeError
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        // The verifier's own words, which the classes below may not keep.
        tracing::debug!("{action}: {e}");
        match errno_in_chain(&e) {
            Some(libc::EPERM) => ProbeError::Permission {
                action,
                errno: "EPERM",
            },
            Some(libc::EACCES) => ProbeError::Permission {
                action,
                errno: "EACCES",
            },
            Some(libc::ENOSYS) => ProbeError::Unsupported {
                action,
                what: "the bpf() system call",
                source: Box::new(e),
            },
            Some(libc::ENOENT) if action == "attaching uprobes" => ProbeError::Unsupported {
                action,
                what: "uprobe support (CONFIG_UPROBE_EVENTS) or the target file",
                source: Box::new(e),
            },
            _ => ProbeError::Aya {
                action,
                source: Box::new(e),
            },
        }
    }
}

fn errno_in_chain(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(code) = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
        {
            return Some(code);
        }
        cur = err.source();
    }
    // Some aya errors keep the io::Error in a field that is not a `source`.
    let text = e.to_string();
    [
        (libc::EPERM, "(os error 1)"),
        (libc::EACCES, "(os error 13)"),
    ]
    .into_iter()
    .find(|(_, s)| text.contains(s))
    .map(|(c, _)| c)
}
