//! What a cluster sees of `vgpu daemon` (root, simulated GPU, real eBPF on a
//! per-test libcuda copy): HAMi's labels on every `hami_*` series, the pods
//! named from a `/var/log/pods`-style fixture, and logs a collector can
//! read (no escape codes when stderr is a file, JSON on request).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::dist;
use vgpu_tests::http::{free_port, get};
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::{eventually, poll_until};

struct Daemon {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, gpu: &SimGpu, extra: &[&str]) -> Daemon {
        let port = free_port();
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
        let ready = poll_until(Duration::from_secs(30), || {
            get(port, "/readyz").map(|(s, _)| s) == Some(200)
        });
        assert!(
            ready.is_some(),
            "daemon not ready within 30 s: {}",
            std::fs::read_to_string(&d.log).unwrap_or_default()
        );
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

/// A region file as HAMi's device plugin names it (a random UUID).
const HAMI_REGION_FILE: &str = "6f9619ff-8b86-4d01-b42d-00c04fc964ff.cache";

#[test]
fn every_hami_series_carries_hamis_labels_with_the_pods_names() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let dir = fixture();
    // HAMi's layout, at its full length: the node's region directory, one
    // directory per container, a region file named by a UUID.
    let root = dir.path().join("usr/local/vgpu/containers");
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
                region_dir.join(HAMI_REGION_FILE),
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
                .join(HAMI_REGION_FILE),
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
    let text = eventually(
        Duration::from_secs(10),
        "both pods named in /metrics",
        || {
            let (code, body) = get(d.port, "/metrics").unwrap();
            assert_eq!(code, 200);
            PODS.iter()
                .all(|p| body.contains(&format!("pod=\"{}\"", p.name)))
                .then_some(body)
        },
    );

    let mut per_pod = [0usize; 2];
    let mut host = 0;
    for line in text.lines().filter(|l| l.starts_with("hami_")) {
        let Some((name, labels)) = parse_sample(line) else {
            panic!("unlabelled HAMi series: {line}");
        };
        if name.starts_with("hami_host_") {
            // HAMi's host labels, the simulated GPU's NVML behind them
            // (HAMi v2.10 gives its memory controller series no `node`).
            assert_eq!(
                labels.contains(&("node", "gpu-node-1")),
                name != "hami_host_gpu_memory_controller_utilization_ratio",
                "{line}"
            );
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
    // HAMi's own paths and the pods' names are no tenant's doing.
    assert_eq!(
        text.lines()
            .find_map(|l| l.strip_prefix(r#"vgpu_containers_over_bound{bound="label_bytes"} "#)),
        Some("0"),
        "{text}"
    );
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
        // One shape for every line, tracing's and the daemon's own (start,
        // stop): a collector may key on the order.
        let at = |k: &str| line.find(&format!("\"{k}\":")).unwrap();
        assert!(line.starts_with("{\"timestamp\":"), "{line}");
        assert!(
            at("level") < at("fields") && at("fields") < at("target"),
            "keys out of order: {line}"
        );
    }
    // The missing pods directory is warned about once; start and stop lines.
    assert!(levels.iter().any(|l| l == "WARN"), "{text}");
    assert!(text.contains("probes detached"), "{text}");
}

/// Identifiers of a PromQL expression: `(metrics, labels)` it names. Labels
/// are those of matchers, `by`/`without`/`on`/`ignoring` lists and the
/// second argument of Grafana's `label_values(metric, label)`.
fn promql_names(expr: &str) -> (Vec<String>, Vec<String>) {
    const AGGREGATIONS: [&str; 12] = [
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
    ];
    const KEYWORDS: [&str; 8] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
    ];
    // Quoted strings hold values and `$variables`, never names.
    let mut text = String::new();
    let mut quoted = false;
    for c in expr.chars() {
        if c == '"' {
            quoted = !quoted;
            text.push(' ');
        } else if !quoted {
            text.push(c);
        }
    }
    let b: Vec<char> = text.chars().collect();
    let (mut metrics, mut labels) = (Vec::new(), Vec::new());
    let (mut braces, mut brackets, mut label_list, mut label_values_arg) = (0, 0, false, None);
    let mut parens = 0i32;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == '_' || b[i] == ':') {
                i += 1;
            }
            let word: String = b[start..i].iter().collect();
            let next = b[i..].iter().find(|c| !c.is_whitespace()).copied();
            if brackets > 0 {
                continue; // a duration
            }
            if braces > 0 || label_list {
                labels.push(word);
            } else if label_values_arg == Some(parens) && !metrics.is_empty() && next == Some(')') {
                labels.push(word);
                label_values_arg = None;
            } else if KEYWORDS.contains(&word.as_str()) {
                label_list = next == Some('(');
            } else if next == Some('(') || AGGREGATIONS.contains(&word.as_str()) {
                if word == "label_values" {
                    label_values_arg = Some(parens + 1);
                }
            } else {
                metrics.push(word);
            }
            continue;
        }
        match c {
            '{' => braces += 1,
            '}' => braces -= 1,
            '[' => brackets += 1,
            ']' => brackets -= 1,
            '(' => parens += 1,
            ')' => {
                parens -= 1;
                label_list = false;
            }
            _ => {}
        }
        i += 1;
    }
    (metrics, labels)
}

#[test]
fn promql_names_are_told_apart() {
    let (m, l) = promql_names(
        r#"100 * sum by (kind, node) (rate(vgpu_x_total{a=~"$v", b!="q"}[5m])) / (hami_y{c="1"} > 0)"#,
    );
    assert_eq!(m, ["vgpu_x_total", "hami_y"]);
    assert_eq!(l, ["kind", "node", "a", "b", "c"]);
    let (m, l) = promql_names(r#"label_values(hami_z{namespace=~"$namespace"}, pod)"#);
    assert_eq!(
        (m, l),
        (
            vec!["hami_z".to_owned()],
            vec!["namespace".to_owned(), "pod".to_owned()]
        )
    );
}

/// Labels Prometheus adds to every scraped series (the target's), which
/// alert rules may group by though `/metrics` does not carry them.
const TARGET_LABELS: [&str; 5] = ["instance", "job", "namespace", "pod", "service"];

/// Every alert of deploy/components/prometheusrule names only metrics of
/// the daemon's `/metrics` (`metrics`), or `up`, and label names they carry
/// or a target's; every `kind` it matches is one the daemon exports.
fn check_alert_rules(metrics: &str) {
    let path = dist::workspace_root().join("deploy/components/prometheusrule/prometheusrule.yaml");
    let rule: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut checked = 0;
    for g in rule["spec"]["groups"].as_sequence().unwrap() {
        for a in g["rules"].as_sequence().unwrap() {
            let expr = a["expr"].as_str().unwrap();
            let (names, labels) = promql_names(expr);
            assert!(!names.is_empty(), "no metric in {expr}");
            for n in names.iter().filter(|n| *n != "up") {
                assert!(
                    metrics.lines().any(
                        |l| l.starts_with(&format!("{n}{{")) || l.starts_with(&format!("{n} "))
                    ),
                    "{expr}: no metric {n} in /metrics:\n{metrics}"
                );
            }
            // Each label on every metric of the expression (the daemon's
            // own series, where it names a node or a pod), or a target's.
            for l in &labels {
                let on = |n: &str| {
                    metrics.lines().any(|line| {
                        line.starts_with(&format!("{n}{{"))
                            && (line.contains(&format!("{{{l}=\""))
                                || line.contains(&format!(",{l}=\"")))
                    })
                };
                let daemon_label = ["node", "namespace", "pod"].contains(&l.as_str());
                assert!(
                    names.iter().all(|n| if n == "up" {
                        // The ServiceMonitor relabels the target's node.
                        TARGET_LABELS.contains(&l.as_str()) || l == "node"
                    } else {
                        on(n) || (!daemon_label && TARGET_LABELS.contains(&l.as_str()))
                    }),
                    "{expr}: label {l} is not on the series of {names:?}"
                );
            }
            for quoted in expr.split("kind=").skip(1) {
                let values = quoted
                    .trim_start_matches('~')
                    .trim_start_matches('"')
                    .split('"')
                    .next()
                    .unwrap();
                for v in values.split('|') {
                    assert!(
                        metrics.contains(&format!("kind=\"{v}\"")),
                        "{expr}: kind {v} is not exported"
                    );
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 4, "{checked} alerts");
}

/// Every query of deploy/grafana/vgpu-dashboard.json names only metrics
/// and labels present in `metrics` (the daemon's `/metrics` text); legend
/// `{{label}}`s count as labels of their query.
fn check_dashboard(metrics: &str) {
    let path = dist::workspace_root().join("deploy/grafana/vgpu-dashboard.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // name -> every label seen on its samples.
    let mut have: std::collections::HashMap<&str, std::collections::HashSet<&str>> =
        std::collections::HashMap::new();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        match parse_sample(line) {
            Some((name, labels)) => have
                .entry(name)
                .or_default()
                .extend(labels.iter().map(|(k, _)| *k)),
            None => {
                if let Some((name, _)) = line.split_once(' ') {
                    have.entry(name).or_default();
                }
            }
        }
    }
    let mut queries: Vec<(String, String)> = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            queries.push((
                t["expr"].as_str().unwrap().to_owned(),
                t["legendFormat"].as_str().unwrap_or("").to_owned(),
            ));
        }
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"]["query"].as_str() {
            queries.push((q.to_owned(), String::new()));
        }
    }
    assert!(queries.len() >= 15, "{queries:?}");
    let mut checked = std::collections::HashSet::new();
    for (expr, legend) in &queries {
        let (names, mut labels) = promql_names(expr);
        assert!(!names.is_empty(), "no metric in {expr}");
        labels.extend(
            legend
                .split("{{")
                .skip(1)
                .filter_map(|s| s.split_once("}}").map(|(l, _)| l.trim().to_owned())),
        );
        for n in &names {
            let Some(l) = have.get(n.as_str()) else {
                panic!("{path:?}: {expr}: no metric {n} in /metrics:\n{metrics}");
            };
            checked.insert(n.clone());
            for label in &labels {
                assert!(
                    names.iter().any(|m| have
                        .get(m.as_str())
                        .is_some_and(|s| s.contains(label.as_str()))),
                    "{path:?}: {expr}: label {label} on none of {names:?} ({n} has {l:?})"
                );
            }
        }
    }
    // What the issue asks the dashboard to show.
    for m in [
        "hami_vgpu_memory_used_bytes",
        "hami_vgpu_memory_limit_bytes",
        "hami_container_device_utilization_ratio",
        "vgpu_sm_limit_percent",
        "vgpu_untracked_bytes",
        "vgpu_findings",
        "vgpu_dead_slots",
        "vgpu_container_launches_total",
        "hami_host_gpu_memory_used_bytes",
        "hami_host_gpu_utilization_ratio",
    ] {
        assert!(checked.contains(m), "the dashboard does not show {m}");
    }
}

fn value_of(text: &str, name: &str, pod: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| l.contains(&format!("pod=\"{pod}\"")))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

/// `vgpu_region_passes_total` in `/metrics` text.
fn region_passes(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("vgpu_region_passes_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no vgpu_region_passes_total in:\n{text}"))
}

/// Two containers (PID namespaces, own regions under HAMi's directory), one
/// SM-limited (30 %) and one not, both busy, plus an unhooked CUDA process
/// (a `no_region` finding): every container's utilization is in `/metrics`
/// within 5 points of what the simulator says each used, the unlimited
/// container's slot carries it for HAMi's monitor, `vgpu top --json` shows
/// both with the daemon's measurement, and the Grafana dashboard names only
/// what `/metrics` has.
#[test]
fn busy_containers_are_measured_shown_by_top_and_fit_the_dashboard() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let dir = fixture();
    let root = dir.path().join("containers");
    let logs = dir.path().join("pods");
    let sm_loop = dist::compile_c("sm_loop", dir.path(), false);
    let tool = vgpu_tests::sim::c_program("simgpu_tool");
    // This test's libcuda copy first, so the daemon's probes see them.
    let ld = format!(
        "LD_LIBRARY_PATH={}:{}",
        dir.path().join("lib").display(),
        gpu.lib_dir().display()
    );
    let mut running = Vec::new();
    for (p, sm) in PODS.iter().zip(["30", "0"]) {
        std::fs::create_dir_all(
            logs.join(format!("{}_{}_{}", p.namespace, p.name, p.uid))
                .join(p.container),
        )
        .unwrap();
        let region_dir = root.join(format!("{}_{}", p.uid, p.container));
        std::fs::create_dir_all(&region_dir).unwrap();
        let mut c = Command::new("env");
        c.arg(&ld)
            .args(["unshare", "--pid", "--fork", "--mount-proc"])
            .arg(&sm_loop)
            .args(["kernel", "busy_1000us", "16"])
            .env("LD_PRELOAD", dist::hook_lib())
            .env(
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                region_dir.join("r.cache"),
            )
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", p.limit)
            .env("CUDA_DEVICE_SM_LIMIT", sm)
            .env("GPU_CORE_UTILIZATION_POLICY", "force");
        let mut r = vgpu_tests::sim::Running::start_cmd(&gpu, &mut c);
        r.line("ready");
        running.push(r);
    }
    let mut bare = Command::new("env");
    bare.arg(&ld).arg(&tool).args(["alloc", "1048576", "hold"]);
    let mut bare = vgpu_tests::sim::Running::start_cmd(&gpu, &mut bare);
    bare.line("ready");

    let state = dir.path().join("state");
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
            "--interval",
            "0.25",
            "--slot-grace",
            "0.5",
        ],
    );
    // Host PIDs of the two workloads (unshare's child), as the simulator
    // records them.
    let host_pids: Vec<u32> = running
        .iter()
        .map(|r| {
            let kids =
                std::fs::read_to_string(format!("/proc/{}/task/{}/children", r.pid(), r.pid()))
                    .unwrap_or_default();
            // env exec'd unshare, which forked the workload.
            kids.split_whitespace().next().unwrap().parse().unwrap()
        })
        .collect();
    // Wait until both containers' processes are matched and measured.
    let measured = eventually(
        Duration::from_secs(8),
        "utilization measured for both containers and the no_region finding",
        || {
            let (_, body) = get(d.port, "/metrics").unwrap();
            let ok = PODS.iter().all(|p| {
                value_of(&body, "hami_container_device_utilization_ratio", p.name).unwrap_or(0.0)
                    > 0.0
            }) && body.contains("vgpu_findings{node=\"gpu-node-1\",kind=\"no_region\"} 1");
            ok.then_some(body)
        },
    );
    // The first value covered the workloads' start. Values are refreshed
    // by the region pass, so from the next pass on every value is a whole
    // window of the running workloads.
    let pass = region_passes(&measured);
    eventually(Duration::from_secs(5), "one region pass more", || {
        let (_, body) = get(d.port, "/metrics").unwrap();
        region_passes(&body) > pass
    });
    // The metric, averaged over 3 s of scrapes, against the simulator's
    // truth over the same 3 s.
    let scraper = {
        let port = d.port;
        std::thread::spawn(move || {
            let mut sums = [0.0f64; 2];
            let mut n = 0.0;
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(3) {
                let (_, body) = get(port, "/metrics").unwrap();
                for (i, p) in PODS.iter().enumerate() {
                    sums[i] +=
                        value_of(&body, "hami_container_device_utilization_ratio", p.name).unwrap();
                }
                n += 1.0;
                std::thread::sleep(Duration::from_millis(50));
            }
            (sums[0] / n, sums[1] / n)
        })
    };
    let truth = gpu.process_shares(Duration::from_secs(3), &host_pids);
    let (limited, unlimited) = scraper.join().unwrap();
    eprintln!(
        "utilization: limited container {limited:.1} % (simulator {:.1} %), unlimited {unlimited:.1} % (simulator {:.1} %)",
        truth[0], truth[1]
    );
    assert!(truth[0] > 5.0 && truth[1] > 5.0, "both busy: {truth:?}");
    assert!(
        (limited - truth[0]).abs() <= 5.0,
        "limited: {limited} vs {}",
        truth[0]
    );
    assert!(
        (unlimited - truth[1]).abs() <= 5.0,
        "unlimited: {unlimited} vs {}",
        truth[1]
    );

    // HAMi's monitor reads the slots: the daemon filled the unlimited one.
    let region_b = root
        .join(format!("{}_{}", PODS[1].uid, PODS[1].container))
        .join("r.cache");
    let f = RegionFile::open(&region_b, Access::ReadOnly).unwrap();
    let slot_util: u64 = f
        .region()
        .active_slots()
        .iter()
        .map(|s| {
            s.device_util[0]
                .sm_util
                .load(std::sync::atomic::Ordering::SeqCst)
        })
        .sum();
    assert!(slot_util > 0, "the unlimited container's slot sm_util is 0");

    // vgpu top --json: both containers, their processes (namespace PID 1,
    // host PID known), both utilizations, their launches over a 1 s window,
    // and the daemon's state read.
    let out = Command::new(dist::vgpu_bin())
        .args(["top", "--json", "--json-window", "1", "--root"])
        .arg(&root)
        .arg("--state-dir")
        .arg(&state)
        .arg("--pods-log-dir")
        .arg(&logs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let top: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(top["daemon"], true, "{top:#}");
    assert_eq!(top["daemon_utilization"], true, "{top:#}");
    let rows = top["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{top:#}");
    let mut top_rates = Vec::new();
    for (p, host) in PODS.iter().zip(&host_pids) {
        let row = rows
            .iter()
            .find(|r| r["pod_uid"] == p.uid)
            .unwrap_or_else(|| panic!("no row for {}: {top:#}", p.name));
        assert_eq!(row["container"], p.container);
        // Named as the daemon's labels name it, not by UID.
        assert_eq!(row["pod"], format!("{}/{}", p.namespace, p.name), "{row:#}");
        assert_eq!(row["memory_limit_bytes"], p.limit_bytes);
        assert!(
            row["memory_used_bytes"].as_u64().unwrap() >= 64 << 20,
            "{row:#}"
        );
        // The daemon's measurement (the limited container's slot holds the
        // hook's, which may differ).
        assert_eq!(row["sm_util_source"], "daemon", "{row:#}");
        assert!(row["sm_util_percent"].as_u64().unwrap() > 0, "{row:#}");
        let procs = row["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 1, "{row:#}");
        assert_eq!(procs[0]["pid"], 1, "{row:#}");
        assert_eq!(procs[0]["hostpid"], *host, "{row:#}");
        assert!(row["launches_total"].as_u64().unwrap() > 0, "{row:#}");
        top_rates.push(row["launches_per_sec"].as_f64().unwrap());
    }
    assert_eq!(
        rows[0]["sm_limit_percent"].as_u64().unwrap()
            + rows[1]["sm_limit_percent"].as_u64().unwrap(),
        130,
        "{top:#}"
    );

    // The dashboard, against this /metrics (findings included).
    let (_, body) = get(d.port, "/metrics").unwrap();
    assert!(body.contains("vgpu_untracked_bytes{"), "{body}");
    for p in PODS {
        let n = value_of(&body, "vgpu_container_launches_total", p.name).unwrap_or(0.0);
        assert!(n > 0.0, "no launches counted for {}:\n{body}", p.name);
    }
    check_dashboard(&body);
    check_alert_rules(&body);

    // Each program's own launch rate (its launches over its run) against
    // what vgpu top measured over its window.
    for ((mut r, p), top_rate) in running.into_iter().zip(PODS).zip(top_rates) {
        let n: f64 = r.line("launches ")["launches ".len()..].parse().unwrap();
        let secs: f64 = r.line("seconds ")["seconds ".len()..].parse().unwrap();
        let own = n / secs;
        eprintln!(
            "{}: vgpu top {top_rate:.0} launches/s, the program {own:.0}/s",
            p.name
        );
        assert!(
            (top_rate - own).abs() <= 0.2 * own,
            "{}: vgpu top {top_rate} launches/s, the program {own}",
            p.name
        );
        r.kill();
    }
    d.stop();
    bare.kill();
}

/// An idle node: no GPU process and not even a libcuda yet (the driver's
/// library comes with the first GPU pod). The daemon is ready anyway, so a
/// rollout does not wait for a workload, and probes the library once it
/// appears.
#[test]
fn ready_on_a_node_with_no_gpu_process_and_no_libcuda_yet() {
    let gpu = SimGpu::new();
    let dir = tempfile::Builder::new()
        .prefix("vgpu-idle-")
        .tempdir()
        .unwrap();
    let lib = dir.path().join("lib/libcuda.so.1");
    assert!(!lib.exists());
    // start() waits for /readyz 200 (30 s at most) and fails otherwise.
    let d = Daemon::start(dir.path(), &gpu, &["--no-nvml", "--rescan", "0.5"]);
    let (status, body) = get(d.port, "/readyz").unwrap();
    assert_eq!(status, 200, "{body}");

    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    std::fs::copy(dist::sim_dir().join("libcuda.so.1"), &lib).unwrap();
    let log = || std::fs::read_to_string(&d.log).unwrap_or_default();
    let probed = poll_until(Duration::from_secs(20), || {
        let log = log();
        log.contains("probing") && log.contains("libcuda.so.1")
    });
    assert!(
        probed.is_some(),
        "the library that appeared was not probed within 20 s:\n{}",
        log()
    );
    assert_eq!(get(d.port, "/readyz").unwrap().0, 200);
    d.stop();
}
