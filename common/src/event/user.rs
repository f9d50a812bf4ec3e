//! Host-side helpers for the event records: `aya::Pod` impls so the loader
//! can use them as map keys/values and globals, and small accessors.

use super::{
    AllocKey, CallEvent, Caller, Config, Func, KernelOffsets, LaunchKey, Pending, PendingKey,
    ProcCounters,
};

// SAFETY: each type is `#[repr(C)]`, `Copy`, made only of fixed-width integers
// and arrays of them, with every padding byte an explicit field (see the size
// asserts in `event.rs`), so any bit pattern is a valid value.
unsafe impl aya::Pod for KernelOffsets {}
// SAFETY: as above.
unsafe impl aya::Pod for Config {}
// SAFETY: as above.
unsafe impl aya::Pod for Caller {}
// SAFETY: as above.
unsafe impl aya::Pod for CallEvent {}
// SAFETY: as above.
unsafe impl aya::Pod for PendingKey {}
// SAFETY: as above.
unsafe impl aya::Pod for Pending {}
// SAFETY: as above.
unsafe impl aya::Pod for LaunchKey {}
// SAFETY: as above.
unsafe impl aya::Pod for AllocKey {}
// SAFETY: as above.
unsafe impl aya::Pod for ProcCounters {}

impl Caller {
    /// `comm` up to its first NUL, lossily decoded.
    pub fn comm_str(&self) -> String {
        let end = self
            .comm
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.comm.len());
        String::from_utf8_lossy(&self.comm[..end]).into_owned()
    }
}

impl CallEvent {
    /// Reads an event from ring-buffer bytes; `None` if the record is short.
    pub fn from_bytes(bytes: &[u8]) -> Option<CallEvent> {
        if bytes.len() < core::mem::size_of::<CallEvent>() {
            return None;
        }
        // SAFETY: the length was checked; `CallEvent` is plain old data (any
        // bit pattern is valid) and `read_unaligned` copes with the buffer's
        // alignment.
        Some(unsafe { bytes.as_ptr().cast::<CallEvent>().read_unaligned() })
    }

    /// The entry point, if the id is known.
    pub fn func(&self) -> Option<Func> {
        Func::from_id(self.func)
    }
}
