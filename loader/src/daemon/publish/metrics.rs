//! Prometheus text: the metric names of HAMi's vGPU monitor
//! (`cmd/vGPUmonitor/metrics.go`, <https://github.com/Project-HAMi/HAMi>) fed from the
//! regions and NVML, plus vgpu's own. A fresh registry is built for every
//! scan and rendered once, so a scrape never sees a half-updated set and
//! series of gone containers disappear; counters live across scans.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use vgpu_common::region::rules;

use crate::daemon::collect::container_identity::ContainerIdentity;
use crate::daemon::state::findings::Kind;

use crate::daemon::publish::snapshot::{one, Counters, Labels, Snapshot};

fn identity_labels(id: &ContainerIdentity) -> Labels {
    vec![
        ("pod_uid".into(), id.pod_uid.clone().unwrap_or_default()),
        (
            "container_id".into(),
            id.container_id.clone().unwrap_or_default(),
        ),
        ("cgroup".into(), id.cgroup.clone()),
    ]
}

type GaugeF = Gauge<f64, AtomicU64>;
/// Byte counts are u64 in a region (and a tenant may write any value):
/// exported as u64, never wrapped into a negative i64.
type GaugeU = Gauge<u64, AtomicU64>;

/// One series of a region: its labels, shared by every series of the
/// region (one copy per region, not one per series), then the device's.
/// A family keys it by the region's place in the snapshot and the device
/// index, so adding a series hashes two integers, not nine strings: the
/// render stays linear and cheap at thousands of regions.
#[derive(Clone, Debug)]
struct Series {
    region: usize,
    labels: Arc<Labels>,
    device: Option<(usize, Arc<str>)>,
}

impl PartialEq for Series {
    fn eq(&self, o: &Self) -> bool {
        self.region == o.region
            && self.device.as_ref().map(|d| d.0) == o.device.as_ref().map(|d| d.0)
    }
}

impl Eq for Series {}

impl std::hash::Hash for Series {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.region.hash(h);
        self.device.as_ref().map(|d| d.0).hash(h);
    }
}

impl EncodeLabelSet for Series {
    fn encode(&self, e: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.labels.as_slice().encode(e)?;
        if let Some((index, uuid)) = &self.device {
            [("vdevice_index", *index)].encode(e)?;
            [("device_uuid", &**uuid)].encode(e)?;
        }
        Ok(())
    }
}

/// Renders the snapshot and the counters as OpenMetrics text
/// (`crate::daemon::publish::exposition` derives the classic text format from it).
pub fn render(s: &Snapshot<'_>, c: &Counters) -> String {
    let mut reg = Registry::default();
    let hami = reg.sub_registry_with_label(("zone".into(), "vGPU".into()));
    if s.legacy {
        crate::daemon::publish::legacy_metrics::register(hami, s);
    }

    let vused = Family::<Series, GaugeU>::default();
    let vlimit = Family::<Series, GaugeU>::default();
    let cmem = Family::<Series, GaugeU>::default();
    let cutil = Family::<Series, GaugeF>::default();
    let clast = Family::<Series, GaugeF>::default();
    let vctx = Family::<Series, GaugeU>::default();
    let vmod = Family::<Series, GaugeU>::default();
    let vbuf = Family::<Series, GaugeU>::default();
    let vhost = Family::<Series, GaugeU>::default();
    let smlimit = Family::<Series, Gauge>::default();
    let launches = Family::<Series, Counter>::default();
    let dead = Family::<Series, Gauge>::default();
    for (at, r) in s.regions.iter().enumerate() {
        let region = Series {
            region: at,
            labels: Arc::new(r.labels.clone()),
            device: None,
        };
        dead.get_or_create(&region).set(r.dead_slots as i64);
        for d in &r.devices {
            let l = Series {
                device: Some((d.index, Arc::from(d.uuid.as_str()))),
                ..region.clone()
            };
            vused.get_or_create(&l).set(d.total);
            cmem.get_or_create(&l).set(d.total);
            vlimit.get_or_create(&l).set(d.limit);
            vctx.get_or_create(&l).set(d.context);
            vmod.get_or_create(&l).set(d.module);
            vbuf.get_or_create(&l).set(d.data);
            vhost.get_or_create(&l).set(d.host);
            cutil.get_or_create(&l).set(d.sm_util as f64);
            smlimit
                .get_or_create(&l)
                .set(rules::sm_limit_shown(d.sm_limit) as i64);
            launches.get_or_create(&l).inc_by(d.launches);
            if r.last_kernel_time > 0 {
                let ago = s.now_unix.saturating_sub(r.last_kernel_time);
                clast.get_or_create(&l).set(ago as f64);
            }
        }
    }
    hami.register(
        "hami_vgpu_memory_used_bytes",
        "Device memory the container uses (sum of slot totals)",
        vused,
    );
    hami.register(
        "hami_vgpu_memory_limit_bytes",
        "Device memory limit of the container (0 = none)",
        vlimit,
    );
    hami.register(
        "hami_container_device_memory_bytes",
        "Device memory the container uses (same as hami_vgpu_memory_used_bytes)",
        cmem,
    );
    hami.register(
        "hami_container_device_utilization_ratio",
        "Sum of the slots' SM utilization samples (percent, as HAMi)",
        cutil,
    );
    hami.register(
        "hami_container_last_kernel_elapsed_seconds",
        "Seconds since the container's last kernel launch",
        clast,
    );
    hami.register(
        "hami_vgpu_memory_context_bytes",
        "CUDA context memory of the container",
        vctx,
    );
    hami.register(
        "hami_vgpu_memory_module_bytes",
        "Module memory of the container",
        vmod,
    );
    hami.register(
        "hami_vgpu_memory_buffer_bytes",
        "Data (buffer) memory of the container",
        vbuf,
    );
    hami.register(
        "vgpu_memory_host_bytes",
        "Of the container's data memory, bytes served from host memory (CUDA_OVERSUBSCRIBE); counted in hami_vgpu_memory_used_bytes too",
        vhost,
    );
    hami.register(
        "vgpu_sm_limit_percent",
        "SM (compute) limit of the container, percent of the GPU's time (100 = none)",
        smlimit,
    );

    hami.register(
        "vgpu_container_launches",
        "Successful kernel and graph launches of the container's processes, counted by the hook",
        launches,
    );

    hami.register(
        "vgpu_dead_slots",
        "Region slots held by processes that are gone (until reclaimed)",
        dead,
    );

    let hused = Family::<Labels, GaugeU>::default();
    let hutil = Family::<Labels, GaugeF>::default();
    let hmemutil = Family::<Labels, GaugeF>::default();
    for d in &s.host {
        let mut l = Vec::new();
        if !s.node.is_empty() {
            l.push(("node".to_owned(), s.node.to_owned()));
        }
        l.extend([
            ("device_index".to_owned(), d.index.to_string()),
            ("device_uuid".to_owned(), d.uuid.clone()),
            ("device_type".to_owned(), d.device_type.clone()),
        ]);
        hused.get_or_create(&l).set(d.memory_used);
        if let Some(u) = d.utilization {
            hutil.get_or_create(&l).set(f64::from(u));
        }
        if let Some(u) = d.memory_utilization {
            // HAMi's series has no `node` label.
            let from = usize::from(!s.node.is_empty());
            hmemutil
                .get_or_create(&l[from..].to_vec())
                .set(f64::from(u));
        }
    }
    hami.register(
        "hami_host_gpu_memory_used_bytes",
        "Device memory used on the GPU (NVML)",
        hused,
    );
    hami.register(
        "hami_host_gpu_utilization_ratio",
        "GPU utilization percent (NVML)",
        hutil,
    );
    hami.register(
        "hami_host_gpu_memory_controller_utilization_ratio",
        "GPU memory controller utilization percent (NVML)",
        hmemutil,
    );

    // What an alert names: the node (a constant label of these series; the
    // scrape's own labels name only the daemon pod) and, on the series of
    // one container, its pod.
    let noded = if s.node.is_empty() {
        &mut reg
    } else {
        reg.sub_registry_with_label(("node".into(), s.node.to_owned().into()))
    };
    let pod_of = |uid: Option<&str>| {
        let name = uid.and_then(|u| s.pods?.get(u));
        [
            (
                "namespace".to_owned(),
                name.map(|n| n.namespace.clone()).unwrap_or_default(),
            ),
            (
                "pod".to_owned(),
                name.map(|n| n.pod.clone()).unwrap_or_default(),
            ),
        ]
    };
    let untracked = Family::<Labels, GaugeU>::default();
    for (id, b) in &s.untracked {
        let mut l = pod_of(id.pod_uid.as_deref()).to_vec();
        l.extend(identity_labels(id));
        untracked.get_or_create(&l).set(*b);
    }
    noded.register(
        "vgpu_untracked_bytes",
        "Device memory the hook did not account, per container (persistent findings)",
        untracked,
    );
    let uncontrolled = Family::<Labels, GaugeU>::default();
    for (id, pid, b) in &s.uncontrolled {
        let mut l = pod_of(id.pod_uid.as_deref()).to_vec();
        l.extend(identity_labels(id));
        l.push(("pid".into(), pid.to_string()));
        uncontrolled.get_or_create(&l).set(*b);
    }
    noded.register(
        "vgpu_uncontrolled_process_memory_bytes",
        "Device memory of each process in a container that opts out of the hook \
         (CUDA_DISABLE_CONTROL=true: HAMi's whole-GPU mode), by host PID",
        uncontrolled,
    );
    let findings = Family::<Labels, Gauge>::default();
    for k in Kind::ALL {
        let n = s.findings.iter().filter(|f| f.kind == k).count();
        findings.get_or_create(&one("kind", k.name())).set(n as i64);
    }
    noded.register("vgpu_findings", "Current findings, by kind", findings);
    // Per pod only while a finding is open, so a node has as many series
    // as pods with open findings, not pods times kinds (vgpu_findings, one
    // per kind created at 0, is what tells "none" from "not scraped").
    let by_pod = Family::<Labels, Gauge>::default();
    for f in s.findings {
        let mut l = one("kind", f.kind.name());
        l.extend(pod_of(f.pod_uid.as_deref()));
        l.push((
            "container_id".to_owned(),
            f.container_id.clone().unwrap_or_default(),
        ));
        by_pod.get_or_create(&l).inc();
    }
    noded.register(
        "vgpu_pod_findings",
        "Open findings by kind and container, present only while one is open",
        by_pod,
    );
    noded.register(
        "vgpu_violations",
        "Findings that appeared, by kind and the action the daemon took (kept across scans)",
        c.violations.clone(),
    );
    let probes = Family::<Labels, Gauge>::default();
    for (func, lib) in &s.probes {
        let l = vec![
            ("function".to_owned(), func.clone()),
            ("libcuda".to_owned(), lib.clone()),
        ];
        probes.get_or_create(&l).set(1);
    }
    reg.register(
        "vgpu_probe_attached",
        "1 per probed libcuda entry point",
        probes,
    );
    let procs = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
    procs.set(s.processes as i64);
    reg.register("vgpu_processes", "CUDA processes the probes know", procs);
    let skipped = GaugeU::default();
    skipped.set(s.region_files_skipped as u64);
    reg.register(
        "vgpu_region_files_skipped",
        "Region files under the regions root left out of the last scan by its bounds",
        skipped,
    );
    let over = Family::<Labels, GaugeU>::default();
    for (bound, n) in [
        ("regions", s.overruns.regions_refused),
        ("slots", s.overruns.slots_capped),
        ("label_bytes", s.labels_shortened),
    ] {
        over.get_or_create(&one("bound", bound)).set(n as u64);
    }
    reg.register(
        "vgpu_containers_over_bound",
        "Containers over one of the daemon's per-container bounds at the last scan (regions \
         open, slots read, label bytes): what is past the bound is left out",
        over,
    );
    let timing = Family::<Labels, GaugeF>::default();
    for (phase, d) in [("scan", s.timing.scan), ("render", s.timing.render)] {
        timing
            .get_or_create(&one("phase", phase))
            .set(d.as_secs_f64());
    }
    reg.register(
        "vgpu_last_scan_seconds",
        "How long the previous scan took (phase=scan: all of it, render: rendering /metrics)",
        timing,
    );
    reg.register(
        "vgpu_hostpid_fills",
        "Host PIDs written into region slots",
        c.hostpid_fills.clone(),
    );
    reg.register(
        "vgpu_hostpid_verified",
        "Processes whose slot already held the right host PID when first found",
        c.hostpid_verified.clone(),
    );
    reg.register(
        "vgpu_slots_reclaimed",
        "Region slots of dead processes the daemon freed",
        c.slots_reclaimed.clone(),
    );
    reg.register(
        "vgpu_region_passes",
        "Region passes: every open region re-read and the values shown refreshed",
        c.region_passes.clone(),
    );
    reg.register(
        "vgpu_probe_events",
        "libcuda calls seen by the probes, by kind",
        c.probe_events.clone(),
    );
    reg.register(
        "vgpu_probe_lost_events",
        "libcuda calls the probes could not record, by reason",
        c.probe_lost.clone(),
    );
    let mut out = String::new();
    if encode(&mut out, &reg).is_err() {
        tracing::warn!("encoding metrics failed");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::collect::nvml::DeviceSample;
    use crate::daemon::collect::pods::PodNames;
    use crate::daemon::collect::region_cache::Overruns;
    use crate::daemon::publish::snapshot::{RegionDevice, RegionView};
    use crate::daemon::state::findings::Finding;

    #[test]
    fn names_labels_and_values() {
        let c = Counters::default();
        c.hostpid_fills.inc_by(3);
        let s = Snapshot {
            regions: vec![RegionView {
                labels: vec![
                    ("pod_uid".into(), "p".into()),
                    ("container".into(), "c".into()),
                ],
                devices: vec![RegionDevice {
                    index: 0,
                    uuid: "GPU-x".into(),
                    limit: 1 << 30,
                    total: 600,
                    context: 500,
                    data: 100,
                    sm_limit: 30,
                    host: 40,
                    ..RegionDevice::default()
                }],
                last_kernel_time: 90,
                dead_slots: 2,
            }],
            now_unix: 100,
            region_files_skipped: 996,
            overruns: Overruns {
                regions_refused: 1,
                slots_capped: 0,
            },
            ..Snapshot::default()
        };
        c.slots_reclaimed.inc_by(2);
        c.region_passes.inc_by(5);
        let text = render(&s, &c);
        for line in [
            r#"hami_vgpu_memory_used_bytes{zone="vGPU",pod_uid="p",container="c",vdevice_index="0",device_uuid="GPU-x"} 600"#,
            r#"hami_vgpu_memory_limit_bytes{zone="vGPU",pod_uid="p",container="c",vdevice_index="0",device_uuid="GPU-x"} 1073741824"#,
            r#"hami_vgpu_memory_context_bytes{zone="vGPU",pod_uid="p",container="c",vdevice_index="0",device_uuid="GPU-x"} 500"#,
            r#"hami_container_last_kernel_elapsed_seconds{zone="vGPU",pod_uid="p",container="c",vdevice_index="0",device_uuid="GPU-x"} 10.0"#,
            r#"vgpu_sm_limit_percent{zone="vGPU",pod_uid="p",container="c",vdevice_index="0",device_uuid="GPU-x"} 30"#,
            r#"vgpu_memory_host_bytes{zone="vGPU",pod_uid="p",container="c",vdevice_index="0",device_uuid="GPU-x"} 40"#,
            r#"vgpu_dead_slots{zone="vGPU",pod_uid="p",container="c"} 2"#,
            "vgpu_hostpid_fills_total 3",
            "vgpu_region_files_skipped 996",
            r#"vgpu_containers_over_bound{bound="regions"} 1"#,
            r#"vgpu_containers_over_bound{bound="slots"} 0"#,
            "vgpu_slots_reclaimed_total 2",
            "vgpu_region_passes_total 5",
            r#"vgpu_findings{kind="untracked_allocation"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }

    /// An alert names the node and, for a container's finding, its pod;
    /// the per-kind counts stay one series per kind.
    #[test]
    fn findings_series_carry_the_node_and_the_pod() {
        use crate::daemon::collect::pods::PodName;
        let id = ContainerIdentity {
            cgroup: "/cg".into(),
            pod_uid: Some("u1".into()),
            container_id: Some("c1".into()),
        };
        let pods = PodNames::from_names([(
            "u1".to_owned(),
            PodName {
                namespace: "ml".into(),
                pod: "trainer".into(),
            },
        )]);
        let findings = [
            Finding::new(Kind::OverLimit, &id, 1, "m".into()),
            Finding::new(
                Kind::OverLimit,
                &ContainerIdentity::default(),
                1,
                "m".into(),
            ),
        ];
        let c = Counters::default();
        c.violations
            .get_or_create(&vec![
                ("kind".into(), "over_limit".into()),
                ("action".into(), "none".into()),
            ])
            .inc();
        let s = Snapshot {
            findings: &findings,
            untracked: vec![(id.clone(), 7)],
            node: "n1",
            pods: Some(&pods),
            ..Snapshot::default()
        };
        let text = render(&s, &c);
        for line in [
            r#"vgpu_findings{node="n1",kind="over_limit"} 2"#,
            r#"vgpu_findings{node="n1",kind="no_region"} 0"#,
            r#"vgpu_pod_findings{node="n1",kind="over_limit",namespace="ml",pod="trainer",container_id="c1"} 1"#,
            r#"vgpu_pod_findings{node="n1",kind="over_limit",namespace="",pod="",container_id=""} 1"#,
            r#"vgpu_untracked_bytes{node="n1",namespace="ml",pod="trainer",pod_uid="u1",container_id="c1",cgroup="/cg"} 7"#,
            r#"vgpu_violations_total{node="n1",kind="over_limit",action="none"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(
            !text.contains(r#"vgpu_pod_findings{node="n1",kind="no_region""#),
            "{text}"
        );
    }

    #[test]
    fn values_above_i64_max_are_exported_as_they_are() {
        let s = Snapshot {
            regions: vec![RegionView {
                labels: vec![("pod_uid".into(), "p".into())],
                devices: vec![RegionDevice {
                    limit: u64::MAX - 5,
                    total: 1 << 63,
                    ..RegionDevice::default()
                }],
                last_kernel_time: 0,
                dead_slots: 0,
            }],
            ..Snapshot::default()
        };
        let text = render(&s, &Counters::default());
        let value = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_owned)
        };
        assert_eq!(
            value("hami_vgpu_memory_limit_bytes{").as_deref(),
            Some("18446744073709551610")
        );
        assert_eq!(
            value("hami_vgpu_memory_used_bytes{").as_deref(),
            Some("9223372036854775808")
        );
    }

    #[test]
    fn legacy_series_only_with_the_flag_and_the_memory_controller_ratio_without_node() {
        let mut s = Snapshot {
            regions: vec![RegionView {
                labels: vec![
                    ("namespace".into(), "ns".into()),
                    ("pod".into(), "p".into()),
                    ("container".into(), "c".into()),
                ],
                devices: vec![RegionDevice {
                    uuid: "GPU-x".into(),
                    total: 600,
                    context: 500,
                    module: 7,
                    data: 93,
                    ..RegionDevice::default()
                }],
                last_kernel_time: 0,
                dead_slots: 0,
            }],
            host: vec![DeviceSample {
                uuid: "GPU-x".into(),
                device_type: "NVIDIA-Sim".into(),
                memory_used: 9,
                utilization: Some(40),
                memory_utilization: Some(20),
                ..DeviceSample::default()
            }],
            node: "n1",
            ..Snapshot::default()
        };
        let text = render(&s, &Counters::default());
        let legacy = [
            "HostGPUMemoryUsage",
            "HostCoreUtilization",
            "vGPU_",
            "Device_",
        ];
        assert!(
            !text
                .lines()
                .any(|l| legacy.iter().any(|n| l.starts_with(n))),
            "{text}"
        );
        assert!(text.lines().any(|l| l
            == r#"hami_host_gpu_memory_controller_utilization_ratio{zone="vGPU",device_index="0",device_uuid="GPU-x",device_type="NVIDIA-Sim"} 20.0"#));
        s.legacy = true;
        let text = render(&s, &Counters::default());
        for line in [
            r#"HostGPUMemoryUsage{zone="vGPU",deviceidx="0",deviceuuid="GPU-x",devicetype="NVIDIA-Sim"} 9"#,
            r#"HostCoreUtilization{zone="vGPU",deviceidx="0",deviceuuid="GPU-x",devicetype="NVIDIA-Sim"} 40"#,
            r#"vGPU_device_memory_usage_in_bytes{zone="vGPU",podnamespace="ns",podname="p",ctrname="c",vdeviceid="0",deviceuuid="GPU-x"} 600"#,
            r#"Device_memory_desc_of_container{zone="vGPU",podnamespace="ns",podname="p",ctrname="c",vdeviceid="0",deviceuuid="GPU-x",context="500",module="7",data="93",offset="0"} 600"#,
            "# TYPE Device_memory_desc_of_container unknown",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(
            !text.contains("Device_last_kernel_of_container{"),
            "never launched"
        );
    }
}
