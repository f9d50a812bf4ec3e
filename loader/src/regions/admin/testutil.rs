//! A region file in a temp dir for the admin operations' tests: the test
//! maps it (to set up slots and look at the result, and so that it is a
//! process mapping the file, as a hooked one is) and hands the operations a
//! [`RegionIo`] on its own descriptor, as the commands do.

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

use vgpu_common::proc_identity::ProcIdentity;
use vgpu_common::region::{status, SharedRegion, MAGIC, MAJOR_VERSION};
use vgpu_common::region_io::RegionIo;
use vgpu_common::view::RegionFile;

pub struct Fx {
    _dir: tempfile::TempDir,
    pub map: RegionFile,
    pub io: RegionIo,
}

/// An initialised v1 region at `path`: mapped (as by a hooked process), and
/// a writable [`RegionIo`] on a descriptor of its own, as the daemon and the
/// commands hold one. Shared by the loader's tests that write regions.
pub fn initialised_region(path: &Path) -> (RegionFile, RegionIo) {
    let map = RegionFile::create_or_open(path).unwrap();
    let r = map.region();
    r.major_version.store(MAJOR_VERSION, Relaxed);
    r.initialized_flag.store(MAGIC, Relaxed);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let io = RegionIo::new(file, path, true).unwrap();
    (map, io)
}

pub fn fixture() -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let (map, io) = initialised_region(&dir.path().join("r.cache"));
    map.region().sem[0].store(1, Relaxed);
    Fx { _dir: dir, map, io }
}

impl Fx {
    pub fn r(&self) -> &SharedRegion {
        self.map.region()
    }

    /// Slot `i` in use by `id` at host PID `hostpid`, counting `bytes` on
    /// device 0.
    pub fn slot(&self, i: usize, id: ProcIdentity, hostpid: i32, bytes: u64) {
        let r = self.r();
        let s = &r.procs[i];
        s.pid.store(id.pid, Relaxed);
        s.hostpid.store(hostpid, Relaxed);
        s.pidns.store(id.pidns, Relaxed);
        s.start.store(id.start, Relaxed);
        s.status.store(status::RUNNING, Relaxed);
        s.used[0].data_size.store(bytes, Relaxed);
        s.used[0].total.store(bytes, Relaxed);
        r.proc_num.fetch_max(i as i32 + 1, Relaxed);
    }

    /// Another open file description of the region (for a lock that
    /// conflicts with the operation's).
    pub fn other_fd(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.map.path())
            .unwrap()
    }
}

/// This process: its host PID and its identity with the PID it sees for
/// itself (the last `NSpid`, what a hook records).
pub fn me() -> (i32, ProcIdentity) {
    let host = std::process::id() as i32;
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|l| l.split_ascii_whitespace().last()?.parse().ok())
        .unwrap_or(host);
    (host, ProcIdentity::read_dir(Path::new("/proc/self"), nspid))
}

/// The PID of a process that has exited and been reaped.
pub fn dead_pid() -> i32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    pid
}
