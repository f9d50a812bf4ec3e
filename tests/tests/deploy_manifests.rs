//! The Kubernetes manifests in `deploy/` parse into the typed API structs and
//! give the daemon what its code uses: host PID, capabilities, a mount for
//! every host path in `vgpu_common::paths`, the metrics port and probe paths.
//! The Dockerfile's build stage runs only README.md commands.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use vgpu_common::paths;
use vgpu_tests::dist::workspace_root;

fn base() -> PathBuf {
    workspace_root().join("deploy/base")
}

fn load<T: serde::de::DeserializeOwned>(file: &str) -> T {
    let text = std::fs::read_to_string(base().join(file)).unwrap();
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn daemonset() -> DaemonSet {
    load("daemonset.yaml")
}

fn container<'a>(list: &'a [Container], name: &str) -> &'a Container {
    list.iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The host path mounted at `mount_path` in `c` (hostPath volumes only).
fn host_path_of(ds: &DaemonSet, c: &Container, covers: &str) -> Option<String> {
    let spec = ds.spec.template.spec.as_ref()?;
    let mounts = c.volume_mounts.as_ref()?;
    mounts.iter().find_map(|m| {
        let rest = Path::new(covers).strip_prefix(&m.mount_path).ok()?;
        let vol = spec.volumes.as_ref()?.iter().find(|v| v.name == m.name)?;
        let host = &vol.host_path.as_ref()?.path;
        let host = Path::new(host);
        let full = if rest.as_os_str().is_empty() {
            host.to_path_buf()
        } else {
            host.join(rest)
        };
        Some(full.to_string_lossy().into_owned())
    })
}

#[test]
fn every_file_the_kustomization_lists_exists_and_parses() {
    let k: serde_yaml::Value = load("kustomization.yaml");
    let resources = k["resources"].as_sequence().expect("resources");
    assert!(resources.len() >= 4);
    for r in resources {
        let name = r.as_str().unwrap();
        let v: serde_yaml::Value = load(name);
        assert!(v["kind"].as_str().is_some(), "{name} has a kind");
    }
}

#[test]
fn daemon_has_host_pid_and_the_capabilities_it_needs() {
    let ds = daemonset();
    let spec = ds.spec.template.spec.as_ref().unwrap();
    assert_eq!(spec.host_pid, Some(true), "host PIDs and /proc/<pid>/root");
    let daemon = container(&spec.containers, "daemon");
    assert_eq!(daemon.args.as_ref().unwrap()[0], "daemon");
    let caps = daemon
        .security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.clone())
        .unwrap_or_default();
    for needed in ["BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"] {
        assert!(
            caps.iter().any(|c| c == needed),
            "missing capability {needed}"
        );
    }
    let res = daemon.resources.as_ref().unwrap();
    assert!(
        res.requests.is_some() && res.limits.is_some(),
        "requests and limits"
    );
}

#[test]
fn every_host_path_the_code_uses_is_mounted_at_the_same_path() {
    let ds = daemonset();
    let spec = ds.spec.template.spec.as_ref().unwrap();
    let daemon = container(&spec.containers, "daemon");
    for p in [
        paths::HOOK_DIR,
        paths::CONTAINERS_DIR,
        paths::BTF_VMLINUX,
        paths::CGROUP_ROOT,
        paths::DRIVER_LIB_DIR,
        paths::CONTAINERD_TASKS_DIR,
        paths::CRIO_CONTAINERS_DIR,
    ] {
        let host = host_path_of(&ds, daemon, p).unwrap_or_else(|| panic!("{p} not mounted"));
        assert_eq!(host, p, "{p} must be the same path on the host");
    }
    let init = container(spec.init_containers.as_ref().unwrap(), "install-hook");
    assert_eq!(
        host_path_of(&ds, init, paths::HOOK_DIR).as_deref(),
        Some(paths::HOOK_DIR)
    );
    let args = init.args.as_ref().unwrap();
    assert_eq!(args[0], "install-hook");
    let dir_arg = args.iter().position(|a| a == "--host-dir").unwrap() + 1;
    assert_eq!(args[dir_arg], paths::HOOK_DIR);
    // The --libc it checks against is mounted from the host.
    let libc_arg = &args[args.iter().position(|a| a == "--libc").unwrap() + 1];
    assert!(
        host_path_of(&ds, init, libc_arg).is_some(),
        "{libc_arg} mounted"
    );
}

#[test]
fn metrics_port_and_probe_paths_match_the_daemon_defaults() {
    let ds = daemonset();
    let spec = ds.spec.template.spec.as_ref().unwrap();
    let daemon = container(&spec.containers, "daemon");
    let port = daemon
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .expect("metrics port");
    assert_eq!(port.container_port, i32::from(paths::METRICS_PORT));
    let args = daemon.args.as_ref().unwrap();
    let listen = &args[args.iter().position(|a| a == "--listen").unwrap() + 1];
    assert!(
        listen.ends_with(&format!(":{}", paths::METRICS_PORT)),
        "{listen}"
    );
    let ready = daemon
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(ready.path.as_deref(), Some(paths::READY_PATH));
    let live = daemon
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(live.path.as_deref(), Some(paths::HEALTH_PATH));

    let svc: Service = load("service.yaml");
    let sp = &svc.spec.unwrap().ports.unwrap()[0];
    assert_eq!(sp.port, i32::from(paths::METRICS_PORT));
    assert_eq!(sp.target_port, Some(IntOrString::String("metrics".into())));
    let sm: serde_yaml::Value = load("servicemonitor.yaml");
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["port"].as_str(), sp.name.as_deref());
    assert_eq!(ep["path"].as_str(), Some(paths::METRICS_PATH));
}

#[test]
fn dockerfile_build_stage_runs_readme_commands() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let docker = std::fs::read_to_string(root.join("deploy/Dockerfile")).unwrap();
    let build_stage: Vec<&str> = docker
        .split("\nFROM ")
        .nth(1)
        .expect("a build stage")
        .lines()
        .filter_map(|l| l.strip_prefix("RUN "))
        .collect();
    assert!(
        build_stage.contains(&"cargo xtask build"),
        "the build stage builds with xtask: {build_stage:?}"
    );
    for cmd in build_stage {
        assert!(
            readme.contains(cmd),
            "Dockerfile runs {cmd:?}, which README.md does not give"
        );
    }
}
