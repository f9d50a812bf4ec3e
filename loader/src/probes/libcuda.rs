//! Finding the real `libcuda.so.1` and the file offsets of its entry points.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Libcuda {
    /// Canonical path (symlinks resolved).
    pub path: PathBuf,
    /// `st_dev` of the file.
    pub dev: u64,
    /// `st_ino` of the file.
    pub ino: u64,
}

impl Libcuda {
    /// Canonicalizes `path` and records its inode.
    pub fn open(path: &Path) -> Result<Libcuda, LibcudaError> {
        let read = |source| LibcudaError::Read {
            path: path.to_path_buf(),
            source,
        };
        let path = std::fs::canonicalize(path).map_err(read)?;
        let md = std::fs::metadata(&path).map_err(read)?;
        Ok(Libcuda {
            path,
            dev: md.dev(),
            ino: md.ino(),
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
    let data = std::fs::read(path).map_err(|source| LibcudaError::Read {
        path: path.to_path_buf(),
        source,
    })?;
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
