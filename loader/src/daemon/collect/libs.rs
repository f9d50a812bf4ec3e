//! Which libcuda files to probe: the host's, and those of running
//! containers (`/proc/<pid>/root/...`), each file once by (dev, inode). A
//! container that bind-mounts the host's driver shares its inode, so one
//! attachment covers it.
//!
//! A container's files are its tenant's: a path is resolved inside the
//! container's root (`openat2` with `RESOLVE_IN_ROOT`, so an absolute
//! symlink such as the usual `libcuda.so.1 -> /usr/lib/…` stays in the
//! container, and no magic link is followed), only a regular file is taken,
//! and it is then read and probed through that descriptor.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::probes::libcuda::{Libcuda, LibcudaError, SONAME};

use crate::daemon::collect::procfs::Procfs;

/// Where the NVIDIA container toolkit and distributions put libcuda.
const DIRS: &[&str] = &[
    "usr/local/nvidia/lib64",
    "usr/local/nvidia/lib",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib64",
    "lib",
    // NVIDIA's GPU operator keeps the driver under this root on the host.
    "run/nvidia/driver/usr/lib/x86_64-linux-gnu",
    "run/nvidia/driver/usr/lib/aarch64-linux-gnu",
    "run/nvidia/driver/usr/lib64",
];

/// Finds libcuda files not seen before.
pub struct LibWatch {
    procfs: Procfs,
    /// `--libcuda`: only these, never scan.
    forced: Option<Vec<PathBuf>>,
    host_done: bool,
    mount_ns: HashSet<u64>,
    pids: HashSet<u32>,
    files: HashSet<(u64, u64)>,
    /// Forced paths found missing, each said once.
    missing: HashSet<PathBuf>,
    /// The node's driver: the forced files, or the host's libcuda (found
    /// from this process, or in the mount namespace of the host's PID 1).
    /// Not a file found in a container, which its tenant could have written.
    drivers: Vec<Libcuda>,
}

impl LibWatch {
    /// Scans the host and containers, or uses `forced` only when non-empty.
    pub fn new(procfs: Procfs, forced: Vec<PathBuf>) -> Self {
        Self {
            procfs,
            forced: (!forced.is_empty()).then_some(forced),
            host_done: false,
            mount_ns: HashSet::new(),
            pids: HashSet::new(),
            files: HashSet::new(),
            missing: HashSet::new(),
            drivers: Vec::new(),
        }
    }

    /// The node's driver files found so far (the forced ones, or the
    /// host's): what a launch must go through to count as GPU work.
    pub fn drivers(&self) -> &[Libcuda] {
        &self.drivers
    }

    /// Libraries found since the last call (each (dev, inode) once).
    /// Errors on forced paths are returned; scanning is best effort.
    pub fn scan(&mut self) -> Result<Vec<Libcuda>, LibcudaError> {
        let mut out = Vec::new();
        if let Some(forced) = &self.forced {
            for p in forced {
                match Libcuda::open(p) {
                    Ok(lib) => {
                        if self.files.insert((lib.dev, lib.ino)) {
                            self.drivers.push(lib.clone());
                            out.push(lib);
                        }
                    }
                    // A named driver that is not there yet (an idle node, a
                    // driver container still installing) is looked for
                    // again at every rescan; the daemon is ready meanwhile.
                    Err(LibcudaError::Read { ref source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        if self.missing.insert(p.clone()) {
                            tracing::warn!("{} is not there yet; looking again", p.display());
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            return Ok(out);
        }
        if !self.host_done {
            self.host_done = true;
            match Libcuda::discover() {
                Ok(lib) => {
                    self.drivers.push(lib.clone());
                    self.push(lib, &mut out);
                }
                Err(e) => tracing::info!("host: {e}"),
            }
        }
        let host_mnt = std::fs::metadata(self.procfs.dir(1).join("ns/mnt"))
            .ok()
            .map(|m| m.ino());
        let live: HashSet<u32> = self.procfs.pids().into_iter().collect();
        self.pids.retain(|p| live.contains(p));
        for pid in live {
            if !self.pids.insert(pid) {
                continue;
            }
            let dir = self.procfs.dir(pid);
            let root = dir.join("root");
            let Ok(root_fd) = rustix::fs::open(
                &root,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                continue;
            };
            if let Ok(md) = std::fs::metadata(dir.join("ns/mnt")) {
                if self.mount_ns.insert(md.ino()) {
                    let host = host_mnt == Some(md.ino());
                    for d in DIRS {
                        let rel = Path::new(d).join(SONAME);
                        self.try_path(&root_fd, &root, &rel, host, &mut out);
                    }
                }
            }
            if let Ok(maps) = std::fs::read_to_string(dir.join("maps")) {
                for p in mapped_libcuda(&maps) {
                    let rel = Path::new(p.trim_start_matches('/'));
                    self.try_path(&root_fd, &root, rel, false, &mut out);
                }
            }
        }
        Ok(out)
    }

    fn push(&mut self, lib: Libcuda, out: &mut Vec<Libcuda>) {
        if self.files.insert((lib.dev, lib.ino)) {
            out.push(lib);
        }
    }

    /// `rel` inside the container whose root is `root_fd` (`root` for
    /// messages): resolved by the kernel inside that root, identified by
    /// its inode, kept open as an `O_PATH` descriptor (which opens
    /// nothing: a FIFO or device there has no effect). `host`: the root is
    /// the host's, so the file is the node's driver.
    fn try_path(
        &mut self,
        root_fd: &std::os::fd::OwnedFd,
        root: &Path,
        rel: &Path,
        host: bool,
        out: &mut Vec<Libcuda>,
    ) {
        let resolve = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);
        let Ok(fd) = rustix::fs::openat2(
            root_fd,
            rel,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            resolve,
        ) else {
            return;
        };
        let Ok(st) = rustix::fs::fstat(&fd) else {
            return;
        };
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return;
        }
        let lib = Libcuda {
            path: root.join(rel),
            dev: st.st_dev,
            ino: st.st_ino,
            fd: Some(Arc::new(fd)),
        };
        let known = |l: &Libcuda| (l.dev, l.ino) == (lib.dev, lib.ino);
        if host && !self.drivers.iter().any(known) {
            self.drivers.push(lib.clone());
        }
        self.push(lib, out);
    }
}

/// Paths of mapped `libcuda.so*` files in a `/proc/<pid>/maps` text.
pub fn mapped_libcuda(maps: &str) -> Vec<&str> {
    let mut v: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            p.starts_with('/')
                && Path::new(p)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libcuda.so"))
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_yield_each_libcuda_once() {
        let maps = "\
7f00-7f01 r--p 00000000 fd:01 123 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
7f01-7f02 r-xp 00001000 fd:01 123 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
7f02-7f03 r--p 00000000 fd:01 124 /usr/lib/x86_64-linux-gnu/libcudart.so.13
7f03-7f04 rw-p 00000000 00:00 0 
7f04-7f05 r--p 00000000 fd:01 125 /opt/x/libcuda.so.1 (deleted)
";
        assert_eq!(
            mapped_libcuda(maps),
            [
                "/opt/x/libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"
            ]
        );
    }

    #[test]
    fn container_paths_resolve_inside_the_container() {
        let dir = tempfile::tempdir().unwrap();
        let proc_dir = dir.path().join("proc/42");
        let ctr = dir.path().join("ctr");
        let lib_dir = ctr.join("usr/lib");
        std::fs::create_dir_all(proc_dir.join("ns")).unwrap();
        std::fs::create_dir_all(&lib_dir).unwrap();
        std::fs::write(proc_dir.join("ns/mnt"), b"").unwrap();
        std::os::unix::fs::symlink(&ctr, proc_dir.join("root")).unwrap();
        // The usual absolute link, which must resolve in the container, not
        // on the host.
        std::fs::write(lib_dir.join("libcuda.so.580"), b"ctr").unwrap();
        std::os::unix::fs::symlink("/usr/lib/libcuda.so.580", lib_dir.join(SONAME)).unwrap();
        // A FIFO where another directory would have libcuda: skipped, and
        // nothing blocks.
        std::fs::create_dir_all(ctr.join("lib64")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            ctr.join("lib64").join(SONAME),
            rustix::fs::FileType::Fifo,
            Mode::RUSR | Mode::WUSR,
            0,
        )
        .unwrap();
        let mut w = LibWatch::new(Procfs::at(dir.path().join("proc")), Vec::new());
        w.host_done = true;
        let got = w.scan().unwrap();
        let want = std::fs::metadata(lib_dir.join("libcuda.so.580")).unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].dev, got[0].ino), (want.dev(), want.ino()));
        assert_eq!(std::fs::read(got[0].io_path()).unwrap(), b"ctr");
    }

    #[test]
    fn only_the_hosts_file_is_the_nodes_driver() {
        let dir = tempfile::tempdir().unwrap();
        // PID 1 (the host's mount namespace) and a container's process,
        // each with its own root and libcuda.
        let mut libs = Vec::new();
        for (pid, root) in [(1, "host"), (42, "ctr")] {
            let p = dir.path().join(format!("proc/{pid}"));
            std::fs::create_dir_all(p.join("ns")).unwrap();
            std::fs::write(p.join("ns/mnt"), b"").unwrap();
            let lib_dir = dir.path().join(root).join("usr/lib/x86_64-linux-gnu");
            std::fs::create_dir_all(&lib_dir).unwrap();
            std::fs::write(lib_dir.join(SONAME), root.as_bytes()).unwrap();
            std::os::unix::fs::symlink(dir.path().join(root), p.join("root")).unwrap();
            libs.push(std::fs::metadata(lib_dir.join(SONAME)).unwrap());
        }
        let mut w = LibWatch::new(Procfs::at(dir.path().join("proc")), Vec::new());
        w.host_done = true;
        assert_eq!(w.scan().unwrap().len(), 2, "both are probed");
        let drivers: Vec<(u64, u64)> = w.drivers().iter().map(|l| (l.dev, l.ino)).collect();
        assert_eq!(
            drivers,
            [(libs[0].dev(), libs[0].ino())],
            "only the host's drives"
        );
    }

    #[test]
    fn forced_paths_are_used_once_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libcuda.so.1");
        std::fs::write(&lib, b"x").unwrap();
        let link = dir.path().join("libcuda.so");
        std::os::unix::fs::symlink(&lib, &link).unwrap();
        let mut w = LibWatch::new(Procfs::at(dir.path()), vec![lib.clone(), link]);
        let got = w.scan().unwrap();
        assert_eq!(got.len(), 1, "same inode twice");
        assert!(w.scan().unwrap().is_empty());
    }

    #[test]
    fn a_forced_path_that_is_not_there_yet_is_found_later() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libcuda.so.1");
        let mut w = LibWatch::new(Procfs::at(dir.path()), vec![lib.clone()]);
        assert!(w.scan().unwrap().is_empty(), "missing: nothing, no error");
        std::fs::write(&lib, b"x").unwrap();
        assert_eq!(w.scan().unwrap().len(), 1, "found at the next scan");
        assert!(w.scan().unwrap().is_empty(), "and only once");
    }
}
