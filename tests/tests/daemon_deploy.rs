//! What a cluster sees of `vgpu daemon` (root, simulated GPU, real eBPF on a
//! per-test libcuda copy): HAMi's labels on every `hami_*` series, the pods
//! named from a `/var/log/pods`-style fixture, and logs a collector can
//! read (no escape codes when stderr is a file, JSON on request).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::dist;
use vgpu_tests::sim::SimGpu;

struct Daemon {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, gpu: &SimGpu, extra: &[&str]) -> Daemon {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.join(format!("daemon-{port}.log"));
        let child = Command::new(dist::vgpu_bin())
            .arg("-v")
            .arg("daemon")
            .arg("--libcuda")
            .arg(dir.join("lib/libcuda.so.1"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(extra)
            .envs(gpu.envs())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn vgpu daemon");
        let d = Daemon { child, port, log };
        let t = Instant::now();
        while get(port, "/readyz").map(|(s, _)| s) != Some(200) {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "daemon not ready: {}",
                std::fs::read_to_string(&d.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    /// SIGTERM and wait; returns the log's bytes.
    fn stop(mut self) -> Vec<u8> {
        // SAFETY: signalling the daemon this test started.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert!(self.child.wait().unwrap().success());
        std::fs::read(&self.log).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    Some((
        head.split_whitespace().nth(1)?.parse().ok()?,
        body.to_owned(),
    ))
}

/// A sample line's name and labels.
fn parse_sample(line: &str) -> Option<(&str, Vec<(&str, &str)>)> {
    let (name, rest) = line.split_once('{')?;
    let (labels, _) = rest.rsplit_once("} ")?;
    let labels = labels
        .split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k, v.trim_matches('"')))
        })
        .collect();
    Some((name, labels))
}

fn fixture() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("vgpu-deploy-")
        .tempdir()
        .unwrap();
    std::fs::create_dir_all(dir.path().join("lib")).unwrap();
    std::fs::copy(
        dist::sim_dir().join("libcuda.so.1"),
        dir.path().join("lib/libcuda.so.1"),
    )
    .unwrap();
    dir
}

struct Pod {
    namespace: &'static str,
    name: &'static str,
    uid: &'static str,
    container: &'static str,
    limit: &'static str,
    limit_bytes: u64,
}

const PODS: [Pod; 2] = [
    Pod {
        namespace: "ml-team",
        name: "trainer-0",
        uid: "6a1f3c2e-0b1d-4e5f-8a9b-0c1d2e3f4a5b",
        container: "main",
        limit: "1g",
        limit_bytes: 1 << 30,
    },
    Pod {
        namespace: "default",
        name: "notebook-7c9d8-xk2lp",
        uid: "f0e1d2c3-b4a5-4968-8776-655443322110",
        container: "jupyter",
        limit: "2g",
        limit_bytes: 2 << 30,
    },
];

#[test]
fn every_hami_series_carries_hamis_labels_with_the_pods_names() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let dir = fixture();
    let root = dir.path().join("containers");
    let logs = dir.path().join("pods");
    let exe = dist::compile_c("demo_workload", dir.path(), false);
    for p in &PODS {
        // The kubelet's log directory and HAMi's region directory of the pod.
        std::fs::create_dir_all(
            logs.join(format!("{}_{}_{}", p.namespace, p.name, p.uid))
                .join(p.container),
        )
        .unwrap();
        let region_dir = root.join(format!("{}_{}", p.uid, p.container));
        std::fs::create_dir_all(&region_dir).unwrap();
        let out = Command::new(&exe)
            .envs(gpu.envs())
            .env("LD_PRELOAD", dist::hook_lib())
            .env(
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                region_dir.join("r.cache"),
            )
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", p.limit)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    // Another pod's log directory, and junk: neither names these regions.
    std::fs::create_dir_all(
        logs.join("kube-system_coredns-1_0a0a0a0a-0000-0000-0000-000000000000"),
    )
    .unwrap();
    std::fs::create_dir_all(logs.join("not_a_pod_dir_name")).unwrap();
    let uuid = {
        let f = RegionFile::open(
            &root
                .join(format!("{}_{}", PODS[0].uid, PODS[0].container))
                .join("r.cache"),
            Access::ReadOnly,
        )
        .unwrap();
        let (u, n) = f.region().uuid(0);
        String::from_utf8_lossy(&u[..n]).into_owned()
    };
    assert!(uuid.starts_with("GPU-"), "{uuid}");

    let d = Daemon::start(
        dir.path(),
        &gpu,
        &[
            "--regions-root",
            root.to_str().unwrap(),
            "--pods-log-dir",
            logs.to_str().unwrap(),
            "--node-name",
            "gpu-node-1",
        ],
    );
    let t = Instant::now();
    let text = loop {
        let (code, body) = get(d.port, "/metrics").unwrap();
        assert_eq!(code, 200);
        if PODS
            .iter()
            .all(|p| body.contains(&format!("pod=\"{}\"", p.name)))
        {
            break body;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "pods never named:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    let mut per_pod = [0usize; 2];
    let mut host = 0;
    for line in text.lines().filter(|l| l.starts_with("hami_")) {
        let Some((name, labels)) = parse_sample(line) else {
            panic!("unlabelled HAMi series: {line}");
        };
        if name.starts_with("hami_host_") {
            // HAMi's host labels, the simulated GPU's NVML behind them.
            assert!(labels.contains(&("node", "gpu-node-1")), "{line}");
            assert!(labels.contains(&("device_uuid", uuid.as_str())), "{line}");
            host += 1;
            continue;
        }
        let get = |k: &str| {
            labels
                .iter()
                .find(|(l, _)| *l == k)
                .map(|(_, v)| *v)
                .unwrap_or_else(|| panic!("{line}: no {k} label"))
        };
        let i = PODS
            .iter()
            .position(|p| p.name == get("pod"))
            .unwrap_or_else(|| panic!("{line}: unknown pod"));
        let p = &PODS[i];
        assert_eq!(get("namespace"), p.namespace, "{line}");
        assert_eq!(get("container"), p.container, "{line}");
        assert_eq!(get("vdevice_index"), "0", "{line}");
        assert_eq!(get("device_uuid"), uuid, "{line}");
        if name == "hami_vgpu_memory_limit_bytes" {
            let v: f64 = line.rsplit_once(' ').unwrap().1.parse().unwrap();
            assert_eq!(v as u64, p.limit_bytes, "{line}");
        }
        per_pod[i] += 1;
    }
    // Every container series of HAMi's monitor, for each pod.
    for n in per_pod {
        assert!(n >= 7, "{per_pod:?}\n{text}");
    }
    assert!(host >= 1, "no host GPU series:\n{text}");
    d.stop();
}

#[test]
fn logs_have_no_escape_codes_in_a_file_and_are_json_on_request() {
    let gpu = SimGpu::new();
    let dir = fixture();
    let missing = dir.path().join("no-such-pods-dir");
    let args = ["--pods-log-dir", missing.to_str().unwrap(), "--no-nvml"];
    let text = Daemon::start(dir.path(), &gpu, &args).stop();
    assert!(
        text.split(|b| *b == b'\n').count() > 3,
        "-v logs info lines: {}",
        String::from_utf8_lossy(&text)
    );
    assert!(
        !text.contains(&0x1b),
        "escape byte in {}",
        String::from_utf8_lossy(&text)
    );

    let mut json_args = args.to_vec();
    json_args.extend(["--log-format", "json"]);
    let text = Daemon::start(dir.path(), &gpu, &json_args).stop();
    let text = String::from_utf8(text).unwrap();
    let mut levels = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["fields"]["message"].is_string(), "{line}");
        assert!(v["timestamp"].is_string(), "{line}");
        levels.push(v["level"].as_str().unwrap().to_owned());
    }
    // The missing pods directory is warned about once; start and stop lines.
    assert!(levels.iter().any(|l| l == "WARN"), "{text}");
    assert!(text.contains("probes detached"), "{text}");
}
