//! The registration protocol on `$SIMGPU_DIR/simgpu.sock`.
//!
//! The client sends one [`Hello`]; the server answers one [`Welcome`] and
//! keeps the connection. The connection closing (exit, SIGKILL) is how the
//! server learns that the process is gone. Fixed 16-byte little-endian
//! messages.

/// Protocol magic.
pub const MAGIC: u32 = 0x5347_5031; // "SGP1"
/// Socket file name inside `SIMGPU_DIR`.
pub const SOCKET: &str = "simgpu.sock";
/// No slot (NVML-only clients, or a full table).
pub const NO_SLOT: u32 = u32::MAX;

/// What kind of client registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `libcuda`: gets a process-table slot.
    Cuda = 1,
    /// `libnvidia-ml` (or a test helper): only keeps the server alive.
    Observer = 2,
}

/// Client → server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Client kind.
    pub kind: Kind,
    /// `getpid()` as the client sees it.
    pub ns_pid: u32,
    /// Inode of the client's PID namespace (0: unknown).
    pub pid_ns: u32,
}

/// Server → client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    /// The client's PID as the server sees it (the host PID).
    pub host_pid: u32,
    /// Slot index, or [`NO_SLOT`].
    pub slot: u32,
    /// The slot's generation.
    pub gen: u32,
}

impl Hello {
    /// Encodes.
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&(self.kind as u32).to_le_bytes());
        b[8..12].copy_from_slice(&self.ns_pid.to_le_bytes());
        b[12..16].copy_from_slice(&self.pid_ns.to_le_bytes());
        b
    }

    /// Decodes; None when malformed.
    pub fn decode(b: &[u8; 16]) -> Option<Hello> {
        if word(b, 0) != MAGIC {
            return None;
        }
        let kind = match word(b, 4) {
            1 => Kind::Cuda,
            2 => Kind::Observer,
            _ => return None,
        };
        Some(Hello {
            kind,
            ns_pid: word(b, 8),
            pid_ns: word(b, 12),
        })
    }
}

impl Welcome {
    /// Encodes.
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.host_pid.to_le_bytes());
        b[8..12].copy_from_slice(&self.slot.to_le_bytes());
        b[12..16].copy_from_slice(&self.gen.to_le_bytes());
        b
    }

    /// Decodes; None when malformed.
    pub fn decode(b: &[u8; 16]) -> Option<Welcome> {
        (word(b, 0) == MAGIC).then(|| Welcome {
            host_pid: word(b, 4),
            slot: word(b, 8),
            gen: word(b, 12),
        })
    }
}

fn word(b: &[u8; 16], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let h = Hello {
            kind: Kind::Cuda,
            ns_pid: 1,
            pid_ns: 4026532000,
        };
        assert_eq!(Hello::decode(&h.encode()), Some(h));
        let w = Welcome {
            host_pid: 1234,
            slot: 3,
            gen: 9,
        };
        assert_eq!(Welcome::decode(&w.encode()), Some(w));
        assert_eq!(Hello::decode(&[0; 16]), None);
    }
}
