//! The hook calls the real driver in two places only: the safe wrappers of
//! `hook/src/real/` and the generated pass-through exports of
//! `hook/src/exports/`. Everything else asks `crate::driver` (or a wrapper),
//! so that its driver calls can be faked in unit tests. This scan rejects,
//! in the code text (comments and string literals skipped) of every other
//! file of the hook:
//!
//! - the raw-call macros `real_cuda!` and `real_nvml!`;
//! - any path into `crate::real` (an import or a call), except in the real
//!   implementation of the driver seam (`hook/src/driver/native.rs`):
//!   policy code asks `crate::driver`, and the calls it forwards come from
//!   the exports.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::unsafe_free::{read, rust_files, strip};
use crate::util;

/// Folders of `hook/src/` where the raw-call macros belong.
const ALLOWED: &[&str] = &["real", "exports"];

/// The raw-call macros.
const RAW: &[&str] = &["real_cuda!", "real_nvml!"];

/// Files of `hook/src/` besides `real/` and `exports/` that may name
/// `crate::real`: the real implementation of the driver seam.
const REAL_IMPL: &[&str] = &["driver/native.rs"];

pub fn run() -> Result<()> {
    let src = util::root().join("hook/src");
    let findings = scan(&src)?;
    if !findings.is_empty() {
        bail!(
            "only hook/src/real/ and the generated exports call the real driver raw; call a \
             wrapper in hook/src/real/ or go through crate::driver:\n  {}",
            findings.join("\n  ")
        );
    }
    let findings = scan_imports(&src)?;
    if !findings.is_empty() {
        bail!(
            "policy code asks the driver through crate::driver, not crate::real (only \
             hook/src/real/, the exports and driver/native.rs name it):\n  {}",
            findings.join("\n  ")
        );
    }
    Ok(())
}

/// The Rust files of the source tree `src` outside the allowed folders,
/// each with its path below `src` (`/`-separated).
fn outside_allowed(src: &Path) -> Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    for f in rust_files(src)? {
        let rel = f.strip_prefix(src).unwrap_or(&f);
        let top = rel.components().next().and_then(|c| c.as_os_str().to_str());
        if rel.components().count() > 1 && top.is_some_and(|t| ALLOWED.contains(&t)) {
            continue;
        }
        let name = rel.to_string_lossy().replace('\\', "/");
        out.push((f, name));
    }
    Ok(out)
}

/// `path:line: macro` for every raw call outside the allowed folders of
/// the source tree `src`.
fn scan(src: &Path) -> Result<Vec<String>> {
    let mut findings = Vec::new();
    for (f, _) in outside_allowed(src)? {
        for (line, token) in raw_calls(&strip(&read(&f)?)) {
            findings.push(format!("{}:{line}: `{token}`", f.display()));
        }
    }
    Ok(findings)
}

/// `(line, macro)` for every raw call in `code`.
fn raw_calls(code: &str) -> Vec<(usize, &'static str)> {
    let mut out = Vec::new();
    for (i, line) in code.lines().enumerate() {
        for token in RAW {
            let mut from = 0;
            while let Some(at) = line[from..].find(token).map(|a| a + from) {
                let before = line[..at].chars().next_back();
                if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    out.push((i + 1, *token));
                }
                from = at + token.len();
            }
        }
    }
    out
}

/// `path:line: crate::real` for every path into `crate::real` in a file of
/// the source tree `src` outside `real/`, `exports/` and [`REAL_IMPL`].
fn scan_imports(src: &Path) -> Result<Vec<String>> {
    let mut findings = Vec::new();
    for (f, name) in outside_allowed(src)? {
        if REAL_IMPL.contains(&name.as_str()) {
            continue;
        }
        for line in real_paths(&strip(&read(&f)?)) {
            findings.push(format!("{}:{line}: `crate::real`", f.display()));
        }
    }
    Ok(findings)
}

/// The lines of `code` with a path into `crate::real`: `crate::real` itself
/// (`use crate::real::cuda::mem;`, `crate::real::cuda::ctx::current()`) or
/// an item of a `crate::{…}` group that starts with `real`.
fn real_paths(code: &str) -> Vec<usize> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let starts_real = |s: &str| {
        s.trim_start()
            .strip_prefix("real")
            .is_some_and(|r| !r.starts_with(ident))
    };
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("crate").map(|a| a + from) {
        from = at + "crate".len();
        if code[..at].ends_with(ident) {
            continue;
        }
        let Some(rest) = code[from..].trim_start().strip_prefix("::") else {
            continue;
        };
        let rest = rest.trim_start();
        let hit = match rest.strip_prefix('{') {
            // The group's items at its top level.
            Some(group) => {
                let mut depth = 0usize;
                let mut item_start = 0;
                let mut hit = false;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth > 0 => depth -= 1,
                        ',' | '}' if depth == 0 => {
                            hit |= starts_real(&group[item_start..i]);
                            item_start = i + 1;
                            if c == '}' {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                hit
            }
            None => starts_real(rest),
        };
        if hit {
            let line = code[..at].matches('\n').count() + 1;
            if out.last() != Some(&line) {
                out.push(line);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `files` (path, text) into a fresh source tree named `name`,
    /// runs `check` on it and returns its findings with the tree's prefix
    /// taken off.
    fn findings_in(
        name: &str,
        files: &[(&str, &str)],
        check: impl FnOnce(&Path) -> Result<Vec<String>>,
    ) -> Vec<String> {
        let dir = std::env::temp_dir().join(format!("vgpu-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let f = dir.join(path);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, text).unwrap();
        }
        let prefix = format!("{}/", dir.display());
        let found = check(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        found
            .iter()
            .map(|f| f.strip_prefix(&prefix).unwrap().to_owned())
            .collect()
    }

    /// A tree with a raw call in policy code, one in a comment, and the
    /// allowed ones in `real/` and `exports/`.
    #[test]
    fn a_raw_driver_call_outside_real_and_exports_is_rejected() {
        let names = findings_in(
            "driver-seam",
            &[
                ("real/cuda/mod.rs", "fn f() { real_cuda!(cuInit(0)); }\n"),
                ("exports/mod.rs", "fn g() { real_nvml!(nvmlInit()); }\n"),
                (
                    "sm/live.rs",
                    "// real_cuda!(cuInit(0)) in a comment\nfn h() {\n    let _ = real_cuda!(cuCtxGetCurrent(&mut c));\n}\n",
                ),
                (
                    "memory/info.rs",
                    "fn i() { let s = \"real_nvml!(x)\"; not_real_nvml!(y); }\n",
                ),
                ("real.rs", "fn j() { real_nvml!(nvmlInit()); }\n"),
            ],
            scan,
        );
        assert_eq!(
            names,
            vec!["real.rs:1: `real_nvml!`", "sm/live.rs:3: `real_cuda!`"]
        );
    }

    /// A policy file that imports `crate::real` (or calls through it) is
    /// rejected, whatever the form of the path; `real/`, the exports and
    /// the real implementation may.
    #[test]
    fn a_policy_file_importing_crate_real_is_rejected() {
        let names = findings_in(
            "driver-seam-imports",
            &[
                ("real/cuda/mem.rs", "use crate::real::cuda::sym;\n"),
                ("exports/dlsym.rs", "use crate::real;\n"),
                ("driver/native.rs", "use crate::real::cuda::{self, events};\n"),
                (
                    "memory/alloc.rs",
                    "//! Allocation.\n\nuse crate::real::cuda::{mem, status};\n",
                ),
                (
                    "memory/track.rs",
                    "fn f() -> u64 {\n    crate::real::cuda::ctx::current()\n}\n",
                ),
                ("devices.rs", "use crate::{ffi::*, real::{cuda, nvml}};\n"),
                ("nvml.rs", "use crate::{\n    real as r,\n};\n"),
                (
                    "sm/live.rs",
                    "// crate::real in a comment\nfn g() { let _ = \"crate::real\"; crate::realm::x(); my_crate::real::y(); }\nuse crate::{driver, realistic};\n",
                ),
                ("launch.rs", "use crate::real::cuda::launch;\n"),
            ],
            scan_imports,
        );
        assert_eq!(
            names,
            vec![
                "devices.rs:1: `crate::real`",
                "launch.rs:1: `crate::real`",
                "memory/alloc.rs:3: `crate::real`",
                "memory/track.rs:2: `crate::real`",
                "nvml.rs:1: `crate::real`",
            ]
        );
    }

    #[test]
    fn the_hook_calls_the_driver_raw_only_in_real_and_exports() {
        run().unwrap();
    }
}
