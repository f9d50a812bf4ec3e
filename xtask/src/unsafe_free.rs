//! The hook's policy code carries no `unsafe`: every driver call goes
//! through the safe wrappers of `hook/src/real/`, every read of an
//! application struct through `hook/src/ffi.rs`.
//!
//! Two layers: each module below starts with `#![forbid(unsafe_code)]`, so
//! the compiler rejects an `unsafe` block (one a local macro such as
//! `real_cuda!` expands to included), and this scan rejects the `unsafe`
//! token (or a call of the macros that expand to it) in the code text
//! (comments and string literals are skipped), so removing the attribute
//! does not open the door either.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::util;

/// Policy modules of the hook, relative to `hook/src/`. A directory stands
/// for every `.rs` file below it; its `mod.rs` carries the attribute.
/// `driver/` is policy, its real side calls only the wrappers of `real/`;
/// so is `world/`, whose real side calls `vgpu_common::clock` for the
/// clocks and the sleep.
const POLICY: &[&str] = &[
    "memory",
    "devices.rs",
    "driver",
    "launch.rs",
    "nvml.rs",
    "procaddr.rs",
    "sidecar.rs",
    "sm",
    "world",
];

/// Tokens that are, or expand to, an `unsafe` block.
const BANNED: &[&str] = &["unsafe", "real_cuda!", "real_nvml!"];

const FORBID: &str = "#![forbid(unsafe_code)]";

pub fn run() -> Result<()> {
    let src = util::root().join("hook/src");
    let mut findings = Vec::new();
    for entry in POLICY {
        let path = src.join(entry);
        let (files, head) = if path.is_dir() {
            (rust_files(&path)?, path.join("mod.rs"))
        } else {
            (vec![path.clone()], path)
        };
        let text = read(&head)?;
        if !strip(&text).lines().any(|l| l.trim() == FORBID) {
            findings.push(format!("{}: lacks `{FORBID}`", head.display()));
        }
        for f in files {
            for (line, token) in banned(&strip(&read(&f)?)) {
                findings.push(format!("{}:{line}: `{token}`", f.display()));
            }
        }
    }
    if !findings.is_empty() {
        bail!(
            "the hook's policy code must not use unsafe (call a wrapper in hook/src/real/ or a \
             reader in hook/src/ffi.rs):\n  {}",
            findings.join("\n  ")
        );
    }
    Ok(())
}

pub(crate) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

pub(crate) fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(rust_files(&p)?);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// `(line, token)` for every banned token standing as a word of its own.
fn banned(code: &str) -> Vec<(usize, &'static str)> {
    let mut out = Vec::new();
    for (i, line) in code.lines().enumerate() {
        for token in BANNED {
            let word = token.trim_end_matches('!');
            let mut from = 0;
            while let Some(at) = line[from..].find(token).map(|a| a + from) {
                let before = line[..at].chars().next_back();
                let after = line[at + word.len()..].chars().next();
                let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                if !ident(before) && (token.ends_with('!') || !ident(after)) {
                    out.push((i + 1, *token));
                }
                from = at + token.len();
            }
        }
    }
    out
}

/// `src` with comments and string/char literals blanked (newlines kept, so
/// line numbers stay right).
pub(crate) fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2]))))
            && matches!(next, Some('"' | '#'))
        {
            // A raw string: r"…", r#"…"#, br"…".
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            out.push(' ');
            for _ in 0..=hashes {
                out.push(' ');
            }
            i = j + 1;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += hashes + 1;
                    break;
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' && next == Some('\\') {
            // An escaped char literal: '\n', '\'', '\u{…}'.
            out.push_str("  ");
            i += 2;
            while i < c.len() && c[i] != '\'' {
                blank(&mut out, c[i]);
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            // A plain char literal ('"' included); a lifetime is left as is.
            out.push_str("   ");
            i += 3;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_is_found_in_code_only() {
        let src = r##"
// unsafe in a line comment
/* unsafe in a /* nested */ block comment */
let s = "unsafe \" in a string";
let r = r#"unsafe in a raw "string""#;
let q = '"'; let l: &'a str = "x";
fn not_unsafe_fn() {}
let p = unsafe { *x };
let n = real_cuda!(cuInit(0));
"##;
        let found = banned(&strip(src));
        assert_eq!(found, vec![(8, "unsafe"), (9, "real_cuda!")]);
    }

    #[test]
    fn the_policy_modules_are_unsafe_free() {
        run().unwrap();
    }
}
