//! The nvml-wrapper crate (what the loader uses) works against the
//! simulated libnvidia-ml.so.1. One test per binary: it sets this process's
//! SIMGPU_DIR.

use std::process::Command;

use nvml_wrapper::Nvml;
use vgpu_tests::sim::{c_program, Running, SimGpu};

#[test]
fn nvml_wrapper_reads_devices_memory_processes_and_utilization() {
    let gpu = SimGpu::builder()
        .devices(2)
        .memory("16g")
        .context_bytes("200m")
        .build();
    // SAFETY-free in edition 2021; this binary has a single test.
    std::env::set_var("SIMGPU_DIR", gpu.dir());
    std::env::set_var("SIMGPU_SAMPLE_MS", "500");
    let nvml = Nvml::builder()
        .lib_path(gpu.lib_dir().join("libnvidia-ml.so.1").as_os_str())
        .init()
        .expect("nvml init");
    assert_eq!(nvml.device_count().expect("count"), 2);
    assert_eq!(nvml.sys_cuda_driver_version().expect("cuda version"), 13000);
    let dev = nvml.device_by_index(0).expect("device 0");
    let uuid = dev.uuid().expect("uuid");
    assert!(uuid.starts_with("GPU-"), "{uuid}");
    assert_eq!(
        nvml.device_by_uuid(uuid.as_str())
            .expect("by uuid")
            .index()
            .expect("index"),
        0
    );
    assert_ne!(
        nvml.device_by_index(1)
            .expect("dev 1")
            .uuid()
            .expect("uuid"),
        uuid
    );

    let mut a = Running::start_cmd(
        &gpu,
        Command::new(c_program("simgpu_tool")).args([
            "alloc",
            "1073741824",
            "duty",
            "5000",
            "50",
            "1500",
            "hold",
        ]),
    );
    a.line("alloc");
    std::thread::sleep(std::time::Duration::from_millis(800));
    let mem = dev.memory_info().expect("memory info");
    assert_eq!(mem.total, 16 << 30);
    assert_eq!(mem.used, (1 << 30) + (200 << 20));
    let procs = dev.running_compute_processes().expect("processes");
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, a.pid());
    let util = dev.utilization_rates().expect("utilization").gpu;
    assert!((40..=60).contains(&util), "{util}");
    let samples = dev
        .process_utilization_stats(None)
        .expect("process utilization");
    assert!(
        samples.iter().any(|s| s.pid == a.pid() && s.sm_util >= 40),
        "{samples:?}"
    );
    a.line("duty");
    assert!(a.finish().success());
    assert!(nvml
        .device_by_index(1)
        .expect("dev 1")
        .running_compute_processes()
        .expect("procs")
        .is_empty());
}
