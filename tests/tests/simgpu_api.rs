//! The simulated libcuda / libnvidia-ml as programs use them: linked with
//! -lcuda (the whole API surface, in `tests/c/simgpu_api.c`), loaded with
//! dlopen by name, and through the nvml-wrapper crate (as the loader does).

use std::process::Command;

use vgpu_tests::dist::c_dir;
use vgpu_tests::sim::{c_program, SimGpu};

#[test]
fn c_program_linked_with_lcuda_exercises_the_api() {
    let gpu = SimGpu::builder()
        .memory("1g")
        .context_bytes("100m")
        .sms(132)
        .build();
    let out = gpu
        .apply(&mut Command::new(c_program("simgpu_api")))
        .output()
        .expect("run simgpu_api");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    // Kernels the device ran: 6 entry points, 1 + 100 timed with events,
    // 2 through library kernels, 3 graph launches x 3 kernel nodes, 1
    // captured graph of 2 kernels, 1 through cuGetProcAddress. Rejected
    // and captured launches do not count.
    assert_eq!(gpu.launches(0), 6 + 1 + 100 + 2 + 3 * 3 + 2 + 1);
    assert_eq!(gpu.used(0), 0, "the process exited");
}

#[test]
fn dlopen_by_name_through_ld_library_path() {
    let gpu = SimGpu::builder().devices(2).build();
    let dir = std::env::temp_dir().join(format!("simgpu-dlopen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let exe = dir.join("simgpu_dlopen");
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(c_dir().join("simgpu_dlopen.c"))
        .arg("-I")
        .arg(c_dir())
        .arg("-ldl")
        .output()
        .expect("cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let ldd = Command::new("ldd").arg(&exe).output().expect("ldd");
    assert!(
        !String::from_utf8_lossy(&ldd.stdout).contains("libcuda"),
        "must not be linked with libcuda"
    );
    let out = gpu.apply(&mut Command::new(&exe)).output().expect("run");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn symbols_resolve_ptsz_variants_and_soname() {
    let sim = vgpu_tests::dist::sim_dir();
    for (lib, soname) in [
        ("libcuda.so.1", "libcuda.so.1"),
        ("libnvidia-ml.so.1", "libnvidia-ml.so.1"),
    ] {
        let out = Command::new("readelf")
            .arg("-d")
            .arg(sim.join(lib))
            .output()
            .expect("readelf");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("[{soname}]")), "{lib}: {text}");
    }
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(sim.join("libcuda.so.1"))
        .output()
        .expect("nm");
    let syms = String::from_utf8_lossy(&out.stdout);
    for s in [
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuLaunchKernelEx",
        "cuLaunchKernelEx_ptsz",
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernel_ptsz",
        "cuGraphLaunch",
        "cuGraphLaunch_ptsz",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuMemAllocFromPoolAsync",
        "cuGraphAddMemAllocNode",
        "simgpu_set_kernel_ns",
    ] {
        assert!(
            syms.lines().any(|l| l.split_whitespace().last() == Some(s)),
            "libcuda.so.1 does not export {s}"
        );
    }
}
