//! `vgpu install-hook`: atomic replace under a process that has the old
//! library mapped, idempotence, uninstall restoring the previous state, and
//! refusal of a wrong-architecture library or of one that is not the hook.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use vgpu_tests::dist::{self, vgpu_bin, HOOK_EXPORTS};

/// Builds a stand-in hook whose `version()` returns `v`.
fn lib(dir: &Path, name: &str, v: i32) -> PathBuf {
    dist::stand_in_hook(dir, name, &format!("int version(void) {{ return {v}; }}\n"))
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
    // HAMi ≤ 2.4's (or Volcano's) files: only the operator's --force
    // replaces them (hami_node.rs shows why).
    let refused = install(&host, &ours, &[]);
    assert!(!refused.status.success(), "{}", stdout(&refused));
    assert_eq!(std::fs::read(host.join("libvgpu.so")).unwrap(), before_lib);
    let first = install(&host, &ours, &["--force"]);
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
    let second = install(&host, &ours, &["--force"]);
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

/// Every file below `dir`, symlinks not followed: (relative path, mode,
/// bytes or link target).
fn snapshot(dir: &Path) -> Vec<(String, u32, Vec<u8>)> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, u32, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = format!("{prefix}{}", e.file_name().to_string_lossy());
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            let mode = meta.permissions().mode();
            if meta.is_dir() {
                out.push((format!("{name}/"), mode, Vec::new()));
                walk(&e.path(), &format!("{name}/"), out);
            } else if meta.is_symlink() {
                let target = std::fs::read_link(e.path()).unwrap();
                out.push((name, mode, target.into_os_string().into_encoded_bytes()));
            } else {
                out.push((name, mode, std::fs::read(e.path()).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out);
    out.sort();
    out
}

/// The system's zlib, from the dynamic linker's cache.
fn libz() -> PathBuf {
    let out = Command::new("ldconfig").arg("-p").output().unwrap();
    let cache = String::from_utf8_lossy(&out.stdout);
    let line = cache
        .lines()
        .find(|l| l.trim_start().starts_with("libz.so.1 "))
        .unwrap_or_else(|| panic!("no libz.so.1 in `ldconfig -p`:\n{cache}"));
    let path = line.rsplit("=> ").next().unwrap().trim();
    PathBuf::from(path)
}

/// A shared library that is not the hook (zlib; a library exporting only
/// some of the hook's entry points, as the simulated libcuda does) is
/// refused with the missing exports named, before anything in the host
/// directory changes (no file written, no backup taken), whether the host
/// directory is empty, holds what was there before vgpu, or holds vgpu's
/// hook; and `--check` never calls such a library in place vgpu's hook.
#[test]
fn a_library_that_is_not_the_hook_is_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let zlib = libz();
    let partial = dist::shared_lib(
        dir.path(),
        "partial",
        "long cuMemAlloc_v2(void) { return 0; }\nlong cuLaunchKernel(void) { return 0; }\n",
    );
    let ours = lib(dir.path(), "ours", 1);

    // An empty host directory; one with what was there before vgpu (no
    // backup yet: a first install would take one); one with vgpu's hook.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let before = dir.path().join("before");
    std::fs::create_dir_all(&before).unwrap();
    std::fs::write(before.join("libvgpu.so"), b"what was there").unwrap();
    std::fs::write(
        before.join("ld.so.preload"),
        b"/usr/local/vgpu/libvgpu.so\n",
    )
    .unwrap();
    let installed = dir.path().join("installed");
    let o = install(&installed, &ours, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let exported = ["cuMemAlloc_v2", "cuLaunchKernel"];
    for (bad, present) in [(&zlib, &[][..]), (&partial, &exported[..])] {
        for host in [&empty, &before, &installed] {
            let was = snapshot(host);
            let o = install(host, bad, &[]);
            let err = String::from_utf8_lossy(&o.stderr);
            let said = format!("{}{err}", stdout(&o));
            assert!(
                !o.status.success(),
                "{} was installed in {}: {said}",
                bad.display(),
                host.display()
            );
            assert!(err.contains("not vgpu's hook"), "{err}");
            for f in HOOK_EXPORTS {
                assert_eq!(
                    err.contains(f),
                    !present.contains(f),
                    "the refusal names what is missing, only that ({f}): {err}"
                );
            }
            assert_eq!(err.trim().lines().count(), 1, "one clear sentence: {err}");
            assert_eq!(snapshot(host), was, "{} changed", host.display());
        }
    }
    // A host directory that does not exist is not created.
    let none = dir.path().join("none");
    assert!(!install(&none, &zlib, &[]).status.success());
    assert!(!none.exists());

    // zlib put in place by hand: --check says it is not vgpu's hook, with
    // vgpu's hook as --from and with zlib itself as --from.
    let host = dir.path().join("zlib-in-place");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::copy(&zlib, host.join("libvgpu.so")).unwrap();
    std::fs::write(host.join("ld.so.preload"), b"/usr/local/vgpu/libvgpu.so\n").unwrap();
    for from in [&ours, &zlib] {
        let c = install(&host, from, &["--check"]);
        let said = format!("{}{}", stdout(&c), String::from_utf8_lossy(&c.stderr));
        assert!(
            !c.status.success(),
            "--check (--from {}) accepted zlib: {said}",
            from.display()
        );
        assert!(!said.contains("get vgpu's hook"), "{said}");
        assert!(said.contains("not vgpu's hook"), "{said}");
    }
}

/// Issue #41: a `libvgpu.so` vgpu did not install is never replaced without
/// `--force`, on a node with no device plugin's files too; vgpu's own
/// (installed earlier, then upgraded) needs no flag, but once something
/// rewrote it in place (a device plugin's `cp -f`), it is not vgpu's any
/// more, whatever its bytes.
#[test]
fn a_library_vgpu_did_not_install_is_replaced_only_with_force() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("vgpu");
    std::fs::create_dir_all(&host).unwrap();
    let theirs = lib(dir.path(), "theirs", 5);
    let ours = lib(dir.path(), "ours", 6);
    let newer = lib(dir.path(), "newer", 7);
    std::fs::copy(&theirs, host.join("libvgpu.so")).unwrap();
    let was = std::fs::read(host.join("libvgpu.so")).unwrap();

    let o = install(&host, &ours, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "replaced without --force: {}",
        stdout(&o)
    );
    assert!(
        err.contains("vgpu did not install it") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read(host.join("libvgpu.so")).unwrap(), was);
    let c = install(&host, &ours, &["--check"]);
    assert_eq!(c.status.code(), Some(3), "{}", stdout(&c));
    assert!(stdout(&c).contains("--force"), "{}", stdout(&c));

    let o = install(&host, &ours, &["--force"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // An upgrade of vgpu's own library needs no flag.
    let o = install(&host, &newer, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read(host.join("libvgpu.so")).unwrap(),
        std::fs::read(&newer).unwrap()
    );
    // Rewritten in place, as `cp -f` does (same inode, new bytes).
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::copy(&theirs, host.join("libvgpu.so")).unwrap();
    let o = install(&host, &ours, &[]);
    assert!(
        !o.status.success(),
        "a library rewritten in place was replaced without --force: {}",
        stdout(&o)
    );
    assert_eq!(std::fs::read(host.join("libvgpu.so")).unwrap(), was);
    // Uninstall puts back what the first install found.
    let o = install(&host, &ours, &["--uninstall"]);
    assert!(o.status.success());
    assert_eq!(std::fs::read(host.join("libvgpu.so")).unwrap(), was);
}
