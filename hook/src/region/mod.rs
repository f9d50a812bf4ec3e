//! The HAMi v1.2 shared region as the hook uses it: attach/create and
//! initialise (`attach`), slot registration and reclaim (`slots`), and the
//! lock-free usage counters and limits (`usage`; the limit check that
//! refuses allocations is `crate::memory::limit`).

pub mod attach;
pub mod shadow;
pub mod slots;
pub mod usage;

pub use attach::{AttachError, Attachment};
pub use usage::Kind;
