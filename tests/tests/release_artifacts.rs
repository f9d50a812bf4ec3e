//! What `cargo xtask build` ships is stripped of debug info (kept beside
//! it in `dist/debug/`, linked by `.gnu_debuglink`), and the hook still
//! exports its interposed symbols.

use std::process::Command;

use vgpu_tests::dist::{dist_dir, hook_lib, vgpu_bin};

fn sections(path: &std::path::Path) -> String {
    let out = Command::new("readelf")
        .args(["-S", "--wide"])
        .arg(path)
        .output()
        .expect("run readelf");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn shipped_files_carry_no_debug_info_and_link_to_it() {
    for (file, name) in [(vgpu_bin(), "vgpu"), (hook_lib(), "libvgpu.so")] {
        let s = sections(&file);
        assert!(!s.contains(".debug_info"), "{name} is not stripped");
        assert!(s.contains(".gnu_debuglink"), "{name}: no debug link");
        assert!(
            s.contains(".symtab"),
            "{name}: symbols are kept for backtraces"
        );
        let debug = dist_dir().join("debug").join(format!("{name}.debug"));
        assert!(
            sections(&debug).contains(".debug_info"),
            "{} holds the debug info",
            debug.display()
        );
    }
    let dynsym = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(hook_lib())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&dynsym.stdout).contains(" cuMemAlloc_v2"));
}
