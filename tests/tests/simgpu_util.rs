//! Utilization follows the kernels that were launched: idle, back to back,
//! a duty cycle, and per-process attribution between two processes.

use std::process::Command;
use std::time::Duration;

use vgpu_tests::sim::{c_program, fields, Running, SimGpu};

/// NVML's device utilization, read by the C tool through the simulated
/// libnvidia-ml.
fn nvml_util(gpu: &SimGpu) -> u64 {
    let out = gpu
        .apply(Command::new(c_program("simgpu_nvml")).arg("util"))
        .output()
        .expect("run simgpu_nvml");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fields(text.lines().next().unwrap_or_default())[0]
}

/// Per-process samples `(pid, smUtil)` from nvmlDeviceGetProcessUtilization.
fn nvml_samples(gpu: &SimGpu, us_ago: u64) -> Vec<(u32, u64)> {
    let out = gpu
        .apply(Command::new(c_program("simgpu_nvml")).args(["putil", &us_ago.to_string()]))
        .output()
        .expect("run simgpu_nvml");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter(|l| l.starts_with("sample "))
        .map(|l| {
            let f = fields(l);
            (f[0] as u32, f[1])
        })
        .collect()
}

#[test]
fn idle_device_reads_zero() {
    let gpu = SimGpu::new();
    let mut a = Running::start(&gpu, &c_program("simgpu_tool"), &["hold"]);
    a.line("ready");
    assert_eq!(nvml_util(&gpu), 0);
    assert!(nvml_samples(&gpu, 0).is_empty(), "no kernels, no samples");
    assert!(a.finish().success());
}

#[test]
fn back_to_back_kernels_read_100() {
    let gpu = SimGpu::builder().sample_ms(200).build();
    let tool = c_program("simgpu_tool");
    let mut a = Running::start(&gpu, &tool, &["launch", "busy_1ms", "1500", "hold"]);
    std::thread::sleep(Duration::from_millis(400));
    let u = nvml_util(&gpu);
    assert!(u >= 97, "back-to-back kernels: utilization {u}");
    let line = a.line("launch");
    let f = fields(&line);
    assert_eq!(f[0], 0);
    assert!((1500..1700).contains(&f[1]), "1500 x 1 ms took {} ms", f[1]);
    a.line("ready");
    // Finished: the window empties again.
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(nvml_util(&gpu), 0);
    assert!(a.finish().success());
}

#[test]
fn duty_cycle_50_reads_50() {
    let gpu = SimGpu::builder().sample_ms(1000).build();
    let mut a = Running::start(
        &gpu,
        &c_program("simgpu_tool"),
        &["duty", "10000", "50", "3000", "hold"],
    );
    std::thread::sleep(Duration::from_millis(1300));
    let reads: Vec<u64> = (0..4)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(200));
            nvml_util(&gpu)
        })
        .collect();
    let mean = reads.iter().sum::<u64>() as f64 / reads.len() as f64;
    assert!(
        (45.0..=55.0).contains(&mean),
        "50% duty cycle reads {reads:?}"
    );
    let samples = nvml_samples(&gpu, 0);
    assert_eq!(samples.len(), 1, "{samples:?}");
    assert_eq!(samples[0].0, a.pid(), "host pid of the launcher");
    assert!((45..=55).contains(&samples[0].1), "{samples:?}");
    a.line("duty");
    assert!(a.finish().success());
}

#[test]
fn per_process_samples_attribute_to_each_process() {
    let gpu = SimGpu::builder().sample_ms(1000).build();
    let tool = c_program("simgpu_tool");
    let mut a = Running::start(&gpu, &tool, &["duty", "3000", "30", "3000", "hold"]);
    let mut b = Running::start(&gpu, &tool, &["duty", "6000", "60", "3000", "hold"]);
    std::thread::sleep(Duration::from_millis(1500));
    let samples = nvml_samples(&gpu, 0);
    let total = nvml_util(&gpu);
    let get = |pid: u32| samples.iter().find(|s| s.0 == pid).map(|s| s.1);
    let (ua, ub) = (get(a.pid()), get(b.pid()));
    assert!(
        ua.is_some_and(|u| (25..=35).contains(&u)),
        "A at 30%: {samples:?}"
    );
    assert!(
        ub.is_some_and(|u| (55..=65).contains(&u)),
        "B at 60%: {samples:?}"
    );
    assert!((84..=96).contains(&total), "device at 90%: {total}");
    // A sample since "now" names nobody until new work runs after it.
    a.line("duty");
    b.line("duty");
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        nvml_samples(&gpu, 1).is_empty(),
        "nothing ran in the last microsecond"
    );
    assert!(a.finish().success());
    assert!(b.finish().success());
}
