//! Host paths and ports the loader depends on. The Kubernetes manifests in
//! `deploy/` must mount and expose exactly these; a test checks them against
//! this file, so the two cannot drift.

/// HAMi's hook directory on the node (`${HOOK_PATH}/vgpu`): `libvgpu.so`
/// and `ld.so.preload` live here.
pub const HOOK_DIR: &str = "/usr/local/vgpu";
/// Per-container region directories (`<podUID>_<ctrName>/*.cache`).
pub const CONTAINERS_DIR: &str = "/usr/local/vgpu/containers";
/// The roots of region directories under the hook directory ([`HOOK_DIR`]
/// or the daemon's `--hook-dir`), one per host that injects HAMi-core:
/// - HAMi's device plugin: `containers/<podUID>_<ctr>/` ([`CONTAINERS_DIR`]);
/// - Volcano's vGPU device plugin, whose `HOOK_PATH` is the hook directory
///   itself and which adds `vgpu/containers/<podUID>_<ctr>/`
///   (Project-HAMi/volcano-vgpu-device-plugin 4fb76ba, `pkg/plugin/server.go`
///   `Allocate`);
/// - HAMi's DRA kubelet plugin: `claims/<claim UID>/<uuid>.cache`
///   (Project-HAMi/k8s-dra-driver ebeaad9,
///   `cmd/hami-kubelet-plugin/hami_core.go` `GetCDIContainerEdits`), the
///   directory mounted at the same path in the container.
pub const REGION_ROOTS_IN_HOOK_DIR: [&str; 3] = ["containers", "vgpu/containers", "claims"];
/// Kernel BTF, for struct offsets of the namespace-PID probes. sysfs is
/// not namespaced for it: a container's own /sys shows the host kernel's.
pub const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";
/// cgroup v2 mount on Kubernetes nodes (cgroup id -> pod and container).
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The kubelet's pod log directories, `<namespace>_<pod>_<podUID>`: the
/// daemon names pods from them without asking the API server.
pub const PODS_LOG_DIR: &str = "/var/log/pods";
/// containerd's task bundles (`<namespace>/<container id>/config.json`,
/// the OCI spec the daemon takes a container's limits from).
pub const CONTAINERD_TASKS_DIR: &str = "/run/containerd/io.containerd.runtime.v2.task";
/// CRI-O's per-container state (`<container id>/userdata/config.json`).
pub const CRIO_CONTAINERS_DIR: &str = "/run/containers/storage/overlay-containers";
/// Default port of the daemon's HTTP endpoint (HAMi's monitor uses 9394).
pub const METRICS_PORT: u16 = 9396;
/// Prometheus text.
pub const METRICS_PATH: &str = "/metrics";
/// 200 once the probes are attached and the first scan is done.
pub const READY_PATH: &str = "/readyz";
/// 200 while the daemon's loops are alive.
pub const HEALTH_PATH: &str = "/healthz";
