//! The region lock: an open-file-description (OFD) record lock on the
//! region file's first `REGION_SIZE` bytes.
//!
//! HAMi-core guards slot registration with a `sem_t` inside the mapping; a
//! holder killed by SIGKILL leaves it taken and the container wedges until a
//! 10 s `sem_timedwait` times out and the recorded owner is found dead
//! (`lock_shrreg`, <https://github.com/Project-HAMi/HAMi-core>). The kernel drops an OFD lock the
//! moment its holder's file description closes, which includes death at any
//! instant. The range is the one HAMi's `lockf` creation lock uses, and OFD
//! and POSIX record locks conflict, so a HAMi-core process creating the same
//! region is excluded too.
//!
//! OFD locks belong to the open file description, not the thread: two
//! threads locking through the same `File` do not exclude each other.
//! Callers serialise their own threads (the hook holds a mutex around it).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::region::REGION_SIZE;

/// Held lock; released on drop.
#[derive(Debug)]
pub struct RegionLockGuard<'a> {
    file: &'a File,
}

fn flock(kind: libc::c_short) -> libc::flock {
    // SAFETY: `flock` is a plain C struct; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = REGION_SIZE as libc::off_t;
    fl
}

fn fcntl_lock(file: &File, cmd: libc::c_int, fl: &mut libc::flock) -> io::Result<()> {
    // SAFETY: the fd is open for the lifetime of `file`; `fl` is a valid,
    // exclusive pointer to a `flock` for the duration of the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, fl as *mut libc::flock) };
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Tries once to take the lock without blocking.
pub fn try_lock(file: &File) -> io::Result<Option<RegionLockGuard<'_>>> {
    let mut fl = flock(libc::F_WRLCK as libc::c_short);
    match fcntl_lock(file, libc::F_OFD_SETLK, &mut fl) {
        Ok(()) => Ok(Some(RegionLockGuard { file })),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Takes the lock, polling for at most `timeout`. `Ok(None)` on timeout: a
/// live holder is stuck, and the caller decides what to do rather than hang.
pub fn lock_timeout(file: &File, timeout: Duration) -> io::Result<Option<RegionLockGuard<'_>>> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(50);
    loop {
        if let Some(guard) = try_lock(file)? {
            return Ok(Some(guard));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// Whether some open file description holds the lock now. For OFD locks the
/// kernel reports no PID; the region's `owner_pid` names the holder.
pub fn is_locked(file: &File) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK as libc::c_short);
    fcntl_lock(file, libc::F_OFD_GETLK, &mut fl)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

impl Drop for RegionLockGuard<'_> {
    fn drop(&mut self) {
        let mut fl = flock(libc::F_UNLCK as libc::c_short);
        // An unlock can only fail if the fd is gone, and then the kernel has
        // already dropped the lock.
        let _ = fcntl_lock(self.file, libc::F_OFD_SETLK, &mut fl);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    fn open(path: &std::path::Path) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap()
    }

    #[test]
    fn second_description_is_excluded_until_release() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        let a = open(&path);
        let b = open(&path);
        let guard = try_lock(&a).unwrap().expect("free lock");
        assert!(try_lock(&b).unwrap().is_none());
        assert!(is_locked(&b).unwrap());
        drop(guard);
        assert!(!is_locked(&b).unwrap());
        assert!(try_lock(&b).unwrap().is_some());
    }

    #[test]
    fn closing_the_file_releases_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        let b = open(&path);
        {
            let a = open(&path);
            let guard = try_lock(&a).unwrap().expect("free lock");
            std::mem::forget(guard); // as if the holder died mid-section
            assert!(lock_timeout(&b, Duration::from_millis(20))
                .unwrap()
                .is_none());
        }
        assert!(lock_timeout(&b, Duration::from_millis(200))
            .unwrap()
            .is_some());
    }
}
