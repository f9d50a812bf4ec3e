//! `vgpu install-hook`: atomic replace under a process that has the old
//! library mapped, idempotence, uninstall restoring the previous state, and
//! refusal of a wrong-architecture library.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use vgpu_tests::dist::vgpu_bin;

/// Builds a shared library whose `version()` returns `v`.
fn lib(dir: &Path, name: &str, v: i32) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, format!("int version(void) {{ return {v}; }}\n")).unwrap();
    let out = dir.join(format!("{name}.so"));
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());
    out
}

fn install(host: &Path, from: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(vgpu_bin())
        .arg("install-hook")
        .arg("--host-dir")
        .arg(host)
        .arg("--from")
        .arg(from)
        .args(extra)
        .output()
        .unwrap()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn replace_is_atomic_for_a_process_that_maps_the_old_library() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("vgpu");
    let old = lib(dir.path(), "old", 1);
    let new = lib(dir.path(), "new", 2);
    assert!(install(&host, &old, &[]).status.success());
    let installed = host.join("libvgpu.so");

    // A process that dlopens the installed library and calls into it on
    // every line of input, printing what it got.
    let prog = dir.path().join("user.c");
    std::fs::write(
        &prog,
        r#"#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { printf("dlopen failed\n"); return 1; }
    int (*version)(void) = (int (*)(void))dlsym(h, "version");
    char line[16];
    printf("%d\n", version()); fflush(stdout);
    while (fgets(line, sizeof line, stdin)) { printf("%d\n", version()); fflush(stdout); }
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("user");
    assert!(Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&prog)
        .arg("-ldl")
        .status()
        .unwrap()
        .success());
    let mut child = Command::new(&exe)
        .arg(&installed)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "1");

    let old_inode = std::fs::metadata(&installed).unwrap();
    let o = install(&host, &new, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    use std::os::unix::fs::MetadataExt;
    assert_ne!(
        std::fs::metadata(&installed).unwrap().ino(),
        old_inode.ino(),
        "replaced by rename, not rewritten in place"
    );

    // The running process still calls its (old, whole) mapping.
    let mut stdin = child.stdin.take().unwrap();
    for _ in 0..3 {
        writeln!(stdin, "go").unwrap();
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(
            line.trim(),
            "1",
            "the running process keeps the old library"
        );
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());

    // A new process gets the new library.
    let o = Command::new(&exe)
        .arg(&installed)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(stdout(&o).trim(), "2");
    // No temporary files are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&host)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn install_is_idempotent_and_uninstall_restores_the_previous_state() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("vgpu");
    std::fs::create_dir_all(&host).unwrap();
    // What HAMi left there: its own library and preload file.
    let hami = lib(dir.path(), "hami", 7);
    std::fs::copy(&hami, host.join("libvgpu.so")).unwrap();
    std::fs::write(host.join("ld.so.preload"), "/usr/local/vgpu/libvgpu.so\n").unwrap();
    let before_lib = std::fs::read(host.join("libvgpu.so")).unwrap();

    let ours = lib(dir.path(), "ours", 8);
    let first = install(&host, &ours, &[]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(stdout(&first).contains("installed"));
    assert_eq!(
        std::fs::read(host.join("libvgpu.so")).unwrap(),
        std::fs::read(&ours).unwrap()
    );
    let second = install(&host, &ours, &[]);
    assert!(second.status.success());
    assert!(
        stdout(&second).contains("already up to date"),
        "{}",
        stdout(&second)
    );

    let un = install(&host, &ours, &["--uninstall"]);
    assert!(
        un.status.success(),
        "{}",
        String::from_utf8_lossy(&un.stderr)
    );
    assert_eq!(std::fs::read(host.join("libvgpu.so")).unwrap(), before_lib);
    assert_eq!(
        std::fs::read_to_string(host.join("ld.so.preload")).unwrap(),
        "/usr/local/vgpu/libvgpu.so\n"
    );
    assert!(!host.join(".vgpu-backup").exists());
    let again = install(&host, &ours, &["--uninstall"]);
    assert!(stdout(&again).contains("nothing to uninstall"));

    // On a node with nothing before, uninstall removes vgpu's files.
    let empty = dir.path().join("fresh");
    assert!(install(&empty, &ours, &[]).status.success());
    assert_eq!(
        std::fs::read_to_string(empty.join("ld.so.preload")).unwrap(),
        "/usr/local/vgpu/libvgpu.so\n"
    );
    assert!(install(&empty, &ours, &["--uninstall"]).status.success());
    assert!(!empty.join("libvgpu.so").exists());
    assert!(!empty.join("ld.so.preload").exists());
}

#[test]
fn wrong_architecture_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("vgpu");
    let good = lib(dir.path(), "good", 1);
    let mut bytes = std::fs::read(&good).unwrap();
    // e_machine (offset 18): EM_AARCH64 on x86-64, EM_X86_64 elsewhere.
    let other: u16 = if cfg!(target_arch = "x86_64") {
        183
    } else {
        62
    };
    bytes[18..20].copy_from_slice(&other.to_le_bytes());
    let bad = dir.path().join("bad.so");
    std::fs::write(&bad, &bytes).unwrap();
    let o = install(&host, &bad, &[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("refusing to install"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one clear sentence: {err}");
    assert!(!host.join("libvgpu.so").exists());
    assert!(!host.join("ld.so.preload").exists());
}
