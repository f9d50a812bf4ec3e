//! `vgpu top`'s keyboard: on a terminal, `q` or Ctrl-C quits. The terminal
//! is put in non-canonical mode without echo or signals (Ctrl-C arrives as
//! a byte, so the terminal is restored on the way out, not left raw by a
//! SIGINT) and restored on drop, a panic's unwinding included.

use std::io::{IsTerminal as _, Read as _};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::termios::{
    tcgetattr, tcsetattr, LocalModes, OptionalActions, SpecialCodeIndex, Termios,
};

/// Bytes that quit: `q`, `Q`, Ctrl-C (ETX) and Ctrl-D (EOT).
const QUIT: &[u8] = b"qQ\x03\x04";

/// stdin's keys while `vgpu top` runs; a no-op when stdin is not a terminal.
pub struct Keys {
    /// The terminal's settings before, restored on drop; `None`: not a terminal.
    saved: Option<Termios>,
}

impl Keys {
    /// Takes the keys of stdin when it is a terminal.
    pub fn new() -> Self {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Self { saved: None };
        }
        let Ok(saved) = tcgetattr(&stdin) else {
            return Self { saved: None };
        };
        let mut keys = saved.clone();
        keys.local_modes
            .remove(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG);
        keys.special_codes[SpecialCodeIndex::VMIN] = 1;
        keys.special_codes[SpecialCodeIndex::VTIME] = 0;
        if tcsetattr(&stdin, OptionalActions::Now, &keys).is_err() {
            return Self { saved: None };
        }
        Self { saved: Some(saved) }
    }

    /// Waits `period`, or less when a quitting key comes: `true` then.
    /// Other keys are read and ignored; a terminal that hangs up quits.
    pub fn wait(&mut self, period: Duration) -> bool {
        if self.saved.is_none() {
            std::thread::sleep(period);
            return false;
        }
        let stdin = std::io::stdin();
        let end = Instant::now() + period;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let timeout = Timespec::try_from(left).unwrap_or(Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            });
            let mut fds = [PollFd::new(&stdin, PollFlags::IN)];
            match poll(&mut fds, Some(&timeout)) {
                Ok(0) => return false,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {
                    std::thread::sleep(left);
                    return false;
                }
            }
            let mut buf = [0u8; 64];
            match stdin.lock().read(&mut buf) {
                Ok(0) => return true,
                Ok(n) if buf[..n].iter().any(|b| QUIT.contains(b)) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = tcsetattr(std::io::stdin(), OptionalActions::Now, saved);
        }
    }
}
