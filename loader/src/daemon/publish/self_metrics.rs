//! The series every exporter carries about itself: `vgpu_build_info` and
//! Prometheus' standard `process_*` (as client_golang's process collector
//! names them), read from `/proc/self` at each scrape so that they are
//! current whatever the scan interval.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use crate::daemon::publish::exposition::Exposition;

/// What the build says about itself (loader/build.rs).
const VERSION: &str = env!("CARGO_PKG_VERSION");
const COMMIT: &str = env!("VGPU_COMMIT_ID");
const RUSTC: &str = env!("VGPU_RUSTC");

/// `/proc/self` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProcSelfError {
    #[error("reading {path}: {source}")]
    Read {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} has no field {field}")]
    Field {
        path: &'static str,
        field: &'static str,
    },
}

/// The process's own figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcessSample {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub start_time_seconds: f64,
    pub open_fds: u64,
    pub max_fds: u64,
}

/// Fields of `/proc/<pid>/stat` after the command name: (utime, stime,
/// starttime in clock ticks, vsize in bytes, rss in pages).
fn parse_stat(stat: &str) -> Option<(u64, u64, u64, u64, u64)> {
    // The command name may hold spaces and parentheses: the fields start
    // after its last ')'. Field 3 (state) is the first after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i - 3)?.parse::<u64>().ok();
    Some((n(14)?, n(15)?, n(22)?, n(23)?, n(24)?))
}

/// `btime` of `/proc/stat`: the boot time, Unix seconds.
fn parse_btime(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

fn read(path: &'static str) -> Result<String, ProcSelfError> {
    std::fs::read_to_string(path).map_err(|source| ProcSelfError::Read { path, source })
}

impl ProcessSample {
    /// Reads `/proc/self/stat`, `/proc/stat` and `/proc/self/fd`.
    pub fn read() -> Result<Self, ProcSelfError> {
        const STAT: &str = "/proc/self/stat";
        const BOOT: &str = "/proc/stat";
        const FD: &str = "/proc/self/fd";
        let (utime, stime, start, vsize, rss) =
            parse_stat(&read(STAT)?).ok_or(ProcSelfError::Field {
                path: STAT,
                field: "utime..rss",
            })?;
        let btime = parse_btime(&read(BOOT)?).ok_or(ProcSelfError::Field {
            path: BOOT,
            field: "btime",
        })?;
        let open_fds = std::fs::read_dir(FD)
            .map_err(|source| ProcSelfError::Read { path: FD, source })?
            .count() as u64;
        let ticks = rustix::param::clock_ticks_per_second().max(1) as f64;
        let page = rustix::param::page_size() as u64;
        let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        Ok(Self {
            cpu_seconds: (utime + stime) as f64 / ticks,
            resident_bytes: rss.saturating_mul(page),
            virtual_bytes: vsize,
            start_time_seconds: btime as f64 + start as f64 / ticks,
            open_fds,
            max_fds,
        })
    }
}

/// `vgpu_build_info` and, when `/proc/self` could be read, the `process_*`
/// series, as an OpenMetrics text of their own (appended to the scan's).
pub fn render(process: Option<&ProcessSample>) -> Exposition {
    let mut reg = Registry::default();
    let mut labels = vec![("version", VERSION), ("commit", COMMIT)];
    if !RUSTC.is_empty() {
        labels.push(("rustc", RUSTC));
    }
    reg.register(
        "vgpu_build",
        "The daemon's version, the commit it was built from and its compiler",
        Info::new(labels),
    );
    if let Some(p) = process {
        reg.register_with_unit(
            "process_cpu",
            "Total user and system CPU time spent in seconds",
            Unit::Seconds,
            ConstCounter::<f64>::new(p.cpu_seconds),
        );
        reg.register_with_unit(
            "process_resident_memory",
            "Resident memory size in bytes",
            Unit::Bytes,
            ConstGauge::new(p.resident_bytes),
        );
        reg.register_with_unit(
            "process_virtual_memory",
            "Virtual memory size in bytes",
            Unit::Bytes,
            ConstGauge::new(p.virtual_bytes),
        );
        reg.register_with_unit(
            "process_start_time",
            "Start time of the process since unix epoch in seconds",
            Unit::Seconds,
            ConstGauge::new(p.start_time_seconds),
        );
        reg.register(
            "process_open_fds",
            "Number of open file descriptors",
            ConstGauge::new(p.open_fds),
        );
        reg.register(
            "process_max_fds",
            "Maximum number of open file descriptors",
            ConstGauge::new(p.max_fds),
        );
    }
    let mut out = String::new();
    if encode(&mut out, &reg).is_err() {
        tracing::warn!("encoding the process metrics failed");
    }
    Exposition::from_openmetrics(out)
}

/// [`render`] of what `/proc/self` says now (without the `process_*`
/// series when it cannot be read).
pub fn render_now() -> Exposition {
    let sample = ProcessSample::read()
        .inspect_err(|e| tracing::debug!("process metrics: {e}"))
        .ok();
    render(sample.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::publish::exposition::Format;

    #[test]
    fn stat_fields_after_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (vgpu (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    150 50 0 0 20 0 3 0 12345 104857600 2560 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((150, 50, 12345, 104_857_600, 2560)));
        assert_eq!(parse_stat("4242 (vgpu) S 1"), None);
        assert_eq!(
            parse_btime("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn standard_names_in_both_formats() {
        let p = ProcessSample {
            cpu_seconds: 1.5,
            resident_bytes: 1 << 20,
            virtual_bytes: 1 << 30,
            start_time_seconds: 1_700_000_000.25,
            open_fds: 12,
            max_fds: 1024,
        };
        let e = render(Some(&p));
        let om = String::from_utf8_lossy(&e.openmetrics).into_owned();
        for line in [
            "# TYPE vgpu_build info",
            "process_cpu_seconds_total 1.5",
            "process_resident_memory_bytes 1048576",
            "process_start_time_seconds 1700000000.25",
            "process_open_fds 12",
            "process_max_fds 1024",
        ] {
            assert!(om.lines().any(|l| l == line), "missing {line}\n{om}");
        }
        assert!(
            om.contains(&format!("vgpu_build_info{{version=\"{VERSION}\"")),
            "{om}"
        );
        let (body, _) = e.body(Format::Classic);
        let classic = body.to_text();
        assert!(
            classic.contains("# TYPE vgpu_build_info gauge"),
            "{classic}"
        );
        assert!(
            classic.contains("# TYPE process_cpu_seconds_total counter"),
            "{classic}"
        );
        assert!(!classic.contains("# EOF"), "{classic}");
        let now = ProcessSample::read().unwrap();
        assert!(now.resident_bytes > 0 && now.open_fds > 0 && now.start_time_seconds > 1e9);
    }
}
