//! Waiting for changes in the hook directory (`install-hook --watch`):
//! inotify, so a library HAMi's device plugin copies back is moved aside
//! within milliseconds, with the period as a fallback timeout (and the
//! only timer where inotify is unavailable).

use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, CreateFlags, WatchFlags};

/// An inotify watch on one directory.
pub struct DirWatch {
    fd: OwnedFd,
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

    /// Blocks until something changed in the directory or `timeout` passed,
    /// then drains the pending events (what changed is read from the
    /// directory itself, so an overflowed queue loses nothing).
    pub fn wait(&self, timeout: Duration) -> std::io::Result<()> {
        let ts = Timespec {
            tv_sec: timeout.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: timeout.subsec_nanos().into(),
        };
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(&self.fd, &mut buf);
        loop {
            match reader.next() {
                Ok(_) => {}
                Err(rustix::io::Errno::AGAIN) => return Ok(()),
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
        let t = Instant::now();
        w.wait(Duration::from_millis(100)).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(90));

        let path = d.path().join("libvgpu.so.v2.10.0");
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            std::fs::write(path, b"x").unwrap();
        });
        let t = Instant::now();
        w.wait(Duration::from_secs(30)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(10));
        writer.join().unwrap();
    }
}
