//! Will this library load on this node? Checks before anything is
//! written: it is a shared library (`ET_DYN` without a program interpreter:
//! a PIE executable such as `/bin/true` is `ET_DYN` too, but names one), the
//! ELF machine matches the node's, and every `GLIBC_x.y` symbol version the
//! library needs is defined by the node's C library. A library built
//! against a newer glibc would make every dynamically linked process in
//! every GPU container fail at start (it is preloaded).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use object::elf::{FileHeader64, EM_AARCH64, EM_X86_64, ET_DYN, ET_EXEC, ET_REL, PT_INTERP};
use object::read::elf::{FileHeader, ProgramHeader as _};
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
    #[error("{path} is not a shared library ({why}): refusing to install it")]
    NotLibrary { path: PathBuf, why: &'static str },
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

/// Checks that `data` (the bytes of `path`) is a shared library: `ET_DYN`
/// and no `PT_INTERP`. An executable preloaded into every process would
/// break them all, and `--check` must never call one the hook.
pub fn check_shared_library(path: &Path, data: &[u8]) -> Result<(), ElfError> {
    let not_elf = |source| ElfError::NotElf {
        path: path.to_owned(),
        source,
    };
    let header = FileHeader64::<Endianness>::parse(data).map_err(not_elf)?;
    let endian = header.endian().map_err(not_elf)?;
    let refuse = |why| {
        Err(ElfError::NotLibrary {
            path: path.to_owned(),
            why,
        })
    };
    match header.e_type(endian) {
        ET_DYN => {}
        ET_EXEC => return refuse("an executable, ET_EXEC"),
        ET_REL => return refuse("a relocatable object, ET_REL"),
        _ => return refuse("ELF type other than ET_DYN"),
    }
    let segments = header.program_headers(endian, data).map_err(not_elf)?;
    if segments.iter().any(|p| p.p_type(endian) == PT_INTERP) {
        return refuse("an executable: it names a program interpreter, PT_INTERP");
    }
    Ok(())
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

    /// A little-endian ELF64 header of type `e_type` with one program
    /// header of type `p_type` (none when 0).
    fn elf(e_type: u16, p_type: u32) -> Vec<u8> {
        let mut v = vec![0u8; 64 + 56];
        v[..4].copy_from_slice(b"\x7fELF");
        v[4] = 2; // ELFCLASS64
        v[5] = 1; // ELFDATA2LSB
        v[6] = 1; // EV_CURRENT
        v[16..18].copy_from_slice(&e_type.to_le_bytes());
        v[18..20].copy_from_slice(&NODE_MACHINE.to_le_bytes());
        v[20..24].copy_from_slice(&1u32.to_le_bytes());
        v[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        if p_type != 0 {
            v[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
            v[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
            v[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
            v[64..68].copy_from_slice(&p_type.to_le_bytes());
        }
        v
    }

    #[test]
    fn only_a_shared_library_without_an_interpreter_is_one() {
        let p = Path::new("x");
        const PT_LOAD: u32 = 1;
        check_shared_library(p, &elf(ET_DYN, 0)).unwrap();
        check_shared_library(p, &elf(ET_DYN, PT_LOAD)).unwrap();
        for (e_type, p_type) in [(ET_DYN, PT_INTERP), (ET_EXEC, 0), (ET_REL, 0)] {
            let e = check_shared_library(p, &elf(e_type, p_type)).unwrap_err();
            assert!(matches!(e, ElfError::NotLibrary { .. }), "{e}");
            assert!(e.to_string().contains("refusing"), "{e}");
        }
        // This test program is a PIE executable.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let e = check_shared_library(p, &me).unwrap_err();
        assert!(matches!(e, ElfError::NotLibrary { .. }), "{e}");
        assert!(matches!(
            check_shared_library(p, b"#!/bin/sh\n"),
            Err(ElfError::NotElf { .. })
        ));
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
