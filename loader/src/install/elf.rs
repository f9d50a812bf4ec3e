//! Will this library load on this node? Two checks before anything is
//! written: the ELF machine matches the node's, and every `GLIBC_x.y`
//! symbol version the library needs is defined by the node's C library.
//! A library built against a newer glibc would make every dynamically
//! linked process in every GPU container fail at start (it is preloaded).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use object::elf::{FileHeader64, EM_AARCH64, EM_X86_64};
use object::read::elf::FileHeader;
use object::{Endianness, ReadRef};

/// Why the library does not fit the node.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("{path} is not a 64-bit ELF shared library: {source}")]
    NotElf {
        path: PathBuf,
        #[source]
        source: object::read::Error,
    },
    #[error("{path} is built for {found}, but this node is {node}: refusing to install it")]
    Arch {
        path: PathBuf,
        found: String,
        node: &'static str,
    },
    #[error(
        "{path} needs {needs}, but the node's C library {libc} provides only up to {has}: \
         refusing to install it (build the hook against an older glibc)"
    )]
    Glibc {
        path: PathBuf,
        needs: String,
        libc: PathBuf,
        has: String,
    },
    #[error("cannot read the node's C library {path}: {source}")]
    LibcRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the node's C library {path}: {source}")]
    LibcParse {
        path: PathBuf,
        #[source]
        source: object::read::Error,
    },
    #[error("cannot read the node's C library {path}: it defines no GLIBC_ symbol versions")]
    LibcVersions { path: PathBuf },
}

const NODE_MACHINE: u16 = if cfg!(target_arch = "aarch64") {
    EM_AARCH64
} else {
    EM_X86_64
};

fn machine_name(m: u16) -> String {
    match m {
        EM_X86_64 => "x86-64".into(),
        EM_AARCH64 => "aarch64".into(),
        other => format!("ELF machine {other}"),
    }
}

/// Checks `data` (the bytes of `path`) against the node and its C library.
pub fn check_compatible(path: &Path, data: &[u8], libc: &Path) -> Result<(), ElfError> {
    let not_elf = |source| ElfError::NotElf {
        path: path.to_owned(),
        source,
    };
    let header = FileHeader64::<Endianness>::parse(data).map_err(not_elf)?;
    let endian = header.endian().map_err(not_elf)?;
    let machine = header.e_machine.get(endian);
    if machine != NODE_MACHINE {
        return Err(ElfError::Arch {
            path: path.to_owned(),
            found: machine_name(machine),
            node: if NODE_MACHINE == EM_X86_64 {
                "x86-64"
            } else {
                "aarch64"
            },
        });
    }
    let needs = glibc_versions(header, endian, data, Which::Needed).map_err(not_elf)?;
    let libc_data = std::fs::read(libc).map_err(|source| ElfError::LibcRead {
        path: libc.to_owned(),
        source,
    })?;
    let libc_err = |source| ElfError::LibcParse {
        path: libc.to_owned(),
        source,
    };
    let libc_header = FileHeader64::<Endianness>::parse(&*libc_data).map_err(libc_err)?;
    let libc_endian = libc_header.endian().map_err(libc_err)?;
    let has =
        glibc_versions(libc_header, libc_endian, &*libc_data, Which::Defined).map_err(libc_err)?;
    let Some(max_has) = has.iter().max().copied() else {
        return Err(ElfError::LibcVersions {
            path: libc.to_owned(),
        });
    };
    if let Some(worst) = needs.iter().max().filter(|n| **n > max_has) {
        return Err(ElfError::Glibc {
            path: path.to_owned(),
            needs: fmt_version(*worst),
            libc: libc.to_owned(),
            has: fmt_version(max_has),
        });
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Which {
    Needed,
    Defined,
}

/// `GLIBC_2.34` → (2, 34, 0).
type GlibcVersion = (u32, u32, u32);

fn parse_glibc(name: &[u8]) -> Option<GlibcVersion> {
    let s = std::str::from_utf8(name).ok()?.strip_prefix("GLIBC_")?;
    let mut it = s.split('.').map(|p| p.parse::<u32>().ok());
    Some((
        it.next()??,
        it.next().flatten().unwrap_or(0),
        it.next().flatten().unwrap_or(0),
    ))
}

fn fmt_version(v: GlibcVersion) -> String {
    if v.2 == 0 {
        format!("GLIBC_{}.{}", v.0, v.1)
    } else {
        format!("GLIBC_{}.{}.{}", v.0, v.1, v.2)
    }
}

fn glibc_versions<'d, R: ReadRef<'d>>(
    header: &FileHeader64<Endianness>,
    endian: Endianness,
    data: R,
    which: Which,
) -> object::read::Result<BTreeSet<GlibcVersion>> {
    let sections = header.sections(endian, data)?;
    let mut out = BTreeSet::new();
    match which {
        Which::Needed => {
            if let Some((mut it, link)) = sections.gnu_verneed(endian, data)? {
                let strings = sections.strings(endian, data, link)?;
                while let Some((_, mut aux)) = it.next()? {
                    while let Some(a) = aux.next()? {
                        out.extend(parse_glibc(a.name(endian, strings)?));
                    }
                }
            }
        }
        Which::Defined => {
            if let Some((mut it, link)) = sections.gnu_verdef(endian, data)? {
                let strings = sections.strings(endian, data, link)?;
                while let Some((_, mut aux)) = it.next()? {
                    if let Some(a) = aux.next()? {
                        out.extend(parse_glibc(a.name(endian, strings)?));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The C library this process runs on, from `/proc/self/maps`.
pub fn running_libc() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libc.so.6"))
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_libc() -> PathBuf {
        running_libc().expect("this test process maps libc.so.6")
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_glibc(b"GLIBC_2.34"), Some((2, 34, 0)));
        assert_eq!(parse_glibc(b"GLIBC_2.2.5"), Some((2, 2, 5)));
        assert_eq!(parse_glibc(b"GLIBC_PRIVATE"), None);
        assert_eq!(parse_glibc(b"GCC_3.0"), None);
        assert!(parse_glibc(b"GLIBC_2.2.5") < parse_glibc(b"GLIBC_2.34"));
    }

    #[test]
    fn libc_fits_itself_and_wrong_machine_is_refused() {
        let libc = own_libc();
        let data = std::fs::read(&libc).unwrap();
        check_compatible(&libc, &data, &libc).unwrap();
        let mut other = data.clone();
        // e_machine is the u16 at offset 18 of the ELF header.
        other[18..20].copy_from_slice(&183u16.to_le_bytes());
        if NODE_MACHINE == EM_AARCH64 {
            other[18..20].copy_from_slice(&62u16.to_le_bytes());
        }
        let err = check_compatible(Path::new("x.so"), &other, &libc).unwrap_err();
        assert!(matches!(err, ElfError::Arch { .. }), "{err}");
        assert!(err.to_string().contains("refusing"));
        let err = check_compatible(Path::new("t.txt"), b"not an elf", &libc).unwrap_err();
        assert!(matches!(err, ElfError::NotElf { .. }), "{err}");
    }
}
