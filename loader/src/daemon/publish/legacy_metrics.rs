//! HAMi 2.5–2.8's vGPU monitor series (`vgpu daemon --legacy-metrics`, the
//! flag HAMi 2.9 and 2.10 keep them behind), for the dashboards that query their
//! names: the same data as the `hami_*` series, under the names and label
//! sets of those versions' `cmd/vGPUmonitor/metrics.go`. They go into the
//! registry that adds `zone="vGPU"`, as HAMi's monitor wraps its registerer.
//!
//! `MigInfo` is not exported: HAMi reads it from the scheduler's pod
//! annotations, which the daemon does not have.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, LabelSetEncoder, MetricEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::daemon::publish::snapshot::{Labels, Snapshot};

/// HAMi 2.8 types this series counter but names it without `_total`, which
/// OpenMetrics cannot express: OpenMetrics gets it as `unknown` (so the
/// name dashboards query stays), the classic text format as `counter`.
pub const UNSUFFIXED_COUNTERS: &[&str] = &["Device_memory_desc_of_container"];

type GaugeU = Gauge<u64, AtomicU64>;

/// A value exported under its own name with type `unknown`.
#[derive(Debug, Default)]
struct Unknown(AtomicU64);

impl TypedMetric for Unknown {
    const TYPE: MetricType = MetricType::Unknown;
}

impl EncodeMetric for Unknown {
    fn encode(&self, mut e: MetricEncoder) -> Result<(), std::fmt::Error> {
        e.encode_gauge(&self.0.load(Relaxed))
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// One device of one region, with HAMi 2.8's container label names; the
/// family keys it by the region's place in the snapshot and the device
/// index (cheap to hash, as `metrics`' own series).
#[derive(Clone, Debug)]
struct Series {
    region: usize,
    index: usize,
    labels: Arc<Labels>,
    uuid: Arc<str>,
    /// `context`, `module`, `data`, `offset` of `Device_memory_desc_of_container`.
    sizes: Option<[u64; 4]>,
}

impl PartialEq for Series {
    fn eq(&self, o: &Self) -> bool {
        (self.region, self.index) == (o.region, o.index)
    }
}

impl Eq for Series {}

impl std::hash::Hash for Series {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.region, self.index).hash(h);
    }
}

impl Series {
    fn label(&self, name: &str) -> &str {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

impl EncodeLabelSet for Series {
    fn encode(&self, e: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [
            ("podnamespace", self.label("namespace")),
            ("podname", self.label("pod")),
            ("ctrname", self.label("container")),
        ]
        .encode(e)?;
        [("vdeviceid", self.index)].encode(e)?;
        [("deviceuuid", &*self.uuid)].encode(e)?;
        if let Some([context, module, data, offset]) = self.sizes {
            [
                ("context", context),
                ("module", module),
                ("data", data),
                ("offset", offset),
            ]
            .encode(e)?;
        }
        Ok(())
    }
}

/// Registers HAMi 2.5–2.8's series of `s` into `reg`.
pub fn register(reg: &mut Registry, s: &Snapshot<'_>) {
    let host_mem = Family::<Labels, GaugeU>::default();
    let host_util = Family::<Labels, GaugeU>::default();
    for d in &s.host {
        let l = vec![
            ("deviceidx".to_owned(), d.index.to_string()),
            ("deviceuuid".to_owned(), d.uuid.clone()),
            ("devicetype".to_owned(), d.device_type.clone()),
        ];
        host_mem.get_or_create(&l).set(d.memory_used);
        if let Some(u) = d.utilization {
            host_util.get_or_create(&l).set(u64::from(u));
        }
    }
    reg.register("HostGPUMemoryUsage", "GPU device memory usage", host_mem);
    reg.register("HostCoreUtilization", "GPU core utilization", host_util);

    let used = Family::<Series, GaugeU>::default();
    let limit = Family::<Series, GaugeU>::default();
    let desc = Family::<Series, Unknown>::default();
    let util = Family::<Series, GaugeU>::default();
    let last = Family::<Series, GaugeU>::default();
    for (at, r) in s.regions.iter().enumerate() {
        let labels = Arc::new(r.labels.clone());
        for d in &r.devices {
            let l = Series {
                region: at,
                index: d.index,
                labels: labels.clone(),
                uuid: Arc::from(d.uuid.as_str()),
                sizes: None,
            };
            used.get_or_create(&l).set(d.total);
            limit.get_or_create(&l).set(d.limit);
            util.get_or_create(&l).set(d.sm_util);
            if r.last_kernel_time > 0 {
                last.get_or_create(&l)
                    .set(s.now_unix.saturating_sub(r.last_kernel_time));
            }
            let l = Series {
                sizes: Some([d.context, d.module, d.data, d.offset]),
                ..l
            };
            desc.get_or_create(&l).0.store(d.total, Relaxed);
        }
    }
    reg.register(
        "vGPU_device_memory_usage_in_bytes",
        "vGPU device usage",
        used,
    );
    reg.register(
        "vGPU_device_memory_limit_in_bytes",
        "vGPU device limit",
        limit,
    );
    reg.register(
        UNSUFFIXED_COUNTERS[0],
        "Container device memory description",
        desc,
    );
    reg.register(
        "Device_utilization_desc_of_container",
        "Container device utilization description",
        util,
    );
    reg.register(
        "Device_last_kernel_of_container",
        "Container device last kernel description",
        last,
    );
}
