//! Every file path the docs name in backticks exists: in docs/*.md, the
//! top-level README.md, and the doc comments (`///`, `//!`) of every Rust
//! file. A newcomer follows these names to the code; one that has moved
//! sends them nowhere.
//!
//! A backticked token is a path when it has no spaces, contains a `/` and
//! ends in one of [`EXTENSIONS`]. Shell-style braces are expanded
//! (`hook/src/real/nvml/{device,process}.rs` names two files); tokens with a
//! placeholder (`tests/c/<name>.c`, `*`, `$`) and paths in other projects
//! ([`EXTERNAL`]) are left alone, and so are fenced code blocks. A path
//! resolves against the repository root, the doc's own folder, and the
//! crate root and its `src/`: for a Rust file its own crate, for a Markdown
//! file any crate of the repository (docs/hook.md says sm/controller.rs for
//! `hook/src/sm/controller.rs`). A backtick left open at the end of a line
//! (a token broken over two lines) is not read.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::util;

/// What a path ends in.
const EXTENSIONS: &[&str] = &[".rs", ".md", ".c", ".h", ".sh", ".py", ".yaml", ".toml"];

/// Beginnings of paths in other projects that the docs cite: HAMi-core's
/// sources and the Linux headers.
const EXTERNAL: &[&str] = &["src/multiprocess/", "include/linux/"];

pub fn run() -> Result<()> {
    let root = util::root();
    let files = util::git_files(&root)?;
    let crates: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.strip_suffix("Cargo.toml"))
        .map(|d| d.trim_end_matches('/').to_owned())
        .filter(|d| root.join(d).join("Cargo.toml").is_file())
        .collect();
    let mut problems = Vec::new();
    for file in &files {
        let Some(kind) = kind_of(file) else { continue };
        let path = root.join(file);
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let bases = bases(file, kind, &crates);
        problems.extend(check(file, &text, kind, &bases, |p| root.join(p).exists()));
    }
    if !problems.is_empty() {
        bail!(
            "the docs name files that do not exist:\n  {}",
            problems.join("\n  ")
        );
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A Markdown page: every line outside fenced blocks.
    Markdown,
    /// A Rust file: its `///` and `//!` lines.
    Rust,
}

fn kind_of(file: &str) -> Option<Kind> {
    if file == "README.md" || (file.starts_with("docs/") && file.ends_with(".md")) {
        Some(Kind::Markdown)
    } else if file.ends_with(".rs") {
        Some(Kind::Rust)
    } else {
        None
    }
}

/// The folders, relative to the root ("" is the root), that a path in
/// `file` may be relative to.
fn bases(file: &str, kind: Kind, crates: &BTreeSet<String>) -> Vec<String> {
    let dir = Path::new(file)
        .parent()
        .and_then(Path::to_str)
        .unwrap_or("")
        .to_owned();
    let mut out = vec![String::new(), dir];
    let with_src = |c: &str| [c.to_owned(), util::join_rel(c, "src")];
    match kind {
        Kind::Markdown => {
            for c in crates {
                out.extend(with_src(c));
            }
        }
        Kind::Rust => {
            // The nearest crate above the file.
            if let Some(c) = crates
                .iter()
                .filter(|c| c.is_empty() || file.starts_with(&format!("{c}/")))
                .max_by_key(|c| c.len())
            {
                out.extend(with_src(c));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// `file:line: ...` for each backticked path in `text` that resolves
/// against none of `bases`. `exists(p)`: `p`, relative to the root, exists.
fn check(
    file: &str,
    text: &str,
    kind: Kind,
    bases: &[String],
    exists: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        let body = match kind {
            Kind::Markdown => line.trim_start(),
            Kind::Rust => {
                let t = line.trim_start();
                match t.strip_prefix("//!").or_else(|| t.strip_prefix("///")) {
                    Some(rest) => rest.trim_start(),
                    None => {
                        fenced = false;
                        continue;
                    }
                }
            }
        };
        if body.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Between backticks: the odd pieces, but not one left open.
        let pieces: Vec<&str> = body.split('`').collect();
        let closed = pieces.len() - usize::from(pieces.len().is_multiple_of(2));
        for token in pieces[..closed].iter().skip(1).step_by(2) {
            if !is_path(token) {
                continue;
            }
            for path in expand(token) {
                let path = path.trim_start_matches("./");
                if !bases.iter().any(|b| exists(&util::join_rel(b, path))) {
                    problems.push(format!(
                        "{file}:{}: `{token}`: no file {path} (from the root, the doc's folder or the crate)",
                        n + 1
                    ));
                }
            }
        }
    }
    problems
}

fn is_path(token: &str) -> bool {
    token.contains('/')
        && EXTENSIONS.iter().any(|e| token.ends_with(e))
        && !token.contains(|c: char| c.is_whitespace() || "<>*$".contains(c))
        && !token.contains("://")
        && !token.starts_with('/')
        && !token.starts_with('~')
        && !EXTERNAL.iter().any(|e| token.starts_with(e))
}

/// a/{b,c}.rs as a/b.rs and a/c.rs, every brace group expanded.
fn expand(token: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (token.find('{'), token.find('}')) else {
        return vec![token.to_owned()];
    };
    if close < open {
        return vec![token.to_owned()];
    }
    let (head, tail) = (&token[..open], &token[close + 1..]);
    token[open + 1..close]
        .split(',')
        .flat_map(|alt| expand(&format!("{head}{alt}{tail}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILES: &[&str] = &[
        "hook/src/sm/live.rs",
        "hook/src/real/nvml/device.rs",
        "hook/src/real/nvml/process.rs",
        "docs/hook.md",
        "scripts/gpu-check.sh",
    ];

    fn exists(p: &str) -> bool {
        FILES.contains(&p)
    }

    fn crates() -> BTreeSet<String> {
        ["", "hook", "common"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    }

    #[test]
    fn a_stale_path_is_named_with_its_file_and_line() {
        let text = "# Hook\n\nThe limiter (`sm/live.rs`) and\n\
                    the bucket (`sm/bucket.rs`).\n";
        let bases = bases("docs/hook.md", Kind::Markdown, &crates());
        let problems = check("docs/hook.md", text, Kind::Markdown, &bases, exists);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("docs/hook.md:4: `sm/bucket.rs`"),
            "{problems:?}"
        );
    }

    #[test]
    fn good_paths_pass() {
        let text = "See `sm/live.rs`, `real/nvml/{device,process}.rs`,\n\
                    `scripts/gpu-check.sh`, `hook.md` and `../docs/hook.md`;\n\
                    not paths: `tests/c/<name>.c`, `a / b.rs`, `/etc/x.toml`,\n\
                    HAMi-core's `src/multiprocess/shrreg_tool.c`, `broken/over\n\
                    two.rs` lines.\n\
                    ```\n`gone/file.rs` in a fenced block\n```\n";
        let bases = bases("docs/hook.md", Kind::Markdown, &crates());
        let ok = |p: &str| exists(p) || p == "docs/../docs/hook.md";
        assert_eq!(
            check("docs/hook.md", text, Kind::Markdown, &bases, ok),
            Vec::<String>::new()
        );
    }

    #[test]
    fn doc_comments_resolve_against_their_own_crate() {
        let text = concat!(
            "//! The limiter (`sm/live.rs`).\n",
            "// A plain comment: `sm/gone.rs` is not checked.\n",
            "/",
            "// `hook/src/sm/live.rs`, and `sm/gone.rs` is stale.\n",
            "fn f() {}\n",
        );
        let in_hook = bases("hook/src/lib.rs", Kind::Rust, &crates());
        assert_eq!(
            check("hook/src/lib.rs", text, Kind::Rust, &in_hook, exists).len(),
            1
        );
        // From another crate, `sm/live.rs` is not the hook's.
        let in_common = bases("common/src/lib.rs", Kind::Rust, &crates());
        let problems = check("common/src/lib.rs", text, Kind::Rust, &in_common, exists);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("common/src/lib.rs:1: `sm/live.rs`"));
        assert!(problems[1].starts_with("common/src/lib.rs:3: `sm/gone.rs`"));
    }

    #[test]
    fn braces_expand() {
        assert_eq!(expand("a/{b,c}.rs"), vec!["a/b.rs", "a/c.rs"]);
        assert_eq!(expand("a/b.rs"), vec!["a/b.rs"]);
    }
}
