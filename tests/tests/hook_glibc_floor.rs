//! The hook is preloaded into every process of every GPU container, whose
//! images may carry a C library much older than the build machine's. It
//! must need no glibc symbol version newer than 2.17 (xtask links it with
//! zig for that target).

use std::process::Command;

use vgpu_tests::dist::hook_lib;

fn version(v: &str) -> Vec<u32> {
    v.split('.').filter_map(|p| p.parse().ok()).collect()
}

#[test]
fn hook_needs_no_glibc_newer_than_2_17() {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(hook_lib())
        .output()
        .expect("objdump (binutils) runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = text
        .split(|c: char| c == '(' || c == ')' || c.is_whitespace())
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert!(!needed.is_empty(), "objdump listed no versioned symbols");
    let worst = needed.iter().max_by_key(|v| version(v)).unwrap();
    assert!(
        version(worst) <= version("2.17"),
        "libvgpu.so needs GLIBC_{worst}; containers with an older glibc could not start"
    );
}

/// A strong undefined symbol without a glibc version is one the 2.17 link
/// stubs lack: a newer glibc's (`getrandom` came in 2.25). The hook is
/// linked with `BIND_NOW`, so on an older glibc it would fail to load at
/// all. Weak ones (looked up at run time, absent is fine) are allowed.
#[test]
fn hook_has_no_unversioned_strong_undefined_symbol() {
    let out = Command::new("readelf")
        .args(["-W", "--dyn-syms"])
        .arg(hook_lib())
        .output()
        .expect("readelf (binutils) runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let bad: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            (f.len() >= 8 && f[6] == "UND" && f[4] == "GLOBAL" && !f[7].contains('@')).then(|| f[7])
        })
        .collect();
    assert!(
        bad.is_empty(),
        "libvgpu.so needs {bad:?} with no glibc version: older glibc has none"
    );
}
