//! Waiting for changes in the hook directory (`install-hook --watch`):
//! inotify, so a library HAMi's device plugin copies back is moved aside
//! within milliseconds, with the period as a fallback timeout (and the
//! only timer where inotify is unavailable). And for the signal that ends
//! the keeper: SIGTERM and SIGINT are blocked and read from a signalfd, so
//! one that arrives while an install runs is still pending at the next
//! wait, and the keeper (PID 1 of its container, where an unhandled
//! SIGTERM is ignored) restores the directory before it exits.

use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::path::Path;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, CreateFlags, WatchFlags};

/// An inotify watch on one directory.
pub struct DirWatch {
    fd: OwnedFd,
}

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// The directory changed, or the timeout passed.
    Changed,
    /// SIGTERM or SIGINT (its name) arrived: time to restore and exit.
    Stop(&'static str),
}

/// SIGTERM and SIGINT, blocked in this thread and readable from a signalfd.
/// Only for single-threaded commands: another thread would still take them.
pub struct StopSignals {
    fd: OwnedFd,
}

impl StopSignals {
    /// Blocks SIGTERM and SIGINT; from now on they wait here.
    pub fn block() -> std::io::Result<Self> {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set it is given; sigaddset then
        // only adds valid signal numbers to that initialised set.
        let set = unsafe {
            libc::sigemptyset(set.as_mut_ptr());
            libc::sigaddset(set.as_mut_ptr(), libc::SIGTERM);
            libc::sigaddset(set.as_mut_ptr(), libc::SIGINT);
            set.assume_init()
        };
        // SAFETY: `set` is an initialised sigset_t; the old mask is not asked for.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        // SAFETY: -1 asks for a new descriptor; `set` is initialised.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: signalfd returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// The pending stop signal's name, if one arrived.
    fn take(&self) -> Option<&'static str> {
        let mut info = [0u8; size_of::<libc::signalfd_siginfo>()];
        match rustix::io::read(&self.fd, &mut info) {
            Ok(n) if n == info.len() => {}
            _ => return None,
        }
        // ssi_signo is the first field (u32) of signalfd_siginfo.
        let signo = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]);
        Some(if signo == libc::SIGINT as u32 {
            "SIGINT"
        } else {
            "SIGTERM"
        })
    }

    /// Sleeps until `timeout` passed or a stop signal arrived (where there
    /// is no inotify).
    pub fn wait(&self, timeout: Duration) -> std::io::Result<Woke> {
        poll_for(&mut [PollFd::new(&self.fd, PollFlags::IN)], timeout)?;
        Ok(self.take().map_or(Woke::Changed, Woke::Stop))
    }
}

fn poll_for(fds: &mut [PollFd<'_>], timeout: Duration) -> std::io::Result<()> {
    let ts = Timespec {
        tv_sec: timeout.as_secs().try_into().unwrap_or(i64::MAX),
        tv_nsec: timeout.subsec_nanos().into(),
    };
    match poll(fds, Some(&ts)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl DirWatch {
    /// Watches entries of `dir` appearing, disappearing or being written.
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
        inotify::add_watch(
            &fd,
            dir,
            WatchFlags::CREATE
                | WatchFlags::CLOSE_WRITE
                | WatchFlags::MOVED_TO
                | WatchFlags::MOVED_FROM
                | WatchFlags::DELETE,
        )?;
        Ok(Self { fd })
    }

    /// Blocks until something changed in the directory, `timeout` passed
    /// or a stop signal arrived, then drains the pending events (what
    /// changed is read from the directory itself, so an overflowed queue
    /// loses nothing).
    pub fn wait(&self, timeout: Duration, stop: &StopSignals) -> std::io::Result<Woke> {
        poll_for(
            &mut [
                PollFd::new(&self.fd, PollFlags::IN),
                PollFd::new(&stop.fd, PollFlags::IN),
            ],
            timeout,
        )?;
        if let Some(sig) = stop.take() {
            return Ok(Woke::Stop(sig));
        }
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(&self.fd, &mut buf);
        loop {
            match reader.next() {
                Ok(_) => {}
                Err(rustix::io::Errno::AGAIN) => return Ok(Woke::Changed),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_new_file_ends_the_wait_and_silence_times_out() {
        let d = tempfile::tempdir().unwrap();
        let w = DirWatch::new(d.path()).unwrap();
        let stop = StopSignals::block().unwrap();
        let t = Instant::now();
        w.wait(Duration::from_millis(100), &stop).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(90));

        let path = d.path().join("libvgpu.so.v2.10.0");
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            std::fs::write(path, b"x").unwrap();
        });
        let t = Instant::now();
        assert_eq!(
            w.wait(Duration::from_secs(30), &stop).unwrap(),
            Woke::Changed
        );
        assert!(t.elapsed() < Duration::from_secs(10));
        writer.join().unwrap();

        // Blocked in this thread: a SIGTERM sent to it waits for the next
        // wait, and ends it at once.
        // SAFETY: pthread_self is always valid; SIGTERM is blocked here.
        let rc = unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGTERM) };
        assert_eq!(rc, 0);
        let t = Instant::now();
        assert_eq!(
            w.wait(Duration::from_secs(30), &stop).unwrap(),
            Woke::Stop("SIGTERM")
        );
        assert!(t.elapsed() < Duration::from_secs(10));
    }
}
