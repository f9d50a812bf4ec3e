//! docs/README.md's map ("The tree") against the folders: every folder
//! holding source files is on the map, and every folder the map names
//! exists. A newcomer reads the map first; one that has drifted sends them
//! to folders that moved and hides the ones that came.
//!
//! The map is the first fenced block after the `## The tree` heading. Each
//! line is an entry, then two or more spaces, then its description:
//!
//! ```text
//! hook/src/      libvgpu.so (docs/hook.md)
//!   real/        the real libcuda (cuda/) and NVML (nvml/)
//!     a/ b/ c/
//! ```
//!
//! An entry is one or more folders separated by single spaces (siblings),
//! relative to the first folder of the nearest less-indented line above.
//! In the description, every word ending in `/` (brackets and punctuation
//! around it aside) is a folder inside the line's first folder; words with
//! a `/` inside but not at the end (`docs/hook.md`) are not folders. A
//! line that starts with a word that is not a folder goes on with the
//! description of the entry above. A crate's `src/` is on the map when its
//! crate folder is.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::util;

/// Extensions of the files that make a folder a source folder.
const SOURCE_EXTENSIONS: &[&str] = &["rs", "c", "h", "py", "sh"];

pub fn run() -> Result<()> {
    let root = util::root();
    let readme = root.join("docs/README.md");
    let text = std::fs::read_to_string(&readme)
        .with_context(|| format!("reading {}", readme.display()))?;
    let map = parse(&text)?;
    let sources = source_folders(&root)?;
    let problems = compare(
        &map,
        &sources,
        |p| root.join(p).is_dir(),
        |p| root.join(p).join("Cargo.toml").is_file(),
    );
    if !problems.is_empty() {
        bail!(
            "docs/README.md's map (\"The tree\") does not match the folders:\n  {}",
            problems.join("\n  ")
        );
    }
    Ok(())
}

/// The folders the map names, relative to the repository root, without a
/// trailing slash.
fn parse(readme: &str) -> Result<BTreeSet<String>> {
    let mut lines = readme
        .lines()
        .skip_while(|l| l.trim() != "## The tree")
        .skip(1)
        .skip_while(|l| !l.starts_with("```"));
    if lines.next().is_none() {
        bail!("docs/README.md has no fenced map under `## The tree`");
    }
    let mut out = BTreeSet::new();
    // (indent, first folder) of the lines above, innermost last.
    let mut parents: Vec<(usize, String)> = Vec::new();
    for line in lines.take_while(|l| !l.starts_with("```")) {
        let body = line.trim_start();
        let Some(lead) = body.split_whitespace().next() else {
            continue;
        };
        if folder(lead).is_none() || lead.starts_with('(') {
            // The description above, continued.
            let Some((_, entry)) = parents.last() else {
                bail!("docs/README.md's map: {line:?} continues no entry");
            };
            for word in body.split_whitespace() {
                if let Some(dir) = folder(word) {
                    out.insert(util::join_rel(entry, dir));
                }
            }
            continue;
        }
        let indent = line.len() - body.len();
        while parents.last().is_some_and(|(i, _)| *i >= indent) {
            parents.pop();
        }
        let base = parents.last().map_or(String::new(), |(_, p)| p.clone());
        let (head, desc) = match body.find("  ") {
            Some(i) => (&body[..i], &body[i..]),
            None => (body, ""),
        };
        let mut first = None;
        for word in head.split(' ').filter(|w| !w.is_empty()) {
            let Some(dir) = folder(word) else {
                bail!("docs/README.md's map: {word:?} in {line:?} is not a folder (`name/`)");
            };
            let path = util::join_rel(&base, dir);
            first.get_or_insert_with(|| path.clone());
            out.insert(path);
        }
        let Some(first) = first else { continue };
        for word in desc.split_whitespace() {
            if let Some(dir) = folder(word) {
                out.insert(util::join_rel(&first, dir));
            }
        }
        parents.push((indent, first));
    }
    Ok(out)
}

/// `word` as a folder path when it ends in `/` once brackets, quotes and
/// punctuation around it are taken off.
fn folder(word: &str) -> Option<&str> {
    let w = word.trim_matches(|c: char| "()[]{},.;:`'\"".contains(c));
    let dir = w.strip_suffix('/')?;
    (!dir.is_empty() && !dir.contains("//") && !dir.starts_with('/')).then_some(dir)
}

/// Folders holding a source file git knows of or would add (tracked, or
/// untracked and not ignored), relative to `root`.
fn source_folders(root: &Path) -> Result<BTreeSet<String>> {
    Ok(util::git_files(root)?
        .iter()
        .filter(|f| {
            Path::new(f)
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| SOURCE_EXTENSIONS.contains(&e))
        })
        .filter(|f| root.join(f).is_file())
        .filter_map(|f| Some(Path::new(f).parent()?.to_str()?.to_owned()))
        .filter(|d| !d.is_empty())
        .collect())
}

/// What is wrong: source folders off the map, and map folders that do not
/// exist. `is_crate(p)`: folder `p` holds a `Cargo.toml`.
fn compare(
    map: &BTreeSet<String>,
    sources: &BTreeSet<String>,
    exists: impl Fn(&str) -> bool,
    is_crate: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    for s in sources {
        let crate_src = s
            .strip_suffix("/src")
            .is_some_and(|c| is_crate(c) && map.contains(c));
        if !map.contains(s) && !crate_src {
            problems.push(format!("{s}/ holds source files but is not on the map"));
        }
    }
    for m in map {
        if !exists(m) {
            problems.push(format!("{m}/ is on the map but does not exist"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const README: &str = "# x\n\n## The tree\n\n```\n\
        common/        the region (src/node/,\n\
        \x20              src/event/)\n\
        hook/src/      libvgpu.so (docs/hook.md)\n\
        \x20 real/        the real libcuda (cuda/) and NVML (nvml/): the only caller\n\
        \x20 sm/          the limiter (docs/sm-limit.md, \"How\"):\n\
        \x20   settings/ admission/ tests/\n\
        loader/src/    the CLI (daemon/, cmd/)\n\
        ```\n\nafter/ is not on the map\n";

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_map_reads_as_drawn() {
        assert_eq!(
            parse(README).unwrap(),
            set(&[
                "common",
                "common/src/event",
                "common/src/node",
                "hook/src",
                "hook/src/real",
                "hook/src/real/cuda",
                "hook/src/real/nvml",
                "hook/src/sm",
                "hook/src/sm/admission",
                "hook/src/sm/settings",
                "hook/src/sm/tests",
                "loader/src",
                "loader/src/cmd",
                "loader/src/daemon",
            ])
        );
    }

    #[test]
    fn a_readme_without_a_map_is_an_error() {
        assert!(parse("# x\n\n## The picture\n").is_err());
        assert!(parse("## The tree\n```\n  not a folder  x\n```\n").is_err());
        assert!(parse("## The tree\n```\nhook/ xyz  the hook\n```\n").is_err());
    }

    #[test]
    fn missing_and_stale_folders_are_named() {
        let map = set(&["common", "hook/src", "hook/src/gone"]);
        let sources = set(&["common/src", "hook/src", "hook/src/new", "scripts"]);
        let problems = compare(&map, &sources, |p| p != "hook/src/gone", |p| p == "common");
        assert_eq!(
            problems,
            vec![
                "hook/src/new/ holds source files but is not on the map",
                "scripts/ holds source files but is not on the map",
                "hook/src/gone/ is on the map but does not exist",
            ]
        );
        // Complete and current: nothing to say.
        let map = set(&["common", "hook/src", "hook/src/new", "scripts"]);
        assert!(compare(&map, &sources, |_| true, |p| p == "common").is_empty());
    }
}
