//! Is this library the hook, and will it load on this node? Checks before
//! anything is written: it is a shared library (`ET_DYN` without a program
//! interpreter: a PIE executable such as `/bin/true` is `ET_DYN` too, but
//! names one), it exports the hook's entry points ([`HOOK_EXPORTS`]), the
//! ELF machine matches the node's, and every `GLIBC_x.y` symbol version the
//! library needs is defined by the node's C library. A library built
//! against a newer glibc would make every dynamically linked process in
//! every GPU container fail at start (it is preloaded).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use object::elf::{FileHeader64, EM_AARCH64, EM_X86_64, ET_DYN, ET_EXEC, ET_REL, PT_INTERP};
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader as _};
use object::{Endianness, Object as _, ObjectSymbol as _, ReadRef, SymbolKind};

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
    #[error(
        "{path} is not vgpu's hook: it does not export {}: refusing to install it",
        missing.join(", ")
    )]
    NotHook {
        path: PathBuf,
        missing: Vec<&'static str>,
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

/// The exports that mark a library as vgpu's hook: driver entry points it
/// must interpose to hold a process to its limits (allocation, free, the
/// memory figures, a launch, and `cuGetProcAddress`, through which the CUDA
/// runtime resolves all the others), NVML's memory figures, and `dlsym`,
/// through which a program that `dlopen`s the driver finds them. Together
/// no other library defines them: libcuda defines no NVML function and no
/// `dlsym`, libnvidia-ml no CUDA function. A check against a wrong file, not
/// against an impostor: any library can define these names.
pub const HOOK_EXPORTS: &[&str] = &[
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuLaunchKernel",
    "nvmlDeviceGetMemoryInfo",
    "dlsym",
];

/// The names of [`HOOK_EXPORTS`] that the shared library `data` does not
/// define as functions in its dynamic symbol table, in that list's order.
pub fn missing_hook_exports(data: &[u8]) -> object::read::Result<Vec<&'static str>> {
    let file = ElfFile64::<Endianness>::parse(data)?;
    let defined: BTreeSet<&[u8]> = file
        .dynamic_symbols()
        .filter(|s| !s.is_undefined() && s.is_global() && s.kind() == SymbolKind::Text)
        .filter_map(|s| s.name_bytes().ok())
        .collect();
    Ok(HOOK_EXPORTS
        .iter()
        .copied()
        .filter(|name| !defined.contains(name.as_bytes()))
        .collect())
}

/// Checks that `data` (the bytes of `path`, a shared library) defines every
/// one of [`HOOK_EXPORTS`].
pub fn check_hook(path: &Path, data: &[u8]) -> Result<(), ElfError> {
    let missing = missing_hook_exports(data).map_err(|source| ElfError::NotElf {
        path: path.to_owned(),
        source,
    })?;
    if missing.is_empty() {
        return Ok(());
    }
    Err(ElfError::NotHook {
        path: path.to_owned(),
        missing,
    })
}

/// Why a library is not vgpu's hook (what `--check` says of the one in
/// place).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotHook {
    #[error("it is not a 64-bit ELF shared library")]
    NotElf,
    #[error("it is not a shared library ({0})")]
    NotLibrary(&'static str),
    #[error("it does not export {}", .0.join(", "))]
    Missing(Vec<&'static str>),
}

/// Why `data` is not vgpu's hook; `None` when it is one.
pub fn why_not_hook(data: &[u8]) -> Option<NotHook> {
    match check_shared_library(Path::new(""), data) {
        Ok(()) => {}
        Err(ElfError::NotLibrary { why, .. }) => return Some(NotHook::NotLibrary(why)),
        Err(_) => return Some(NotHook::NotElf),
    }
    match missing_hook_exports(data) {
        Ok(missing) if missing.is_empty() => None,
        Ok(missing) => Some(NotHook::Missing(missing)),
        Err(_) => Some(NotHook::NotElf),
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

    const GLOBAL_FUNC: u8 = 0x12; // STB_GLOBAL << 4 | STT_FUNC
    const WEAK_FUNC: u8 = 0x22; // STB_WEAK << 4 | STT_FUNC
    const LOCAL_FUNC: u8 = 0x02; // STB_LOCAL << 4 | STT_FUNC
    const GLOBAL_OBJECT: u8 = 0x11; // STB_GLOBAL << 4 | STT_OBJECT

    /// A shared library whose dynamic symbol table holds `symbols`: (name,
    /// `st_info`, defined), in four sections: none, `.dynsym`, `.dynstr`,
    /// `.shstrtab`.
    fn library(symbols: &[(&str, u8, bool)]) -> Vec<u8> {
        let mut v = elf(ET_DYN, 0);
        v.truncate(64);
        let strtab_at = v.len();
        let mut names = Vec::new();
        v.push(0);
        for (name, _, _) in symbols {
            names.push(u32::try_from(v.len() - strtab_at).unwrap());
            v.extend_from_slice(name.as_bytes());
            v.push(0);
        }
        let strtab_len = v.len() - strtab_at;
        v.resize(v.len().next_multiple_of(8), 0);
        let symtab_at = v.len();
        v.extend_from_slice(&[0; 24]); // the null symbol
        for ((_, info, defined), name) in symbols.iter().zip(names) {
            v.extend_from_slice(&name.to_le_bytes());
            v.push(*info);
            v.push(0); // STV_DEFAULT
            let shndx: u16 = if *defined { 1 } else { 0 };
            v.extend_from_slice(&shndx.to_le_bytes());
            v.extend_from_slice(&[0; 16]); // st_value, st_size
        }
        let symtab_len = v.len() - symtab_at;
        let section =
            |v: &mut Vec<u8>, kind: u32, at: usize, len: usize, link: u32, entsize: u64| {
                let mut h = [0u8; 64];
                h[4..8].copy_from_slice(&kind.to_le_bytes());
                h[24..32].copy_from_slice(&(at as u64).to_le_bytes());
                h[32..40].copy_from_slice(&(len as u64).to_le_bytes());
                h[40..44].copy_from_slice(&link.to_le_bytes());
                h[44..48].copy_from_slice(&1u32.to_le_bytes()); // sh_info: first non-local
                h[48..56].copy_from_slice(&8u64.to_le_bytes());
                h[56..64].copy_from_slice(&entsize.to_le_bytes());
                v.extend_from_slice(&h);
            };
        // The section names: all empty.
        let shstrtab_at = v.len();
        v.resize(v.len().next_multiple_of(8) + 8, 0);
        let shoff = v.len() as u64;
        v.extend_from_slice(&[0; 64]);
        const SHT_STRTAB: u32 = 3;
        const SHT_DYNSYM: u32 = 11;
        section(&mut v, SHT_DYNSYM, symtab_at, symtab_len, 2, 24);
        section(&mut v, SHT_STRTAB, strtab_at, strtab_len, 0, 0);
        section(&mut v, SHT_STRTAB, shstrtab_at, 1, 0, 0);
        v[40..48].copy_from_slice(&shoff.to_le_bytes());
        v[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        v[60..62].copy_from_slice(&4u16.to_le_bytes()); // e_shnum
        v[62..64].copy_from_slice(&3u16.to_le_bytes()); // e_shstrndx
        v
    }

    #[test]
    fn a_library_defining_every_hook_export_is_the_hook() {
        let mut symbols: Vec<_> = HOOK_EXPORTS
            .iter()
            .map(|n| (*n, GLOBAL_FUNC, true))
            .collect();
        symbols.push(("version", GLOBAL_FUNC, true));
        // A weak definition is a definition too.
        symbols[0].1 = WEAK_FUNC;
        let data = library(&symbols);
        check_shared_library(Path::new("x"), &data).unwrap();
        check_hook(Path::new("x"), &data).unwrap();
        assert_eq!(why_not_hook(&data), None);
    }

    /// Only a global function defined here counts: not an import of the
    /// name, a local symbol, or data.
    #[test]
    fn missing_exports_are_named_and_nothing_else() {
        let gone = [
            "cuMemAlloc_v2",
            "cuLaunchKernel",
            "nvmlDeviceGetMemoryInfo",
            "dlsym",
            "cuMemFree_v2",
        ];
        let symbols: Vec<_> = HOOK_EXPORTS
            .iter()
            .filter_map(|&n| match n {
                "cuMemAlloc_v2" => Some((n, GLOBAL_FUNC, false)),
                "cuLaunchKernel" => None,
                "nvmlDeviceGetMemoryInfo" => Some((n, LOCAL_FUNC, true)),
                "dlsym" => Some((n, GLOBAL_OBJECT, true)),
                "cuMemFree_v2" => Some(("cuMemFree", GLOBAL_FUNC, true)),
                _ => Some((n, GLOBAL_FUNC, true)),
            })
            .collect();
        let data = library(&symbols);
        let missing = missing_hook_exports(&data).unwrap();
        let mut want: Vec<_> = HOOK_EXPORTS
            .iter()
            .copied()
            .filter(|n| gone.contains(n))
            .collect();
        assert_eq!(missing, want);
        let e = check_hook(Path::new("/x/lib.so"), &data).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "/x/lib.so is not vgpu's hook: it does not export {}: refusing to install it",
                want.join(", ")
            )
        );
        assert_eq!(why_not_hook(&data), Some(NotHook::Missing(missing)));
        want = HOOK_EXPORTS.to_vec();
        assert_eq!(missing_hook_exports(&library(&[])).unwrap(), want);
    }

    /// A real library that is not the hook: the C library (which may define
    /// `dlsym`, but no CUDA or NVML function).
    #[test]
    fn the_c_library_is_not_the_hook() {
        let libc = own_libc();
        let data = std::fs::read(&libc).unwrap();
        let e = check_hook(&libc, &data).unwrap_err();
        let ElfError::NotHook { missing, .. } = &e else {
            panic!("{e}");
        };
        for name in [
            "cuGetProcAddress",
            "cuMemAlloc_v2",
            "cuLaunchKernel",
            "nvmlDeviceGetMemoryInfo",
        ] {
            assert!(missing.contains(&name), "{e}");
        }
        // glibc's libc.so.6 also names a program interpreter: it runs.
        assert!(why_not_hook(&data).is_some());
        assert_eq!(why_not_hook(b"#!/bin/sh\n"), Some(NotHook::NotElf));
        assert!(matches!(
            why_not_hook(&elf(ET_EXEC, 0)),
            Some(NotHook::NotLibrary(_))
        ));
    }

    /// Every CUDA and NVML name the check asks for is one the hook exports
    /// (the entry-point list it is generated from), so a renamed entry
    /// point cannot make the check refuse vgpu's own hook.
    #[test]
    fn hook_exports_are_hooked_entry_points() {
        macro_rules! nvml_hooks {
            (
                cuda_hooks { $($ch:tt)* }
                cuda_older { $($co:tt)* }
                cuda_real { $($cr:tt)* }
                nvml_hooks { $(fn $nh:ident($($nha:ident: $nht:ty),*) -> $nhr:ty => $($nhp:ident)::+;)* }
                nvml_real { $($nr:tt)* }
            ) => {
                &[$(stringify!($nh)),*]
            };
        }
        let nvml: &[&str] = vgpu_common::entry_points!(nvml_hooks);
        let cuda = vgpu_common::entry::CUDA_VERSIONS
            .iter()
            .filter(|v| v.hooked)
            .map(|v| v.symbol);
        let hooked: BTreeSet<&str> = cuda.chain(nvml.iter().copied()).collect();
        for name in HOOK_EXPORTS.iter().filter(|n| **n != "dlsym") {
            assert!(hooked.contains(name), "{name} is not a hooked entry point");
        }
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
