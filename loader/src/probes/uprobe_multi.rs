//! uprobe_multi links (Linux 6.6+): one link per program and file carries
//! every offset and cookie, and closing it costs one grace period for all of
//! them, where perf-event uprobes are released one at a time (about 0.1 s
//! each). aya 0.14 can neither load a program with the attach type these links
//! require nor create them, so this module does both with `bpf(2)`: it parses
//! the same object with aya-obj, points its map references at the maps aya
//! already created, and loads the two programs itself.

use std::{
    collections::HashSet,
    ffi::CString,
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
};

use aya::{maps::Map, Ebpf};
use aya_obj::generated::{
    bpf_attach_type::BPF_TRACE_UPROBE_MULTI, bpf_attr, bpf_cmd, bpf_insn,
    bpf_prog_type::BPF_PROG_TYPE_KPROBE, BPF_F_UPROBE_MULTI_RETURN,
};

/// The first kernel with uprobe_multi links.
pub const MIN_KERNEL: (u8, u8) = (6, 6);

/// Loading the programs for, or creating, uprobe_multi links failed.
#[derive(Debug, thiserror::Error)]
pub enum MultiError {
    /// The embedded object did not parse.
    #[error("parsing the eBPF object: {0}")]
    Parse(#[from] aya_obj::ParseError),
    /// Its map or call references could not be resolved.
    #[error("relocating the eBPF object: {0}")]
    Relocate(#[from] aya_obj::relocation::EbpfRelocationError),
    /// A map the programs use was not created by aya.
    #[error("map {0} was not created")]
    MissingMap(String),
    /// A map of a type this module does not expect in vgpu's object.
    #[error("map {0} has a type the uprobe_multi loader does not handle")]
    MapType(String),
    /// The object lacks a program.
    #[error("the eBPF object has no program {0}")]
    MissingProgram(&'static str),
    /// The kernel refused the program.
    #[error("loading {name} for uprobe_multi: {source}{log}")]
    Load {
        /// The program.
        name: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
        /// The verifier's last words, if it gave any (with a leading separator).
        log: String,
    },
    /// The kernel refused the link.
    #[error("uprobe_multi link on {path}: {source}")]
    Link {
        /// The probed file.
        path: PathBuf,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// A path with a NUL byte.
    #[error("path {0} contains a NUL byte")]
    Path(PathBuf),
}

impl MultiError {
    /// The errno of a refused link, to tell "this kernel has no
    /// uprobe_multi" (EINVAL, EOPNOTSUPP, ENOSYS) from a real failure.
    pub fn link_errno(&self) -> Option<i32> {
        match self {
            MultiError::Link { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// The two programs, loaded with `expected_attach_type = BPF_TRACE_UPROBE_MULTI`.
#[derive(Debug)]
pub struct MultiPrograms {
    entry: OwnedFd,
    ret: OwnedFd,
}

impl MultiPrograms {
    /// Loads programs `entry` and `ret` of `elf` against the maps of `ebpf`
    /// (call before anything takes a map out of it).
    pub fn load(
        ebpf: &Ebpf,
        elf: &[u8],
        entry: &'static str,
        ret: &'static str,
    ) -> Result<MultiPrograms, MultiError> {
        let mut obj = aya_obj::Object::parse(elf)?;
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
        let objs: Vec<(String, aya_obj::Map)> = obj.maps.drain().collect();
        let mut fds: Vec<(&str, RawFd, &aya_obj::Map)> = Vec::with_capacity(objs.len());
        for (name, m) in &objs {
            let (_, live) = ebpf
                .maps()
                .find(|(n, _)| n == name)
                .ok_or_else(|| MultiError::MissingMap(name.clone()))?;
            fds.push((name, map_fd(name, live)?, m));
        }
        obj.relocate_maps(fds.into_iter(), &text_sections)?;
        obj.relocate_calls(&text_sections)?;
        let load = |name: &'static str| -> Result<OwnedFd, MultiError> {
            let prog = obj
                .programs
                .get(name)
                .ok_or(MultiError::MissingProgram(name))?;
            let func = obj
                .functions
                .get(&prog.function_key())
                .ok_or(MultiError::MissingProgram(name))?;
            prog_load(name, &func.instructions, &prog.license)
        };
        Ok(MultiPrograms {
            entry: load(entry)?,
            ret: load(ret)?,
        })
    }

    /// One link of the entry program on `offsets` of `path`, each point's
    /// cookie the one at the same index.
    pub fn attach_entry(
        &self,
        path: &Path,
        offsets: &[u64],
        cookies: &[u64],
    ) -> Result<OwnedFd, MultiError> {
        link_create(self.entry.as_fd(), path, offsets, cookies, 0)
    }

    /// One link of the return program on `offsets` of `path`.
    pub fn attach_return(
        &self,
        path: &Path,
        offsets: &[u64],
        cookies: &[u64],
    ) -> Result<OwnedFd, MultiError> {
        link_create(
            self.ret.as_fd(),
            path,
            offsets,
            cookies,
            BPF_F_UPROBE_MULTI_RETURN,
        )
    }
}

/// Whether the running kernel is new enough to try (a backport may still say
/// no at the first link, and the caller falls back then).
pub fn kernel_may_support() -> bool {
    match aya::util::KernelVersion::current() {
        Ok(v) => v >= aya::util::KernelVersion::new(MIN_KERNEL.0, MIN_KERNEL.1, 0),
        Err(_) => false,
    }
}

/// The fd of a map aya created; only the map types vgpu's object (and
/// aya-log's) use.
fn map_fd(name: &str, map: &Map) -> Result<RawFd, MultiError> {
    let data = match map {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::RingBuf(d)
        | Map::PerfEventArray(d) => d,
        _ => return Err(MultiError::MapType(name.to_owned())),
    };
    Ok(data.fd().as_fd().as_raw_fd())
}

/// `bpf(cmd, attr)`, returning the new fd.
fn bpf_fd(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    // SAFETY: attr is a valid, initialized bpf_attr of the size passed; every
    // pointer it carries points into memory the caller keeps alive for the
    // duration of the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(rc).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A zeroed `bpf_attr`, as the kernel requires for the fields a command does
/// not use.
fn zeroed_attr() -> bpf_attr {
    // SAFETY: bpf_attr is a C union of integers and arrays of integers; all
    // zeros is a valid value of each member.
    unsafe { std::mem::zeroed() }
}

fn prog_load(
    name: &'static str,
    insns: &[bpf_insn],
    license: &CString,
) -> Result<OwnedFd, MultiError> {
    let mut log = vec![0u8; 0];
    let attempt = |with_log: bool, log: &mut Vec<u8>| {
        let mut attr = zeroed_attr();
        // SAFETY: writing the BPF_PROG_LOAD member of a zeroed union.
        let a = unsafe { &mut attr.__bindgen_anon_3 };
        a.prog_type = BPF_PROG_TYPE_KPROBE as u32;
        a.expected_attach_type = BPF_TRACE_UPROBE_MULTI as u32;
        a.insn_cnt = u32::try_from(insns.len()).unwrap_or(u32::MAX);
        a.insns = insns.as_ptr() as u64;
        a.license = license.as_ptr() as u64;
        for (d, s) in a.prog_name.iter_mut().zip(name.bytes().take(15)) {
            *d = s as libc::c_char;
        }
        if with_log {
            *log = vec![0u8; 1 << 20];
            a.log_level = 1;
            a.log_buf = log.as_mut_ptr() as u64;
            a.log_size = u32::try_from(log.len()).unwrap_or(u32::MAX);
        }
        bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr)
    };
    match attempt(false, &mut log) {
        Ok(fd) => Ok(fd),
        Err(first) => {
            // Again with the verifier's log, only to say why.
            let again = attempt(true, &mut log);
            let text = String::from_utf8_lossy(&log);
            let text = text.trim_end_matches('\0').trim();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            let log = if tail.is_empty() {
                String::new()
            } else {
                format!(
                    "; verifier: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
                )
            };
            match again {
                Ok(fd) => Ok(fd),
                Err(_) => Err(MultiError::Load {
                    name,
                    source: first,
                    log,
                }),
            }
        }
    }
}

fn link_create(
    prog: BorrowedFd<'_>,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    flags: u32,
) -> Result<OwnedFd, MultiError> {
    use std::os::unix::ffi::OsStrExt;
    let c_path =
        CString::new(path.as_os_str().as_bytes()).map_err(|_| MultiError::Path(path.to_owned()))?;
    let cnt = offsets.len().min(cookies.len());
    let mut attr = zeroed_attr();
    // SAFETY: writing the BPF_LINK_CREATE member of a zeroed union, and its
    // uprobe_multi member.
    let l = unsafe { &mut attr.link_create };
    l.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    l.attach_type = BPF_TRACE_UPROBE_MULTI as u32;
    // SAFETY: as above, the uprobe_multi member of the zeroed inner union.
    let m = unsafe { &mut l.__bindgen_anon_3.uprobe_multi };
    m.path = c_path.as_ptr() as u64;
    m.offsets = offsets.as_ptr() as u64;
    m.cookies = cookies.as_ptr() as u64;
    m.cnt = u32::try_from(cnt).unwrap_or(u32::MAX);
    m.flags = flags;
    // pid 0: every process that maps the file.
    m.pid = 0;
    bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut attr).map_err(|source| MultiError::Link {
        path: path.to_owned(),
        source,
    })
}
