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
