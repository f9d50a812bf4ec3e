//! What Prometheus and HAMi 2.5–2.8's dashboards read from `vgpu daemon`
//! (root, simulated GPU, real eBPF on a per-test libcuda copy):
//! `--legacy-metrics` adds the series of HAMi 2.8's vGPU monitor, name by
//! name and label by label; without it none appear; `/metrics` answers
//! OpenMetrics or the classic text format 0.0.4 as the `Accept` header
//! asks, each valid by a strict parser of its format.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::daemon::{Running, Workdir};
use vgpu_tests::dist;
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::eventually;

/// HAMi v2.8.0's `cmd/vGPUmonitor/metrics.go`: every descriptor's name and
/// variable labels. Its registerer is wrapped with `zone="vGPU"`
/// (`prometheus.WrapRegistererWith`), so each series also carries `zone`.
/// `Device_memory_desc_of_container` is sent as `prometheus.CounterValue`,
/// every other one as `GaugeValue`.
const HAMI_2_8: [(&str, &[&str]); 8] = [
    (
        "HostGPUMemoryUsage",
        &["deviceidx", "deviceuuid", "devicetype"],
    ),
    (
        "HostCoreUtilization",
        &["deviceidx", "deviceuuid", "devicetype"],
    ),
    (
        "vGPU_device_memory_usage_in_bytes",
        &[
            "podnamespace",
            "podname",
            "ctrname",
            "vdeviceid",
            "deviceuuid",
        ],
    ),
    (
        "vGPU_device_memory_limit_in_bytes",
        &[
            "podnamespace",
            "podname",
            "ctrname",
            "vdeviceid",
            "deviceuuid",
        ],
    ),
    (
        "Device_memory_desc_of_container",
        &[
            "podnamespace",
            "podname",
            "ctrname",
            "vdeviceid",
            "deviceuuid",
            "context",
            "module",
            "data",
            "offset",
        ],
    ),
    (
        "Device_utilization_desc_of_container",
        &[
            "podnamespace",
            "podname",
            "ctrname",
            "vdeviceid",
            "deviceuuid",
        ],
    ),
    (
        "Device_last_kernel_of_container",
        &[
            "podnamespace",
            "podname",
            "ctrname",
            "vdeviceid",
            "deviceuuid",
        ],
    ),
    (
        "MigInfo",
        &[
            "podnamespace",
            "podname",
            "ctrname",
            "vdeviceid",
            "deviceuuid",
            "instanceid",
        ],
    ),
];

/// Legacy series the daemon cannot have: HAMi takes `MigInfo` from the
/// scheduler's pod annotations (and only for MIG devices).
const NOT_EXPORTED: [&str; 1] = ["MigInfo"];

/// HAMi v2.10's addition from NVML's memory utilization rate.
const MEMORY_CONTROLLER: (&str, &[&str]) = (
    "hami_host_gpu_memory_controller_utilization_ratio",
    &["device_index", "device_uuid", "device_type"],
);

const OPENMETRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const CLASSIC_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Prometheus 2.x's default scrape `Accept` header.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
     application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

// ---------------------------------------------------------------------------
// Strict parsers of both formats.

#[derive(Debug, Default)]
struct Family {
    kind: String,
    help: Option<String>,
    samples: Vec<Sample>,
}

#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

#[derive(Clone, Copy, PartialEq)]
enum Fmt {
    OpenMetrics,
    Classic,
}

fn is_metric_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_' || ch == ':')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

/// HELP text: the classic format knows `\\` and `\n`; OpenMetrics also
/// `\"`, and forbids a bare `"`.
fn help_text(s: &str, fmt: Fmt) -> Result<String, String> {
    let mut out = String::new();
    let mut c = s.chars();
    while let Some(ch) = c.next() {
        match ch {
            '\\' => match c.next() {
                Some('\\') => out.push('\\'),
                Some('n') => out.push('\n'),
                Some('"') if fmt == Fmt::OpenMetrics => out.push('"'),
                e => return Err(format!("bad escape \\{e:?} in help {s:?}")),
            },
            '"' if fmt == Fmt::OpenMetrics => return Err(format!("bare quote in help {s:?}")),
            _ => out.push(ch),
        }
    }
    Ok(out)
}

/// `{k="v",...}` at the start of `s`: the labels and the rest.
fn labels(s: &str, fmt: Fmt) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut m = BTreeMap::new();
    let mut rest = s.strip_prefix('{').ok_or("no {")?;
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((m, r));
        }
        let (name, r) = rest
            .split_once("=\"")
            .ok_or(format!("no =\" in {rest:?}"))?;
        if !is_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        let mut value = String::new();
        let mut chars = r.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    e => return Err(format!("bad escape in label value: {e:?}")),
                },
                Some((i, '"')) => break i,
                Some((_, '\n')) | None => return Err("unterminated label value".into()),
                Some((_, ch)) => value.push(ch),
            }
        };
        if m.insert(name.to_owned(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &r[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
            // A trailing comma is allowed in 0.0.4 only.
            if rest.starts_with('}') && fmt == Fmt::OpenMetrics {
                return Err("trailing comma".into());
            }
        } else if !rest.starts_with('}') {
            return Err(format!("expected , or }} at {rest:?}"));
        }
    }
}

fn number(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ if s.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c)) && !s.is_empty() => {
            s.parse().map_err(|e| format!("bad number {s:?}: {e}"))
        }
        _ => Err(format!("bad number {s:?}")),
    }
}

/// The sample names a family of `kind` named `family` may hold.
fn sample_names(family: &str, kind: &str, fmt: Fmt) -> Vec<String> {
    let with = |sfx: &[&str]| sfx.iter().map(|s| format!("{family}{s}")).collect();
    match (fmt, kind) {
        (Fmt::OpenMetrics, "counter") => with(&["_total", "_created"]),
        (Fmt::OpenMetrics, "info") => with(&["_info"]),
        (_, "histogram") => with(&["_bucket", "_count", "_sum", "_created"]),
        (_, "summary") => with(&["", "_count", "_sum", "_created"]),
        _ => with(&[""]),
    }
}

/// Parses `text` as `fmt` strictly: every line, metadata before samples,
/// families not interleaved, sample names that fit their family's type, no
/// series twice; OpenMetrics ends in `# EOF`.
fn parse(text: &str, fmt: Fmt) -> Result<BTreeMap<String, Family>, String> {
    let kinds: &[&str] = match fmt {
        Fmt::OpenMetrics => &[
            "counter",
            "gauge",
            "histogram",
            "gaugehistogram",
            "stateset",
            "info",
            "summary",
            "unknown",
        ],
        Fmt::Classic => &["counter", "gauge", "histogram", "summary", "untyped"],
    };
    let body = match fmt {
        Fmt::OpenMetrics => text
            .strip_suffix("# EOF\n")
            .ok_or("OpenMetrics text must end with # EOF")?,
        Fmt::Classic => text,
    };
    if !body.is_empty() && !body.ends_with('\n') {
        return Err("last line has no newline".into());
    }
    let mut fams: BTreeMap<String, Family> = BTreeMap::new();
    let mut done: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut seen: HashSet<(String, BTreeMap<String, String>)> = HashSet::new();
    let mut open = |name: &str, current: &mut Option<String>| -> Result<(), String> {
        if current.as_deref() != Some(name) {
            if let Some(c) = current.take() {
                done.insert(c);
            }
            if done.contains(name) {
                return Err(format!("family {name} interleaved with another"));
            }
            *current = Some(name.to_owned());
        }
        Ok(())
    };
    for (n, line) in body.lines().enumerate() {
        let err = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.is_empty() {
            if fmt == Fmt::OpenMetrics {
                return Err(err("empty line".into()));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut parts = rest.strip_prefix(' ').unwrap_or(rest).splitn(3, ' ');
            let word = parts.next().unwrap_or("");
            let (name, arg) = (parts.next().unwrap_or(""), parts.next());
            match word {
                "HELP" | "TYPE" | "UNIT" => {}
                "EOF" => return Err(err("# EOF before the end".into())),
                // 0.0.4 allows other comments; OpenMetrics does not.
                _ if fmt == Fmt::Classic => continue,
                _ => return Err(err("unknown comment".into())),
            }
            if word == "UNIT" && fmt == Fmt::Classic {
                return Err(err("# UNIT in 0.0.4".into()));
            }
            if !is_metric_name(name) {
                return Err(err(format!("bad metric name {name:?}")));
            }
            open(name, &mut current).map_err(err)?;
            let f = fams.entry(name.to_owned()).or_default();
            if !f.samples.is_empty() {
                return Err(err("metadata after samples".into()));
            }
            match word {
                "HELP" => {
                    if f.help.is_some() {
                        return Err(err("HELP twice".into()));
                    }
                    f.help = Some(help_text(arg.unwrap_or(""), fmt).map_err(err)?);
                }
                "TYPE" => {
                    let k = arg.unwrap_or("");
                    if !f.kind.is_empty() || !kinds.contains(&k) {
                        return Err(err(format!("bad or second TYPE {k:?}")));
                    }
                    f.kind = k.to_owned();
                }
                _ => {
                    let unit = arg.unwrap_or("");
                    if unit.is_empty() || !name.ends_with(&format!("_{unit}")) {
                        return Err(err("UNIT not a suffix of the name".into()));
                    }
                }
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| err("no value".into()))?;
        let name = &line[..name_end];
        if !is_metric_name(name) {
            return Err(err(format!("bad sample name {name:?}")));
        }
        let (lbls, rest) = if line[name_end..].starts_with('{') {
            labels(&line[name_end..], fmt).map_err(err)?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let rest = rest
            .strip_prefix(' ')
            .ok_or_else(|| err("no space before the value".into()))?;
        let mut fields = rest.split(' ');
        let value = number(fields.next().unwrap_or("")).map_err(err)?;
        if let Some(ts) = fields.next() {
            number(ts).map_err(err)?;
        }
        if fields.next().is_some() {
            return Err(err("trailing fields (an exemplar?)".into()));
        }
        // The family this sample belongs to: the open one if the name fits.
        let family = match &current {
            Some(c)
                if fams.get(c).is_some_and(|f| {
                    sample_names(c, kind_or_default(&f.kind, fmt), fmt)
                        .iter()
                        .any(|s| s == name)
                }) =>
            {
                c.clone()
            }
            _ => {
                // A sample with no metadata is its own untyped family.
                open(name, &mut current).map_err(err)?;
                name.to_owned()
            }
        };
        let f = fams.entry(family.clone()).or_default();
        if !sample_names(&family, kind_or_default(&f.kind, fmt), fmt)
            .iter()
            .any(|s| s == name)
        {
            return Err(err(format!(
                "sample {name} does not fit family {family} ({})",
                f.kind
            )));
        }
        if f.kind == "counter" && value < 0.0 {
            return Err(err("negative counter".into()));
        }
        if !seen.insert((name.to_owned(), lbls.clone())) {
            return Err(err("series twice".into()));
        }
        f.samples.push(Sample {
            name: name.to_owned(),
            labels: lbls,
            value,
        });
    }
    for (name, f) in &fams {
        if f.kind.is_empty() && fmt == Fmt::OpenMetrics && f.samples.is_empty() {
            return Err(format!("family {name} with neither type nor samples"));
        }
    }
    Ok(fams)
}

fn kind_or_default(kind: &str, fmt: Fmt) -> &str {
    match (kind, fmt) {
        ("", Fmt::OpenMetrics) => "unknown",
        ("", Fmt::Classic) => "untyped",
        (k, _) => k,
    }
}

#[test]
fn the_strict_parsers_refuse_what_their_format_forbids() {
    let om_ok = "# HELP a_total A.\n# TYPE a counter\na_total{x=\"1\"} 2\n# EOF\n";
    // The family of a counter is named without _total in OpenMetrics.
    assert!(parse(om_ok, Fmt::OpenMetrics).is_err());
    let om_ok = "# HELP a A.\n# TYPE a counter\na_total{x=\"1\"} 2\n# EOF\n";
    assert!(parse(om_ok, Fmt::OpenMetrics).is_ok());
    for bad in [
        "# HELP a A.\n# TYPE a counter\na_total 2\n",
        "# TYPE a counter\na 2\n# EOF\n",
        "# TYPE a gauge\na{x=\"1\",} 2\n# EOF\n",
        "# TYPE a gauge\na 2\n\n# EOF\n",
        "# TYPE a gauge\na 2\n# TYPE b gauge\nb 1\na{x=\"1\"} 3\n# EOF\n",
        "# TYPE a untyped\na 2\n# EOF\n",
        "# HELP a say \"hi\"\n# TYPE a gauge\na 2\n# EOF\n",
        "# TYPE a gauge\na 2\na 3\n# EOF\n",
        "# TYPE a gauge\n# UNIT a bytes\na 2\n# EOF\n",
    ] {
        assert!(parse(bad, Fmt::OpenMetrics).is_err(), "{bad:?}");
    }
    assert!(parse(
        "# HELP a_total A.\n# TYPE a_total counter\na_total 2\n",
        Fmt::Classic
    )
    .is_ok());
    for bad in [
        "# TYPE a unknown\na 2\n",
        "# TYPE a gauge\n# UNIT a bytes\na 2\n",
        "# TYPE a gauge\na{x=\"\\t\"} 2\n",
        "# TYPE a gauge\na 2 # {x=\"1\"} 1\n",
        "# TYPE a gauge\na x\n",
    ] {
        assert!(parse(bad, Fmt::Classic).is_err(), "{bad:?}");
    }
}

// ---------------------------------------------------------------------------
// The daemon.

/// GET `/metrics` with `accept` (none: no header): (Content-Type, body).
fn scrape(port: u16, accept: Option<&str>) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .expect("a Content-Type");
    (ctype, body.to_owned())
}

struct Node {
    work: Workdir,
    gpu: SimGpu,
    uuid: String,
}

const NAMESPACE: &str = "ml-team";
const POD: &str = "trainer-0";
const UID: &str = "6a1f3c2e-0b1d-4e5f-8a9b-0c1d2e3f4a5b";
const CONTAINER: &str = "main";
const LIMIT: u64 = 1 << 30;

/// One pod's container ran the hooked workload; its region and the
/// kubelet's log directory of the pod are in place.
fn node() -> Node {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let work = Workdir::new("vgpu-compat-", &["containers", "pods", "state"]);
    let exe = dist::compile_c("demo_workload", work.root(), false);
    std::fs::create_dir_all(
        work.path("pods")
            .join(format!("{NAMESPACE}_{POD}_{UID}"))
            .join(CONTAINER),
    )
    .unwrap();
    let region_dir = work.path("containers").join(format!("{UID}_{CONTAINER}"));
    std::fs::create_dir_all(&region_dir).unwrap();
    let out = Command::new(&exe)
        .envs(work.envs(&gpu))
        .env("LD_PRELOAD", dist::hook_lib())
        .env(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            region_dir.join("r.cache"),
        )
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let f = RegionFile::open(&region_dir.join("r.cache"), Access::ReadOnly).unwrap();
    let (u, n) = f.region().uuid(0);
    let uuid = String::from_utf8_lossy(&u[..n]).into_owned();
    Node { work, gpu, uuid }
}

impl Node {
    /// The daemon with `extra` arguments, once it names the pod.
    fn daemon(&self, extra: &[&str]) -> Running {
        self.daemon_with_env(extra, &[])
    }

    /// The daemon with `extra` arguments and `env` added to the
    /// simulator's environment, once it names the pod.
    fn daemon_with_env(&self, extra: &[&str], env: &[(&str, &str)]) -> Running {
        let port = vgpu_tests::http::free_port();
        let mut cmd = Command::new(dist::vgpu_bin());
        cmd.arg("-v")
            .arg("daemon")
            .arg("--libcuda")
            .arg(self.work.libcuda())
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--state-dir")
            .arg(self.work.path("state"))
            .arg("--regions-root")
            .arg(self.work.path("containers"))
            .arg("--pods-log-dir")
            .arg(self.work.path("pods"))
            .args(["--node-name", "gpu-node-1"])
            .args(extra)
            .envs(self.work.envs(&self.gpu))
            .envs(env.iter().copied());
        let d = Running::start(cmd, port, self.work.path(&format!("daemon-{port}.log")));
        eventually(Duration::from_secs(10), "the pod named in /metrics", || {
            scrape(d.port, None).1.contains(&format!("pod=\"{POD}\""))
        });
        d
    }
}

/// Both formats of one render, each parsed strictly; they must hold the
/// same series (sample names, labels, values).
fn both(port: u16) -> (BTreeMap<String, Family>, BTreeMap<String, Family>) {
    // Two scrapes may straddle a render: retry until they agree.
    let t = Instant::now();
    loop {
        let (om_type, om) = scrape(port, Some(PROMETHEUS_ACCEPT));
        let (classic_type, classic) = scrape(port, Some("text/plain;version=0.0.4"));
        assert_eq!(om_type, OPENMETRICS_TYPE);
        assert_eq!(classic_type, CLASSIC_TYPE);
        let om_f = parse(&om, Fmt::OpenMetrics).unwrap_or_else(|e| panic!("{e}\n{om}"));
        let cl_f = parse(&classic, Fmt::Classic).unwrap_or_else(|e| panic!("{e}\n{classic}"));
        assert!(
            !classic.contains("# EOF") && !classic.contains("# UNIT"),
            "{classic}"
        );
        let series = |f: &BTreeMap<String, Family>| -> BTreeSet<String> {
            f.values()
                .flat_map(|f| &f.samples)
                .map(|s| format!("{}{:?} {}", s.name, s.labels, s.value))
                .collect()
        };
        if series(&om_f) == series(&cl_f) {
            return (om_f, cl_f);
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the formats disagree:\n{om}\n---\n{classic}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn samples<'a>(f: &'a BTreeMap<String, Family>, name: &str) -> Vec<&'a Sample> {
    f.values()
        .flat_map(|f| &f.samples)
        .filter(|s| s.name == name)
        .collect()
}

fn label_names(s: &Sample) -> BTreeSet<&str> {
    s.labels.keys().map(String::as_str).collect()
}

#[test]
fn legacy_metrics_are_hami_2_8s_names_and_labels_fed_like_the_hami_series() {
    let n = node();
    let d = n.daemon(&["--legacy-metrics"]);
    let (om, classic) = both(d.port);
    for (fmt, fams) in [("openmetrics", &om), ("classic", &classic)] {
        for (name, want) in HAMI_2_8 {
            let got = samples(fams, name);
            if NOT_EXPORTED.contains(&name) {
                assert!(got.is_empty(), "{fmt}: {name}");
                continue;
            }
            assert!(!got.is_empty(), "{fmt}: no {name}");
            let want: BTreeSet<&str> = want.iter().copied().chain(["zone"]).collect();
            for s in &got {
                assert_eq!(label_names(s), want, "{fmt}: {name}");
                assert_eq!(s.labels["zone"], "vGPU");
                assert_eq!(s.labels["deviceuuid"], n.uuid, "{fmt}: {name}");
            }
            let kind = &fams[name].kind;
            let want_kind = match (name, fmt) {
                ("Device_memory_desc_of_container", "classic") => "counter",
                // OpenMetrics cannot name a counter without _total.
                ("Device_memory_desc_of_container", _) => "unknown",
                _ => "gauge",
            };
            assert_eq!(kind, want_kind, "{fmt}: {name}");
        }
    }
    // The values: the same data as HAMi v2.9+'s names.
    let one = |name: &str| -> Sample {
        let v = samples(&classic, name);
        assert_eq!(v.len(), 1, "{name}: {v:?}");
        v[0].clone()
    };
    let used = one("vGPU_device_memory_usage_in_bytes");
    assert_eq!(
        (
            used.labels["podnamespace"].as_str(),
            used.labels["podname"].as_str()
        ),
        (NAMESPACE, POD)
    );
    assert_eq!(used.labels["ctrname"], CONTAINER);
    assert_eq!(used.labels["vdeviceid"], "0");
    assert_eq!(used.value, one("hami_vgpu_memory_used_bytes").value);
    assert_eq!(one("vGPU_device_memory_limit_in_bytes").value, LIMIT as f64);
    let desc = one("Device_memory_desc_of_container");
    assert_eq!(desc.value, used.value);
    for (label, series) in [
        ("context", "hami_vgpu_memory_context_bytes"),
        ("module", "hami_vgpu_memory_module_bytes"),
        ("data", "hami_vgpu_memory_buffer_bytes"),
    ] {
        assert_eq!(
            desc.labels[label].parse::<f64>().unwrap(),
            one(series).value,
            "{label}"
        );
    }
    assert_eq!(desc.labels["offset"], "0");
    assert_eq!(
        one("Device_utilization_desc_of_container").value,
        one("hami_container_device_utilization_ratio").value
    );
    let host = one("HostGPUMemoryUsage");
    assert_eq!(host.labels["deviceidx"], "0");
    assert!(host.labels["devicetype"].starts_with("NVIDIA-"), "{host:?}");
    assert_eq!(host.value, one("hami_host_gpu_memory_used_bytes").value);
    assert_eq!(
        one("HostCoreUtilization").value,
        one("hami_host_gpu_utilization_ratio").value
    );
}

#[test]
fn without_the_flag_no_legacy_series_and_the_memory_controller_ratio_is_hamis() {
    let n = node();
    let d = n.daemon(&[]);
    let (om, classic) = both(d.port);
    for (fmt, fams) in [("openmetrics", &om), ("classic", &classic)] {
        for (name, _) in HAMI_2_8 {
            assert!(
                !fams.contains_key(name) && samples(fams, name).is_empty(),
                "{fmt}: {name} without --legacy-metrics"
            );
        }
        let (name, want) = MEMORY_CONTROLLER;
        let got = samples(fams, name);
        assert_eq!(got.len(), 1, "{fmt}: {name}");
        let want: BTreeSet<&str> = want.iter().copied().chain(["zone"]).collect();
        assert_eq!(label_names(got[0]), want, "{fmt}");
        assert_eq!(got[0].labels["device_uuid"], n.uuid);
        assert!((0.0..=100.0).contains(&got[0].value), "{got:?}");
        assert_eq!(fams[name].kind, "gauge");
    }
    // 0.0.4 names a counter family after its samples, OpenMetrics without
    // the suffix.
    assert_eq!(classic["vgpu_hostpid_fills_total"].kind, "counter");
    assert_eq!(om["vgpu_hostpid_fills"].kind, "counter");
}

#[test]
fn the_accept_header_picks_the_format() {
    let n = node();
    let d = n.daemon(&[]);
    for (accept, want) in [
        (None, CLASSIC_TYPE),
        (Some("*/*"), CLASSIC_TYPE),
        (Some("text/plain;version=0.0.4;q=1.0"), CLASSIC_TYPE),
        (Some(PROMETHEUS_ACCEPT), OPENMETRICS_TYPE),
        (
            Some("application/openmetrics-text; version=1.0.0"),
            OPENMETRICS_TYPE,
        ),
        (
            Some("application/openmetrics-text;version=1.0.0;q=0.4,text/plain;version=0.0.4;q=0.6"),
            CLASSIC_TYPE,
        ),
        (
            Some("application/openmetrics-text;q=0,*/*;q=0.1"),
            CLASSIC_TYPE,
        ),
    ] {
        let (ctype, body) = scrape(d.port, accept);
        assert_eq!(ctype, want, "Accept: {accept:?}");
        let fmt = if want == OPENMETRICS_TYPE {
            Fmt::OpenMetrics
        } else {
            Fmt::Classic
        };
        parse(&body, fmt).unwrap_or_else(|e| panic!("{accept:?}: {e}\n{body}"));
    }
}

#[test]
fn the_hami_overlay_turns_them_on() {
    // The environment the hami overlay gives the daemon container.
    let patch = std::fs::read_to_string(
        dist::workspace_root().join("deploy/overlays/hami/install-hook.yaml"),
    )
    .unwrap();
    let patch: serde_yaml::Value = serde_yaml::from_str(&patch).unwrap();
    let daemon = patch["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "daemon")
        .expect("the overlay patches the daemon container");
    let env: Vec<(&str, &str)> = daemon["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    assert!(!env.is_empty());
    let n = node();
    let d = n.daemon_with_env(&[], &env);
    let (_, classic) = both(d.port);
    for (name, _) in HAMI_2_8 {
        assert_eq!(
            samples(&classic, name).is_empty(),
            NOT_EXPORTED.contains(&name),
            "{name} with the overlay's environment {env:?}"
        );
    }
}
