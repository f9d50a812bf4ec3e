//! Finding the real `libcuda.so.1` and the file offsets of its entry points.

use std::{
    collections::HashMap,
    io::Read as _,
    os::fd::{AsRawFd as _, OwnedFd},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

/// The soname every CUDA program loads.
pub const SONAME: &str = "libcuda.so.1";

/// Where the NVIDIA container toolkit / GPU operator mount the driver, then
/// the distributions' library directories.
const WELL_KNOWN_DIRS: &[&str] = &[
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib64",
    "/lib",
];

/// Finding or reading a libcuda failed.
#[derive(Debug, thiserror::Error)]
pub enum LibcudaError {
    /// Nothing named `libcuda.so.1` was found.
    #[error(
        "no {SONAME} found (looked in LD_LIBRARY_PATH, /usr/local/nvidia/lib64, the ld.so cache \
         and the system library directories); pass --libcuda PATH"
    )]
    NotFound,
    /// The library file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The library is not an ELF file `object` can parse.
    #[error("parsing {path} as ELF: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: object::Error,
    },
}

/// A libcuda file to probe, identified by its inode (one attachment covers
/// every process, in any container, that maps this file).
#[derive(Clone, Debug)]
pub struct Libcuda {
    /// Canonical path (symlinks resolved), or where a container has it.
    pub path: PathBuf,
    /// `st_dev` of the file.
    pub dev: u64,
    /// `st_ino` of the file.
    pub ino: u64,
    /// A descriptor of the very file: it is read and probed through it
    /// (`/proc/self/fd/N`), never by `path`, which a container could point
    /// elsewhere meanwhile.
    pub fd: Option<Arc<OwnedFd>>,
}

/// A libcuda larger than this is not read (the real one is ~100 MB).
pub const MAX_SIZE: u64 = 1 << 30;

impl PartialEq for Libcuda {
    fn eq(&self, o: &Self) -> bool {
        (&self.path, self.dev, self.ino) == (&o.path, o.dev, o.ino)
    }
}

impl Eq for Libcuda {}

impl Libcuda {
    /// The path to read and probe the file by.
    pub fn io_path(&self) -> PathBuf {
        match &self.fd {
            Some(fd) => PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
            None => self.path.clone(),
        }
    }

    /// Canonicalizes `path`, opens it (`O_PATH`, which opens nothing) and
    /// records its inode: it is read and probed through that descriptor.
    pub fn open(path: &Path) -> Result<Libcuda, LibcudaError> {
        let read = |source| LibcudaError::Read {
            path: path.to_path_buf(),
            source,
        };
        let path = std::fs::canonicalize(path).map_err(read)?;
        let fd = rustix::fs::open(
            &path,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| read(e.into()))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| read(e.into()))?;
        Ok(Libcuda {
            path,
            dev: st.st_dev,
            ino: st.st_ino,
            fd: Some(Arc::new(fd)),
        })
    }

    /// Finds `libcuda.so.1` the way the dynamic loader would for a process of
    /// this host: `LD_LIBRARY_PATH`, the NVIDIA driver mount, the ld.so
    /// cache, then the default directories.
    pub fn discover() -> Result<Libcuda, LibcudaError> {
        let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
            .map(|v| std::env::split_paths(&v).collect())
            .unwrap_or_default();
        dirs.extend(WELL_KNOWN_DIRS[..2].iter().map(PathBuf::from));
        let candidates = dirs
            .into_iter()
            .map(|d| d.join(SONAME))
            .chain(ld_so_cache_lookup(SONAME))
            .chain(
                WELL_KNOWN_DIRS[2..]
                    .iter()
                    .map(|d| Path::new(d).join(SONAME)),
            );
        for c in candidates {
            if c.exists() {
                return Libcuda::open(&c);
            }
        }
        Err(LibcudaError::NotFound)
    }
}

/// Asks `ldconfig -p` (the ld.so cache) for `soname` for this architecture.
fn ld_so_cache_lookup(soname: &str) -> Option<PathBuf> {
    let out = std::process::Command::new("ldconfig")
        .arg("-p")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let arch = if cfg!(target_arch = "x86_64") {
        "x86-64"
    } else {
        "AArch64"
    };
    text.lines()
        .filter(|l| l.trim_start().starts_with(soname) && l.contains(arch))
        .find_map(|l| l.split(" => ").nth(1).map(|p| PathBuf::from(p.trim())))
}

/// File offsets of the named functions in an ELF shared object: what a
/// uprobe attaches to. Names not exported are absent from the result.
pub fn symbol_offsets(path: &Path, names: &[&str]) -> Result<HashMap<String, u64>, LibcudaError> {
    let read = |source| LibcudaError::Read {
        path: path.to_path_buf(),
        source,
    };
    // A container's file may be anything: never block on a FIFO, never read
    // more than a driver library's size.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(read)?;
    let md = file.metadata().map_err(read)?;
    if !md.is_file() || md.len() > MAX_SIZE {
        return Err(read(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a regular file of at most {MAX_SIZE} bytes"),
        )));
    }
    let mut data = Vec::new();
    (&mut file)
        .take(MAX_SIZE)
        .read_to_end(&mut data)
        .map_err(read)?;
    let file = object::File::parse(&*data).map_err(|source| LibcudaError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    let mut found = HashMap::new();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        let Ok(name) = sym.name() else { continue };
        if sym.address() == 0 || !sym.is_definition() || !names.contains(&name) {
            continue;
        }
        if found.contains_key(name) {
            continue;
        }
        let Some(section) = sym
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
        else {
            continue;
        };
        let Some((sec_off, _)) = section.file_range() else {
            continue;
        };
        let Some(off) = sym
            .address()
            .checked_sub(section.address())
            .and_then(|o| o.checked_add(sec_off))
        else {
            continue;
        };
        found.insert(name.to_owned(), off);
    }
    Ok(found)
}
