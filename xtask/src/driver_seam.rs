//! The hook calls the real driver in two places only: the safe wrappers of
//! `hook/src/real/` and the generated pass-through exports of
//! `hook/src/exports/`. Everything else asks `crate::driver` (or a wrapper),
//! so that its driver calls can be faked in unit tests. This scan rejects
//! the raw-call macros `real_cuda!` and `real_nvml!` in the code text
//! (comments and string literals skipped) of every other file of the hook.

use std::path::Path;

use anyhow::{bail, Result};

use crate::unsafe_free::{read, rust_files, strip};
use crate::util;

/// Folders of `hook/src/` where the raw-call macros belong.
const ALLOWED: &[&str] = &["real", "exports"];

/// The raw-call macros.
const RAW: &[&str] = &["real_cuda!", "real_nvml!"];

pub fn run() -> Result<()> {
    let findings = scan(&util::root().join("hook/src"))?;
    if !findings.is_empty() {
        bail!(
            "only hook/src/real/ and the generated exports call the real driver raw; call a \
             wrapper in hook/src/real/ or go through crate::driver:\n  {}",
            findings.join("\n  ")
        );
    }
    Ok(())
}

/// `path:line: macro` for every raw call outside the allowed folders of
/// the source tree `src`.
fn scan(src: &Path) -> Result<Vec<String>> {
    let mut findings = Vec::new();
    for f in rust_files(src)? {
        let rel = f.strip_prefix(src).unwrap_or(&f);
        let top = rel.components().next().and_then(|c| c.as_os_str().to_str());
        if rel.components().count() > 1 && top.is_some_and(|t| ALLOWED.contains(&t)) {
            continue;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree with a raw call in policy code, one in a comment, and the
    /// allowed ones in `real/` and `exports/`.
    #[test]
    fn a_raw_driver_call_outside_real_and_exports_is_rejected() {
        let dir = std::env::temp_dir().join(format!("vgpu-driver-seam-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let src = dir.as_path();
        for d in ["real/cuda", "exports", "sm", "memory"] {
            std::fs::create_dir_all(src.join(d)).unwrap();
        }
        let write = |p: &str, s: &str| std::fs::write(src.join(p), s).unwrap();
        write("real/cuda/mod.rs", "fn f() { real_cuda!(cuInit(0)); }\n");
        write("exports/mod.rs", "fn g() { real_nvml!(nvmlInit()); }\n");
        write(
            "sm/live.rs",
            "// real_cuda!(cuInit(0)) in a comment\nfn h() {\n    let _ = real_cuda!(cuCtxGetCurrent(&mut c));\n}\n",
        );
        write(
            "memory/info.rs",
            "fn i() { let s = \"real_nvml!(x)\"; not_real_nvml!(y); }\n",
        );
        write("real.rs", "fn j() { real_nvml!(nvmlInit()); }\n");
        let found = scan(src).unwrap();
        let names: Vec<String> = found
            .iter()
            .map(|f| {
                f.strip_prefix(&format!("{}/", src.display()))
                    .unwrap()
                    .to_owned()
            })
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            names,
            vec!["real.rs:1: `real_nvml!`", "sm/live.rs:3: `real_cuda!`"]
        );
    }

    #[test]
    fn the_hook_calls_the_driver_raw_only_in_real_and_exports() {
        run().unwrap();
    }
}
