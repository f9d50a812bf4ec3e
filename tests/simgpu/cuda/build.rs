//! Sets the SONAME and generates the `cuGetProcAddress` table from the
//! exported functions in `src/` (every `pub unsafe extern "C" fn cu…`), so
//! the table cannot drift from the exports.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    let src = Path::new("src");
    println!("cargo:rerun-if-changed=src");
    let mut entries = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(src)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for path in files {
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let module = if stem == "lib" {
            "crate".to_string()
        } else {
            format!("crate::{stem}")
        };
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for line in text.lines() {
            let Some(rest) = line
                .trim_start()
                .strip_prefix("pub unsafe extern \"C\" fn ")
            else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.starts_with("cu") {
                entries.push((name, module.clone()));
            }
        }
    }
    let mut out = String::from(
        "/// Address of the export named `name`, if this library exports it.\n\
         pub(crate) fn lookup(name: &str) -> Option<*const ()> {\n    match name {\n",
    );
    for (name, module) in &entries {
        let _ = writeln!(
            out,
            "        {name:?} => Some({module}::{name} as *const ()),"
        );
    }
    out.push_str("        _ => None,\n    }\n}\n\n/// Every exported `cu*` name.\n#[cfg(test)]\npub(crate) const NAMES: &[&str] = &[\n");
    for (name, _) in &entries {
        let _ = writeln!(out, "    {name:?},");
    }
    out.push_str("];\n");
    let dest =
        Path::new(&std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into())).join("exports.rs");
    if let Err(e) = std::fs::write(&dest, out) {
        println!("cargo:warning=cannot write {}: {e}", dest.display());
    }
}
