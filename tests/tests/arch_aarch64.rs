//! The aarch64 build (`cargo xtask build --arch aarch64`, what arm64 nodes
//! such as GH200/GB200 run) on this x86-64 machine under qemu-user: every
//! shipped file is aarch64 and the hook keeps the glibc 2.17 floor, `vgpu
//! --version` names the same commit as the host build, `vgpu install-hook`
//! installs the aarch64 hook into a scratch directory and refuses the x86-64
//! one, and an aarch64 CUDA program over the aarch64 simulated libcuda gets
//! its allocation past the limit refused by the aarch64 hook.
//!
//! The simulated GPU's server is the host's: its protocol is fixed 16-byte
//! little-endian messages and a state file of fixed-width atomics, the
//! same on both architectures, and the x86-64 test reads the region the
//! aarch64 hook wrote, whose layout is too.
#![cfg(target_arch = "x86_64")]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::aarch64::{self, compile_c, elf_machine, embedded_bpf_object};
use vgpu_tests::dist;

const EM_AARCH64: u16 = 183;
const M: u64 = 1 << 20;
const G: u64 = 1 << 30;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn vgpu(args: &[&str], extra: &[&Path]) -> Output {
    aarch64::command(&aarch64::dist_dir().join("vgpu"))
        .args(args)
        .args(extra)
        .output()
        .expect("run qemu-aarch64-static")
}

#[test]
fn every_shipped_file_is_aarch64_and_the_hook_needs_no_glibc_newer_than_2_17() {
    let dist = aarch64::dist_dir();
    for f in [
        "vgpu",
        "libvgpu.so",
        "sim/libcuda.so.1",
        "sim/libnvidia-ml.so.1",
        "sim/simgpu-server",
    ] {
        assert_eq!(elf_machine(&dist.join(f)), EM_AARCH64, "{f}");
    }
    let out = Command::new("readelf")
        .args(["-V", "-W"])
        .arg(dist.join("libvgpu.so"))
        .output()
        .expect("readelf (binutils) runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let versions: Vec<Vec<u32>> = text(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .map(|v| v.split('.').filter_map(|p| p.parse().ok()).collect())
        .filter(|v: &Vec<u32>| !v.is_empty())
        .collect();
    assert!(!versions.is_empty(), "readelf listed no glibc versions");
    let worst = versions.iter().max().cloned().unwrap_or_default();
    assert!(
        worst <= vec![2, 17],
        "the aarch64 libvgpu.so needs GLIBC_{worst:?}; older images could not start"
    );
}

/// aya-build builds the eBPF object for the loader's target arch, which
/// decides how probe arguments are read (ebpf/src/args.rs): registers from
/// AArch64's `user_pt_regs` (x0..x7, then the stack at `sp`), or x86-64's
/// `pt_regs` (rdi, rsi, …, then the stack past the return address). The
/// object's type information names the structure it was built against.
#[test]
fn each_vgpu_embeds_the_ebpf_object_built_for_its_architecture() {
    let contains = |obj: &[u8], what: &str| obj.windows(what.len()).any(|w| w == what.as_bytes());
    // Field names only one of the two structures has.
    let (arm_only, x86_only) = ("pstate", "orig_rax");
    let arm = embedded_bpf_object(&aarch64::dist_dir().join("vgpu"));
    assert!(contains(&arm, "user_pt_regs") && contains(&arm, arm_only));
    assert!(
        !contains(&arm, x86_only),
        "the aarch64 vgpu embeds an x86-64 object"
    );
    let x86 = embedded_bpf_object(&dist::vgpu_bin());
    assert!(contains(&x86, x86_only), "x86-64 vgpu: no pt_regs.orig_rax");
    assert!(
        !contains(&x86, arm_only),
        "the x86-64 vgpu embeds an aarch64 object"
    );
}

#[test]
fn version_under_qemu_names_the_same_commit_as_the_host_build() {
    let arm = vgpu(&["--version"], &[]);
    assert!(arm.status.success(), "{}", text(&arm.stderr));
    let host = Command::new(dist::vgpu_bin())
        .arg("--version")
        .output()
        .unwrap();
    let said = text(&arm.stdout);
    assert!(
        said.starts_with(&format!("vgpu {} (", env!("CARGO_PKG_VERSION"))),
        "{said}"
    );
    assert_eq!(said, text(&host.stdout));
}

#[test]
fn install_hook_installs_the_aarch64_hook_and_refuses_the_x86_64_one() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("vgpu");
    let ours = aarch64::dist_dir().join("libvgpu.so");
    let out = vgpu(
        &["install-hook", "--host-dir"],
        &[&host, Path::new("--from"), &ours],
    );
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("installed"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        std::fs::read(host.join("libvgpu.so")).unwrap(),
        std::fs::read(&ours).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(host.join("ld.so.preload")).unwrap(),
        "/usr/local/vgpu/libvgpu.so\n"
    );

    // The aarch64 `vgpu` is an aarch64 node's: the host's hook is foreign.
    let other = dir.path().join("other");
    let x86 = dist::hook_lib();
    let out = vgpu(
        &["install-hook", "--host-dir"],
        &[&other, Path::new("--from"), &x86],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("refusing to install") && err.contains("aarch64"),
        "{err}"
    );
    assert!(!other.join("libvgpu.so").exists());
}

/// `exe args…` (aarch64) over the aarch64 simulated driver, under the
/// aarch64 hook with a 1 GiB limit and `region` when given; returns
/// (stdout, stderr, pid).
fn run_sim(
    exe: &Path,
    args: &[&str],
    sim_dir: &Path,
    region: Option<&Path>,
) -> (String, String, u32) {
    let sim = aarch64::dist_dir().join("sim");
    let mut c = aarch64::command(exe);
    c.args(args)
        .env("LD_LIBRARY_PATH", &sim)
        .env("SIMGPU_DIR", sim_dir)
        .env("SIMGPU_SERVER", dist::sim_dir().join("simgpu-server"))
        .env_remove("LD_PRELOAD")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(region) = region {
        c.env("LD_PRELOAD", aarch64::dist_dir().join("libvgpu.so"))
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    }
    let child = c.spawn().expect("run qemu-aarch64-static");
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    (text(&out.stdout), text(&out.stderr), pid)
}

/// `hook_mem hold <bytes>` (tests/c/hook_mem.c): a context, one
/// allocation, "held rc <CUresult>".
fn hold(exe: &Path, sim_dir: &Path, bytes: u64, region: Option<&Path>) -> (String, String, u32) {
    run_sim(exe, &["hold", &bytes.to_string()], sim_dir, region)
}

/// The CUDA runtime's way to the driver: dlopen, then every entry point
/// through dlsym, which the hook answers with its wrappers.
const DLOPEN_ALLOC: &str = r#"#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
typedef int (*init_t)(unsigned);
typedef int (*get_t)(int *, int);
typedef int (*ctx_t)(void **, unsigned, int);
typedef int (*alloc_t)(unsigned long long *, size_t);
int main(int argc, char **argv) {
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu || argc < 2) return 3;
    init_t init = (init_t)dlsym(cu, "cuInit");
    get_t get = (get_t)dlsym(cu, "cuDeviceGet");
    ctx_t ctx = (ctx_t)dlsym(cu, "cuCtxCreate_v2");
    alloc_t alloc = (alloc_t)dlsym(cu, "cuMemAlloc_v2");
    int dev;
    void *c;
    unsigned long long p;
    if (!init || !get || !ctx || !alloc || init(0) || get(&dev, 0) || ctx(&c, 0, dev)) return 4;
    printf("alloc rc %d\n", alloc(&p, strtoull(argv[1], 0, 0)));
    return 0;
}
"#;

#[test]
fn the_aarch64_hook_refuses_an_allocation_past_the_limit_in_an_aarch64_program() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_c("hook_mem", dir.path());
    assert_eq!(elf_machine(&exe), EM_AARCH64);
    let sim = dir.path().join("sim");
    let region = dir.path().join("ctr.cache");

    // The simulated context costs 500 MiB: 600 MiB more is past a 1 GiB
    // limit, but the simulated device (80 GiB) has it.
    let (out, err, _) = hold(&exe, &sim, 600 * M, None);
    assert_eq!(out.trim(), "held rc 0", "without the hook: {err}");

    let (out, err, pid) = hold(&exe, &sim, 600 * M, Some(&region));
    assert_eq!(
        out.trim(),
        "held rc 2",
        "CUDA_ERROR_OUT_OF_MEMORY from the hook: {err}"
    );
    assert!(err.contains("bytes refused"), "the hook says why: {err}");
    let r = RegionFile::open(&region, Access::ReadOnly).expect("the hook made its region");
    let r = r.region();
    assert_eq!(r.limit[0].load(SeqCst), G);
    let slot = r
        .procs
        .iter()
        .find(|s| s.pid.load(SeqCst) == pid as i32)
        .unwrap_or_else(|| panic!("no slot of pid {pid} in the region"));
    assert_eq!(slot.used[0].context_size.load(SeqCst), 500 * M);
    assert_eq!(slot.used[0].data_size.load(SeqCst), 0, "nothing counted");

    // Within the limit the hook forwards the allocation and counts it.
    let (out, err, pid) = hold(&exe, &sim, 400 * M, Some(&region));
    assert_eq!(out.trim(), "held rc 0", "{err}");
    let slot = r
        .procs
        .iter()
        .find(|s| s.pid.load(SeqCst) == pid as i32)
        .unwrap_or_else(|| panic!("no slot of pid {pid} in the region"));
    assert_eq!(slot.used[0].data_size.load(SeqCst), 400 * M);

    // The same through dlopen + dlsym: the hook's own dlsym answers.
    let src = dir.path().join("dlopen_alloc.c");
    std::fs::write(&src, DLOPEN_ALLOC).unwrap();
    let exe = dir.path().join("dlopen_alloc");
    let out = aarch64::cc()
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("run zig cc");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bytes = (600 * M).to_string();
    let (out, err, _) = run_sim(&exe, &[&bytes], &sim, None);
    assert_eq!(out.trim(), "alloc rc 0", "without the hook: {err}");
    let (out, err, _) = run_sim(&exe, &[&bytes], &sim, Some(&region));
    assert_eq!(
        out.trim(),
        "alloc rc 2",
        "dlsym gave the hook's wrapper: {err}"
    );
}

/// A library preloaded after the hook looks up the next definition of a
/// function it wraps with `dlsym(RTLD_NEXT, …)`, as interposers do. glibc
/// resolves RTLD_NEXT after the object that called `dlsym`, found by its
/// return address; the hook's exported `dlsym` must hand the call on with
/// the caller's return address, or the wrapper finds itself again and
/// recurses until the stack runs out.
#[test]
fn rtld_next_from_a_library_preloaded_after_the_hook_finds_the_next_definition() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let write = |name: &str, text: &str| {
        std::fs::write(d.join(name), text).unwrap();
        d.join(name)
    };
    let base = write("base.c", "int probe(void) { return 1; }\n");
    let wrap = write(
        "wrap.c",
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
int probe(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "probe");
    return next ? 100 + next() : -1;
}
"#,
    );
    let main = write(
        "main.c",
        "#include <stdio.h>\nint probe(void);\nint main(void) { printf(\"%d\\n\", probe()); return 0; }\n",
    );
    let build = |args: &[&Path]| {
        let out = aarch64::cc().args(args).output().expect("run zig cc");
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    let (libbase, libwrap, prog) = (d.join("libbase.so"), d.join("libwrap.so"), d.join("prog"));
    let shared = Path::new("-shared");
    let pic = Path::new("-fPIC");
    let o = Path::new("-o");
    build(&[shared, pic, o, &libbase, &base]);
    build(&[shared, pic, o, &libwrap, &wrap, Path::new("-ldl")]);
    build(&[o, &prog, &main, &libbase]);

    let run = |preload: String| {
        let out = aarch64::command(&prog)
            .env("LD_LIBRARY_PATH", d)
            .env("LD_PRELOAD", preload)
            .output()
            .expect("run qemu-aarch64-static");
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    // Without the hook: the wrapper, then the base.
    assert_eq!(run(libwrap.display().to_string()).1.trim(), "101");
    let hook = aarch64::dist_dir().join("libvgpu.so");
    let (ok, out, err) = run(format!("{} {}", hook.display(), libwrap.display()));
    assert!(ok && out.trim() == "101", "under the hook: {out}{err}");
}
