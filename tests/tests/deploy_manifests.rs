//! The Kubernetes manifests in `deploy/`, rendered for both overlays
//! (`hami`, `standalone`) with the optional components (`deploy/components`:
//! ServiceMonitor, PrometheusRule) by a small Kustomize renderer below, which
//! is checked against `kubectl kustomize`. Every overlay with every
//! combination of components renders with kubectl and is valid against
//! Kubernetes' schemas (kubernetes-validate, strict). Each rendering parses
//! into the typed API structs and passes the structural checks: host paths only from an allowlist every node has, the Pod
//! Security label, the documented node selector, the hook installer, and
//! what the daemon's code uses (host PID, capabilities, every host path in
//! `vgpu_common::paths`, the metrics port and probe paths). The `dra`
//! overlay (vgpu's DRA driver beside the daemon) and the claims of
//! deploy/examples/dra are rendered with kubectl and validated at 1.34, the
//! first with `resource.k8s.io/v1`, and the newest; their own checks
//! follow the plugin's flags to its host paths, its token and its class.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_yaml::{Mapping, Value};
use vgpu_common::paths;
use vgpu_tests::dist::workspace_root;
use vgpu_tests::manifests::images_in;

const OVERLAYS: [&str; 2] = ["hami", "standalone"];

/// deploy/components: what needs the Prometheus Operator's CRDs.
const COMPONENTS: [&str; 2] = ["servicemonitor", "prometheusrule"];

/// The kinds those components add: Kubernetes' own schemas do not have
/// them (the operator's CRDs define them), so kubernetes-validate skips
/// them; their content is checked below and in daemon_deploy.rs.
const CRD_KINDS: [&str; 2] = ["ServiceMonitor", "PrometheusRule"];

/// The overlay with vgpu's DRA driver, checked on its own below: it needs
/// `resource.k8s.io/v1` (Kubernetes 1.34) and kubelet's plugin paths.
const DRA_OVERLAY: &str = "dra";

/// Kubernetes versions the DRA overlay and examples must be valid for: the
/// first with `resource.k8s.io/v1`, and the newest kubernetes-validate
/// knows.
const DRA_KUBERNETES_VERSIONS: [&str; 2] = ["1.34.0", "1.37.0"];

/// Kubernetes versions the rendered manifests must be valid for.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.29.0", "1.37.0"];

/// Host paths every node has, or that the DaemonSet creates: HAMi's hook
/// directory, the cgroup mount, the kubelet's pod logs, vgpu's state, and
/// the container runtime's state (containerd's or CRI-O's: a node has one,
/// and the other is created empty), where each container's OCI spec says
/// the limits its device plugin gave it.
const HOST_PATH_ALLOWLIST: [&str; 6] = [
    "/usr/local/vgpu",
    "/sys/fs/cgroup",
    "/var/log/pods",
    "/run/vgpu",
    "/run/containerd/io.containerd.runtime.v2.task",
    "/run/containers/storage/overlay-containers",
];

fn read_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

use serde::Deserialize as _;

/// Strategic merge as Kustomize applies it to these manifests: maps merge
/// key by key (a null deletes the key), lists of named objects merge by
/// name (new names are appended), anything else is replaced.
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Mapping(b), Value::Mapping(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else if let Some(old) = b.get_mut(k) {
                    merge(old, v);
                } else {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        (Value::Sequence(b), Value::Sequence(p))
            if p.iter().all(|v| v.get("name").is_some()) && !p.is_empty() =>
        {
            for item in p {
                match b.iter_mut().find(|x| x.get("name") == item.get("name")) {
                    Some(old) => merge(old, item),
                    None => b.push(item.clone()),
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

fn id(v: &Value) -> (String, String) {
    (
        v["kind"].as_str().unwrap_or_default().to_owned(),
        v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

/// Renders the kustomization in `dir`: its resources (files, or
/// directories with their own kustomization), then its components, then
/// its patches, its labels, and its image replacements (Kustomize's order).
/// A component's labels apply to its own objects only here (Kustomize's
/// to everything before it too): the components repeat the base's labels,
/// so both give the same result.
fn render(dir: &Path) -> Vec<Value> {
    let k = &read_docs(&dir.join("kustomization.yaml"))[0];
    let mut docs = Vec::new();
    for r in k["resources"].as_sequence().expect("resources") {
        let path = dir.join(r.as_str().unwrap());
        if path.is_dir() {
            docs.extend(render(&path));
        } else {
            docs.extend(read_docs(&path));
        }
    }
    for c in k["components"].as_sequence().into_iter().flatten() {
        docs.extend(render(&dir.join(c.as_str().unwrap())));
    }
    for p in k["patches"].as_sequence().into_iter().flatten() {
        for patch in read_docs(&dir.join(p["path"].as_str().expect("patch path"))) {
            let target = docs
                .iter_mut()
                .find(|d| id(d) == id(&patch))
                .unwrap_or_else(|| panic!("patch target {:?} missing", id(&patch)));
            merge(target, &patch);
        }
    }
    for l in k["labels"].as_sequence().into_iter().flatten() {
        let templates = l["includeTemplates"].as_bool().unwrap_or(false);
        for d in &mut docs {
            add_labels(d, &["metadata", "labels"], &l["pairs"]);
            if templates && d["spec"]["template"].is_mapping() {
                add_labels(d, &["spec", "template", "metadata", "labels"], &l["pairs"]);
            }
        }
    }
    for img in k["images"].as_sequence().into_iter().flatten() {
        let name = img["name"].as_str().unwrap();
        let new = format!(
            "{}:{}",
            img["newName"].as_str().unwrap(),
            img["newTag"].as_str().unwrap()
        );
        for d in &mut docs {
            replace_image(d, name, &new);
        }
    }
    docs
}

/// Sets `pairs` in the mapping at `path` of `doc`, creating what is missing.
fn add_labels(doc: &mut Value, path: &[&str], pairs: &Value) {
    let mut at = doc;
    for key in path {
        let m = at.as_mapping_mut().expect("a mapping");
        at = m
            .entry(Value::String((*key).to_owned()))
            .or_insert_with(|| Value::Mapping(Mapping::new()));
    }
    let m = at.as_mapping_mut().expect("a label mapping");
    for (k, v) in pairs.as_mapping().expect("label pairs") {
        m.insert(k.clone(), v.clone());
    }
}

fn replace_image(v: &mut Value, name: &str, new: &str) {
    match v {
        Value::Mapping(m) => {
            for (k, val) in m.iter_mut() {
                if k.as_str() == Some("image") && val.as_str() == Some(name) {
                    *val = Value::String(new.to_owned());
                } else {
                    replace_image(val, name, new);
                }
            }
        }
        Value::Sequence(s) => s.iter_mut().for_each(|x| replace_image(x, name, new)),
        _ => {}
    }
}

/// Maps compare without key order; sequences of named objects without order.
fn normalize(v: &Value) -> Value {
    match v {
        Value::Mapping(m) => {
            let sorted: BTreeMap<String, Value> = m
                .iter()
                .map(|(k, v)| {
                    let k = k
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| serde_yaml::to_string(k).unwrap());
                    (k, normalize(v))
                })
                .collect();
            let mut out = Mapping::new();
            for (k, v) in sorted {
                out.insert(Value::String(k), v);
            }
            Value::Mapping(out)
        }
        Value::Sequence(s) => {
            let mut items: Vec<Value> = s.iter().map(normalize).collect();
            if items.iter().all(|i| i.get("name").is_some()) {
                items.sort_by_key(|i| serde_yaml::to_string(i).unwrap());
            }
            Value::Sequence(items)
        }
        other => other.clone(),
    }
}

struct Rendered {
    overlay: &'static str,
    docs: Vec<Value>,
}

impl Rendered {
    /// The overlay with every component, as docs/kubernetes.md enables them.
    fn of(overlay: &'static str) -> Rendered {
        let copy = with_components(overlay, &COMPONENTS);
        Rendered {
            overlay,
            docs: render(&copy.path().join("overlays").join(overlay)),
        }
    }

    fn get<T: serde::de::DeserializeOwned>(&self, kind: &str) -> T {
        let v = self
            .docs
            .iter()
            .find(|d| d["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("{}: no {kind}", self.overlay));
        serde_yaml::from_value(v.clone())
            .unwrap_or_else(|e| panic!("{}: {kind}: {e}", self.overlay))
    }

    fn raw(&self, kind: &str) -> &Value {
        self.docs
            .iter()
            .find(|d| d["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("{}: no {kind}", self.overlay))
    }
}

/// A copy of deploy/ whose `overlay` lists `components` (the documented
/// edit of docs/kubernetes.md, "Monitoring").
fn with_components(overlay: &str, components: &[&str]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let cp = Command::new("cp")
        .arg("-r")
        .arg(workspace_root().join("deploy/."))
        .arg(tmp.path())
        .status()
        .unwrap();
    assert!(cp.success());
    let k = tmp
        .path()
        .join("overlays")
        .join(overlay)
        .join("kustomization.yaml");
    let mut doc = read_docs(&k).remove(0);
    if !components.is_empty() {
        let list = components
            .iter()
            .map(|c| Value::String(format!("../../components/{c}")))
            .collect();
        doc.as_mapping_mut()
            .unwrap()
            .insert("components".into(), Value::Sequence(list));
    }
    std::fs::write(&k, serde_yaml::to_string(&doc).unwrap()).unwrap();
    tmp
}

/// `kubectl kustomize` of an overlay directory, as YAML text.
fn kubectl_kustomize(dir: &Path) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl (with kustomize) is needed to render the overlays");
    assert!(
        out.status.success(),
        "{}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn all() -> Vec<Rendered> {
    OVERLAYS.iter().map(|o| Rendered::of(o)).collect()
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

fn arg_after<'a>(args: &'a [String], flag: &str) -> &'a str {
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    &args[i + 1]
}

#[test]
fn the_renderer_agrees_with_kubectl_kustomize() {
    for o in OVERLAYS {
        let copy = with_components(o, &COMPONENTS);
        let dir = copy.path().join("overlays").join(o);
        let text = kubectl_kustomize(&dir);
        let mut theirs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| normalize(&Value::deserialize(d).unwrap()))
            .collect();
        let mut ours: Vec<Value> = render(&dir).iter().map(normalize).collect();
        let key = |v: &Value| serde_yaml::to_string(v).unwrap();
        ours.sort_by_key(key);
        theirs.sort_by_key(key);
        assert_eq!(ours.len(), theirs.len(), "{o}");
        for (a, b) in ours.iter().zip(&theirs) {
            assert_eq!(a, b, "{o}: rendered differently from kubectl kustomize");
        }
    }
}

/// Every overlay, alone and with each combination of components, renders
/// with `kubectl kustomize` and passes kubernetes-validate in strict mode
/// (unknown fields are errors) for each supported Kubernetes version,
/// offline (the schemas ship with it; `cargo xtask setup` installs it).
/// Without components nothing needs the Prometheus Operator's CRDs, so
/// `kubectl apply -k` works on a cluster without them.
#[test]
fn every_overlay_with_every_component_is_schema_valid() {
    let combos: [&[&str]; 4] = [
        &[],
        &["servicemonitor"],
        &["prometheusrule"],
        &["servicemonitor", "prometheusrule"],
    ];
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--version"])
        .output();
    assert!(
        out.is_ok_and(|o| o.status.success()),
        "kubernetes-validate is needed: run `cargo xtask setup`"
    );
    for o in OVERLAYS {
        for combo in combos {
            let copy = with_components(o, combo);
            let text = kubectl_kustomize(&copy.path().join("overlays").join(o));
            let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
                .map(|d| Value::deserialize(d).unwrap())
                .collect();
            let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
            for (component, kind) in COMPONENTS.iter().zip(CRD_KINDS) {
                assert_eq!(
                    kinds.contains(&kind),
                    combo.contains(component),
                    "{o} {combo:?}: {kind} only with its component: {kinds:?}"
                );
            }
            // kubectl's own text is validated (a YAML round trip here
            // could change how a value reads, `on` for "on"), without the
            // documents of the CRD kinds.
            let core: Vec<&str> = text
                .split("\n---\n")
                .filter(|d| {
                    !d.lines().any(|l| {
                        l.strip_prefix("kind: ")
                            .is_some_and(|k| CRD_KINDS.contains(&k.trim()))
                    })
                })
                .collect();
            assert_eq!(
                core.len(),
                kinds.len() - combo.len(),
                "{o} {combo:?}: {kinds:?}"
            );
            let file = copy.path().join("rendered.yaml");
            std::fs::write(&file, core.join("\n---\n")).unwrap();
            for version in KUBERNETES_VERSIONS {
                let out = Command::new("python3")
                    .args(["-m", "kubernetes_validate", "--strict", "--quiet"])
                    .args(["-k", version])
                    .arg(&file)
                    .output()
                    .unwrap();
                let said = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                // --quiet prints only failures and warnings (a kind without
                // a schema is a warning: none is expected here).
                assert!(
                    out.status.success() && said.trim().is_empty(),
                    "{o} {combo:?} against Kubernetes {version}:\n{said}"
                );
            }
        }
    }
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to `-`,
/// punctuation other than `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Whether `cargo xtask release` copies `file` into the bundle (its `DOCS`
/// list; tests/tests/release_bundle.rs checks a real bundle as root).
fn release_ships(file: &str) -> bool {
    let src = std::fs::read_to_string(workspace_root().join("xtask/src/release.rs")).unwrap();
    let list = src
        .split_once("const DOCS: &[&str] = &[")
        .and_then(|(_, rest)| rest.split_once("];"))
        .map(|(list, _)| list)
        .expect("DOCS in xtask/src/release.rs");
    list.contains(&format!("\"{file}\""))
}

/// Nothing shipped names a home the project does not have: no made-up
/// repository, image registry or changelog links.
#[test]
fn nothing_shipped_names_a_made_up_address() {
    let root = workspace_root();
    let mut files = vec![root.join("Cargo.toml"), root.join("CHANGELOG.md")];
    let mut dirs = vec![root.join("deploy")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for bad in ["example.invalid", "ghcr.io/example", "example.com/vgpu"] {
            assert!(!text.contains(bad), "{} names {bad}", f.display());
        }
    }
}

/// Every alert links its own section of docs/runbooks.md (shipped in the
/// release bundle), and names in its annotations only labels its expression
/// keeps (a `by` label, or a target's for `up`); the ones about a node or a
/// container name them.
#[test]
fn every_alert_has_a_runbook_and_names_what_it_keeps() {
    let r = Rendered::of("hami");
    let rule = r.raw("PrometheusRule");
    let book = std::fs::read_to_string(workspace_root().join("docs/runbooks.md")).unwrap();
    let anchors: Vec<String> = book
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(anchor)
        .collect();
    // Relative to the source tree and to the release bundle, which ships
    // docs/runbooks.md: no made-up host.
    let prefix = "docs/runbooks.md#";
    assert!(
        release_ships("docs/runbooks.md"),
        "cargo xtask release does not ship docs/runbooks.md"
    );
    let mut linked = Vec::new();
    for g in rule["spec"]["groups"].as_sequence().unwrap() {
        for a in g["rules"].as_sequence().unwrap() {
            let name = a["alert"].as_str().unwrap();
            let url = a["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no runbook_url"));
            let at = url
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("{name}: {url} is not under {prefix}"));
            assert_eq!(at, anchor(name), "{name}: its own section");
            assert!(
                anchors.iter().any(|x| x == at),
                "{name}: no section #{at} in docs/runbooks.md"
            );
            linked.push(at.to_owned());
            let expr = a["expr"].as_str().unwrap();
            // What the expression keeps: its `by (...)` labels, or for a
            // bare `up` selector every target label.
            let kept: Vec<&str> = match expr.split_once("by (") {
                Some((_, rest)) => rest
                    .split(')')
                    .next()
                    .unwrap()
                    .split(',')
                    .map(str::trim)
                    .collect(),
                None if expr.starts_with("up{") => {
                    vec!["instance", "job", "namespace", "pod", "service", "node"]
                }
                None => Vec::new(),
            };
            let mut text = String::new();
            for k in ["summary", "description"] {
                text.push_str(a["annotations"][k].as_str().unwrap_or_default());
            }
            for used in text.split("$labels.").skip(1) {
                let l: String = used
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    kept.contains(&l.as_str()),
                    "{name}: $labels.{l} is not kept by {expr}"
                );
            }
            if !kept.is_empty() {
                assert!(
                    text.contains("$labels.node"),
                    "{name}: the node is not named"
                );
            }
            if kept.contains(&"pod") {
                assert!(text.contains("$labels.pod"), "{name}: the pod is not named");
            }
        }
    }
    // Every section is an alert's.
    assert_eq!(linked.len(), anchors.len(), "{anchors:?} vs {linked:?}");
    // `up` has a node only through the ServiceMonitor's relabeling.
    let sm = with_components("hami", &["servicemonitor"]);
    let text = kubectl_kustomize(&sm.path().join("overlays").join("hami"));
    assert!(
        text.contains("__meta_kubernetes_pod_node_name") && text.contains("targetLabel: node"),
        "{text}"
    );
}

/// The PrometheusRule: one group of alerts, each named once, with an
/// expression, a severity and a summary; one for each of over-limit,
/// tampering, untracked memory and a dead daemon. (That the expressions
/// name the daemon's real metrics and kinds is checked against a running
/// daemon in daemon_deploy.rs.)
#[test]
fn the_alert_rules_cover_what_the_daemon_finds() {
    let r = Rendered::of("hami");
    let rule = r.raw("PrometheusRule");
    assert_eq!(
        rule["apiVersion"].as_str(),
        Some("monitoring.coreos.com/v1")
    );
    let mut names = Vec::new();
    let mut exprs = String::new();
    for g in rule["spec"]["groups"].as_sequence().unwrap() {
        for a in g["rules"].as_sequence().unwrap() {
            let name = a["alert"].as_str().expect("an alerting rule").to_owned();
            assert!(!names.contains(&name), "{name} twice");
            let expr = a["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no expr"));
            assert!(
                matches!(
                    a["labels"]["severity"].as_str(),
                    Some("warning" | "critical")
                ),
                "{name}"
            );
            assert!(a["annotations"]["summary"].as_str().is_some(), "{name}");
            exprs.push_str(expr);
            exprs.push('\n');
            names.push(name);
        }
    }
    for want in [
        "kind=\"over_limit\"",
        "limit_tampered",
        "untracked_allocation",
        "up{job=\"vgpu-metrics\"}",
    ] {
        assert!(exprs.contains(want), "no alert on {want}:\n{exprs}");
    }
    // The job the ServiceMonitor scrapes is the Service's name.
    let svc: Service = r.get("Service");
    assert_eq!(svc.metadata.name.as_deref(), Some("vgpu-metrics"));
}

#[test]
fn host_paths_only_from_the_allowlist() {
    for r in all() {
        let ds: DaemonSet = r.get("DaemonSet");
        let vols = ds.spec.template.spec.unwrap().volumes.unwrap_or_default();
        for v in vols {
            if let Some(hp) = v.host_path {
                assert!(
                    HOST_PATH_ALLOWLIST.contains(&hp.path.as_str()),
                    "{}: hostPath {} is not on every node",
                    r.overlay,
                    hp.path
                );
                // A directory vgpu or HAMi makes must be created if missing.
                if hp.path != paths::CGROUP_ROOT {
                    assert_eq!(
                        hp.type_.as_deref(),
                        Some("DirectoryOrCreate"),
                        "{}",
                        hp.path
                    );
                }
            }
        }
    }
}

#[test]
fn namespace_admits_privileged_pods_and_node_selector_is_as_documented() {
    for r in all() {
        let ns: Namespace = r.get("Namespace");
        let labels = ns.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels
                .get("pod-security.kubernetes.io/enforce")
                .map(String::as_str),
            Some("privileged"),
            "{}",
            r.overlay
        );
        let ds: DaemonSet = r.get("DaemonSet");
        let spec = ds.spec.template.spec.unwrap();
        let sel = spec.node_selector.unwrap_or_default();
        let want: BTreeMap<String, String> = match r.overlay {
            // HAMi's chart: devicePlugin.nvidiaNodeSelector.
            "hami" => [("gpu".to_owned(), "on".to_owned())].into(),
            // GPU Feature Discovery's label.
            _ => [("nvidia.com/gpu.present".to_owned(), "true".to_owned())].into(),
        };
        assert_eq!(sel, want, "{}", r.overlay);
        // Every container runs the released image.
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            assert_eq!(
                c.image.as_deref(),
                Some("localhost/vgpu:0.1.0"),
                "{}",
                c.name
            );
        }
    }
}

#[test]
fn the_hook_is_installed_for_hami_with_versioned_names_handled_and_kept() {
    for r in all() {
        let ds: DaemonSet = r.get("DaemonSet");
        let spec = ds.spec.template.spec.as_ref().unwrap();
        let init = container(spec.init_containers.as_ref().unwrap(), "install-hook");
        let args = init.args.as_ref().unwrap();
        assert_eq!(args[0], "install-hook");
        assert_eq!(arg_after(args, "--host-dir"), paths::HOOK_DIR);
        assert_eq!(
            host_path_of(&ds, init, paths::HOOK_DIR).as_deref(),
            Some(paths::HOOK_DIR)
        );
        let keeper = spec.containers.iter().find(|c| c.name == "hook-keeper");
        if r.overlay == "hami" {
            assert!(args.iter().any(|a| a == "--hami"), "{args:?}");
            let keeper = keeper.expect("hami: the hook-keeper container");
            let kargs = keeper.args.as_ref().unwrap();
            assert!(kargs.iter().any(|a| a == "--hami"), "{kargs:?}");
            assert!(arg_after(kargs, "--watch").parse::<f64>().unwrap() <= 5.0);
            assert_eq!(
                host_path_of(&ds, keeper, paths::HOOK_DIR).as_deref(),
                Some(paths::HOOK_DIR)
            );
            // The keeper restores HAMi's library on SIGTERM, before the
            // grace period ends in SIGKILL.
            assert!(spec.termination_grace_period_seconds.unwrap_or(30) >= 10);
        } else {
            assert!(!args.iter().any(|a| a == "--hami"), "{args:?}");
            assert!(keeper.is_none());
        }
        let sm = r.raw("ServiceMonitor");
        assert_eq!(
            sm["spec"]["endpoints"][0]["honorLabels"].as_bool(),
            Some(true)
        );
    }
}

#[test]
fn daemon_has_host_pid_and_the_capabilities_it_needs() {
    for r in all() {
        let ds: DaemonSet = r.get("DaemonSet");
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
        // NVML through the NVIDIA container toolkit, not a driver host path.
        let env = daemon.env.as_ref().unwrap();
        let get = |k: &str| {
            env.iter()
                .find(|e| e.name == k)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(get("NVIDIA_VISIBLE_DEVICES").as_deref(), Some("all"));
        assert_eq!(
            get("NVIDIA_DRIVER_CAPABILITIES").as_deref(),
            Some("utility")
        );
    }
}

#[test]
fn every_host_path_the_code_uses_is_mounted_at_the_same_path() {
    for r in all() {
        let ds: DaemonSet = r.get("DaemonSet");
        let spec = ds.spec.template.spec.as_ref().unwrap();
        let daemon = container(&spec.containers, "daemon");
        for p in [
            paths::HOOK_DIR,
            paths::CONTAINERS_DIR,
            paths::CGROUP_ROOT,
            paths::PODS_LOG_DIR,
            paths::CONTAINERD_TASKS_DIR,
            paths::CRIO_CONTAINERS_DIR,
        ] {
            let host = host_path_of(&ds, daemon, p).unwrap_or_else(|| panic!("{p} not mounted"));
            assert_eq!(host, p, "{p} must be the same path on the host");
        }
        let args = daemon.args.as_ref().unwrap();
        assert_eq!(arg_after(args, "--pods-log-dir"), paths::PODS_LOG_DIR);
        assert_eq!(arg_after(args, "--log-format"), "json");
        // BTF comes from the container's own /sys: never a host path.
        assert!(host_path_of(&ds, daemon, paths::BTF_VMLINUX).is_none());
    }
}

#[test]
fn metrics_port_and_probe_paths_match_the_daemon_defaults() {
    let r = Rendered::of("hami");
    let ds: DaemonSet = r.get("DaemonSet");
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

    let svc: Service = r.get("Service");
    let sp = &svc.spec.unwrap().ports.unwrap()[0];
    assert_eq!(sp.port, i32::from(paths::METRICS_PORT));
    assert_eq!(sp.target_port, Some(IntOrString::String("metrics".into())));
    let sm = r.raw("ServiceMonitor");
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["port"].as_str(), sp.name.as_deref());
    assert_eq!(ep["path"].as_str(), Some(paths::METRICS_PATH));
}

#[test]
fn every_flag_the_manifests_pass_exists_in_the_binary() {
    for r in all() {
        let ds: DaemonSet = r.get("DaemonSet");
        let spec = ds.spec.template.spec.as_ref().unwrap();
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let args = c.args.as_ref().unwrap();
            let out = Command::new(vgpu_tests::dist::vgpu_bin())
                .arg(&args[0])
                .arg("--help")
                .output()
                .unwrap();
            let help = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{}: {help}", args[0]);
            for flag in args.iter().filter(|a| a.starts_with("--")) {
                assert!(
                    help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                    "{}: `vgpu {}` has no {flag}",
                    r.overlay,
                    args[0]
                );
            }
        }
    }
}

/// docs/kubernetes.md, "1. The image": editing the overlay's `images:` entry
/// names the image of every container, the base's daemon included, as
/// `kubectl kustomize` renders it (an entry in the base renamed the daemon's
/// image before the overlay's entry could match it).
#[test]
fn the_overlays_image_entry_sets_every_container() {
    let status = Command::new("kubectl")
        .args(["version", "--client"])
        .output();
    assert!(
        status.is_ok_and(|o| o.status.success()),
        "kubectl (with kustomize) is needed to render the overlays"
    );
    let new = "registry.example.com/team/vgpu:9.9.9";
    for o in OVERLAYS.into_iter().chain([DRA_OVERLAY]) {
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join("deploy");
        let cp = Command::new("cp")
            .arg("-r")
            .arg(workspace_root().join("deploy"))
            .arg(&copy)
            .status()
            .unwrap();
        assert!(cp.success());
        // The documented edit: the overlay's newName and newTag.
        let k = copy.join("overlays").join(o).join("kustomization.yaml");
        let mut doc = read_docs(&k).remove(0);
        let images = doc["images"].as_sequence_mut().expect("overlay images");
        assert_eq!(images.len(), 1, "{o}: one image entry");
        images[0]["newName"] = Value::String("registry.example.com/team/vgpu".into());
        images[0]["newTag"] = Value::String("9.9.9".into());
        std::fs::write(&k, serde_yaml::to_string(&doc).unwrap()).unwrap();
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(copy.join("overlays").join(o))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut found = Vec::new();
        for d in serde_yaml::Deserializer::from_str(&String::from_utf8_lossy(&out.stdout)) {
            images_in(&Value::deserialize(d).unwrap(), &mut found);
        }
        assert!(found.len() >= 2, "{o}: containers found: {found:?}");
        assert!(
            found.iter().all(|i| i == new),
            "{o}: after the documented edit every container should run {new}: {found:?}"
        );
    }
}

/// The labels of Kubernetes' recommended set, on every object of every
/// overlay with every component and on the daemon's pods.
const STANDARD_LABELS: [&str; 6] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
];

/// The overlay's image tag (its `images:` entry), what `version` must say.
fn image_tag(overlay: &str) -> String {
    let k = read_docs(
        &workspace_root()
            .join("deploy/overlays")
            .join(overlay)
            .join("kustomization.yaml"),
    )
    .remove(0);
    k["images"][0]["newTag"].as_str().unwrap().to_owned()
}

/// Every object, and the daemon's pod template, carries the standard
/// `app.kubernetes.io/*` labels (`version` the image's tag), while the
/// DaemonSet's selector stays the one label it always had (a selector
/// cannot change on an upgrade).
#[test]
fn every_object_carries_the_standard_labels() {
    for r in all() {
        let tag = image_tag(r.overlay);
        let mut checked = Vec::new();
        for d in &r.docs {
            let (kind, name) = id(d);
            let mut places = vec![("metadata", &d["metadata"]["labels"])];
            if kind == "DaemonSet" {
                places.push(("pod template", &d["spec"]["template"]["metadata"]["labels"]));
            }
            for (place, labels) in places {
                for key in STANDARD_LABELS {
                    let v = labels[key].as_str().unwrap_or_else(|| {
                        panic!(
                            "{}: {kind}/{name} {place} lacks {key}: {labels:?}",
                            r.overlay
                        )
                    });
                    assert!(!v.is_empty(), "{}: {kind}/{name} {key}", r.overlay);
                }
                assert_eq!(labels["app.kubernetes.io/name"].as_str(), Some("vgpu"));
                assert_eq!(labels["app.kubernetes.io/part-of"].as_str(), Some("vgpu"));
                assert_eq!(
                    labels["app.kubernetes.io/version"].as_str(),
                    Some(tag.as_str()),
                    "{}: {kind}/{name}",
                    r.overlay
                );
            }
            checked.push(kind);
        }
        for kind in ["Namespace", "ServiceAccount", "DaemonSet", "Service"]
            .iter()
            .chain(CRD_KINDS.iter())
        {
            assert!(
                checked.iter().any(|k| k == kind),
                "{}: no {kind}",
                r.overlay
            );
        }
        let ds: DaemonSet = r.get("DaemonSet");
        let selector = ds.spec.selector.match_labels.unwrap_or_default();
        assert_eq!(
            selector.into_iter().collect::<Vec<_>>(),
            [("app.kubernetes.io/name".to_owned(), "vgpu".to_owned())],
            "{}",
            r.overlay
        );
    }
}

/// `kubectl logs ds/vgpu` and `kubectl exec ds/vgpu -- vgpu top` reach the
/// daemon (the pod's default container), and no container of the pod can
/// gain privileges or write its image: the daemon writes only the volumes
/// it mounts read-write (its state directory, the node directory, the hook
/// directory's regions).
#[test]
fn the_daemon_is_the_default_container_and_no_container_writes_its_root() {
    for r in all() {
        let ds: DaemonSet = r.get("DaemonSet");
        let meta = ds.spec.template.metadata.as_ref().unwrap();
        let default = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubectl.kubernetes.io/default-container"))
            .unwrap_or_else(|| panic!("{}: no default-container annotation", r.overlay));
        assert_eq!(default, "daemon", "{}", r.overlay);
        let spec = ds.spec.template.spec.as_ref().unwrap();
        let daemon = container(&spec.containers, default);
        assert_eq!(daemon.args.as_ref().unwrap()[0], "daemon");
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let sc = c
                .security_context
                .as_ref()
                .unwrap_or_else(|| panic!("{}: {} has no securityContext", r.overlay, c.name));
            assert_eq!(
                sc.allow_privilege_escalation,
                Some(false),
                "{}: {}",
                r.overlay,
                c.name
            );
            assert_eq!(
                sc.read_only_root_filesystem,
                Some(true),
                "{}: {}",
                r.overlay,
                c.name
            );
        }
        let writable =
            |path: &str| {
                daemon.volume_mounts.iter().flatten().any(|m| {
                    Path::new(path).starts_with(&m.mount_path) && m.read_only != Some(true)
                })
            };
        let args = daemon.args.as_ref().unwrap();
        let state = args
            .iter()
            .position(|a| a == "--state-dir")
            .map_or("/run/vgpu", |i| args[i + 1].as_str());
        for p in [state, paths::CONTAINERS_DIR] {
            assert!(writable(p), "{}: the daemon cannot write {p}", r.overlay);
        }
    }
}

/// kubernetes-validate (strict, offline) of the YAML text in `file`, for
/// every supported Kubernetes version; `what` names it in the failure.
fn assert_schema_valid(file: &Path, what: &str) {
    for version in KUBERNETES_VERSIONS {
        let out = Command::new("python3")
            .args(["-m", "kubernetes_validate", "--strict", "--quiet"])
            .args(["-k", version])
            .arg(file)
            .output()
            .expect("kubernetes-validate is needed: run `cargo xtask setup`");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.trim().is_empty(),
            "{what} against Kubernetes {version}:\n{said}"
        );
    }
}

/// The YAML block of docs/kubernetes.md that enables the port's
/// restrictions ("Restricting the port"), as an operator copies it.
fn documented_port_restriction() -> Mapping {
    let doc = std::fs::read_to_string(workspace_root().join("docs/kubernetes.md")).unwrap();
    let block = doc
        .split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split_once("```").map(|(code, _)| code))
        .find(|code| code.contains("components/networkpolicy"))
        .expect("docs/kubernetes.md shows the kustomization lines of components/networkpolicy");
    serde_yaml::from_str(block).unwrap()
}

/// The NetworkPolicy and TLS components, enabled with exactly the lines
/// docs/kubernetes.md shows (components and the selector patch), render
/// on both overlays and validate against Kubernetes' schemas. The policy
/// selects the daemon pods and admits only their metrics port, only from
/// the namespace and pods the patch names; the daemon container (found by
/// name: the components patch the base's daemon before an overlay adds its
/// containers) gets --tls-cert/--tls-key from the mounted TLS Secret, and
/// its probes speak HTTPS. The NetworkPolicy alone keeps its defaults.
#[test]
fn the_port_is_restricted_by_the_documented_tls_and_networkpolicy_lines() {
    let extra = documented_port_restriction();
    for o in OVERLAYS {
        let copy = with_components(o, &[]);
        let dir = copy.path().join("overlays").join(o);
        let k = dir.join("kustomization.yaml");
        let mut doc = read_docs(&k).remove(0);
        let map = doc.as_mapping_mut().unwrap();
        for (key, value) in &extra {
            match (map.get_mut(key), value) {
                (Some(Value::Sequence(have)), Value::Sequence(add)) => have.extend(add.clone()),
                _ => {
                    map.insert(key.clone(), value.clone());
                }
            }
        }
        std::fs::write(&k, serde_yaml::to_string(&doc).unwrap()).unwrap();
        let text = kubectl_kustomize(&dir);
        let file = copy.path().join("rendered.yaml");
        std::fs::write(&file, &text).unwrap();
        assert_schema_valid(&file, &format!("{o} with tls and networkpolicy"));

        let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| Value::deserialize(d).unwrap())
            .collect();
        let of = |kind: &str| {
            docs.iter()
                .find(|d| d["kind"].as_str() == Some(kind))
                .unwrap_or_else(|| panic!("{o}: no {kind}"))
        };
        let np = &of("NetworkPolicy")["spec"];
        assert_eq!(
            np["podSelector"]["matchLabels"]["app.kubernetes.io/name"].as_str(),
            Some("vgpu"),
            "{o}: {np:?}"
        );
        assert_eq!(np["policyTypes"][0].as_str(), Some("Ingress"), "{o}");
        assert_eq!(np["ingress"].as_sequence().map(Vec::len), Some(1), "{o}");
        let rule = &np["ingress"][0];
        assert_eq!(rule["ports"][0]["port"].as_str(), Some("metrics"), "{o}");
        let from = &rule["from"][0];
        assert_eq!(
            from["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"].as_str(),
            Some("observability"),
            "{o}: {rule:?}"
        );
        assert_eq!(
            from["podSelector"]["matchLabels"]["app"].as_str(),
            Some("prometheus"),
            "{o}: {rule:?}"
        );

        let ds: DaemonSet = serde_yaml::from_value(of("DaemonSet").clone()).unwrap();
        let spec = ds.spec.template.spec.unwrap();
        let daemon = container(&spec.containers, "daemon");
        let args = daemon.args.clone().unwrap();
        for flag in [
            "--tls-cert=/etc/vgpu/tls/tls.crt",
            "--tls-key=/etc/vgpu/tls/tls.key",
        ] {
            assert!(args.iter().any(|a| a == flag), "{o}: {args:?}");
        }
        for probe in [&daemon.readiness_probe, &daemon.liveness_probe] {
            let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap();
            assert_eq!(get.scheme.as_deref(), Some("HTTPS"), "{o}");
        }
        for c in spec.containers.iter().filter(|c| c.name != "daemon") {
            let args = c.args.clone().unwrap_or_default();
            assert!(!args.iter().any(|a| a.starts_with("--tls")), "{o}: {c:?}");
        }
        let mount = daemon
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.mount_path == "/etc/vgpu/tls")
            .expect("the TLS Secret mounted");
        assert_eq!(mount.read_only, Some(true), "{o}");
        let vol = spec
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == mount.name)
            .unwrap();
        assert_eq!(
            vol.secret.as_ref().and_then(|s| s.secret_name.as_deref()),
            Some("vgpu-metrics-tls"),
            "{o}"
        );

        // The policy alone, unpatched: kube-prometheus-stack's defaults.
        let copy = with_components(o, &["networkpolicy"]);
        let text = kubectl_kustomize(&copy.path().join("overlays").join(o));
        let file = copy.path().join("rendered.yaml");
        std::fs::write(&file, &text).unwrap();
        assert_schema_valid(&file, &format!("{o} with networkpolicy"));
        assert!(
            text.contains("kubernetes.io/metadata.name: monitoring")
                && !text.contains("--tls-cert"),
            "{o}: {text}"
        );
    }
}

/// kubernetes-validate (strict, offline, `--quiet`: only failures and
/// warnings print) of `file` at `versions`.
fn assert_schema_valid_at(file: &Path, what: &str, versions: &[&str]) {
    for version in versions {
        let out = Command::new("python3")
            .args(["-m", "kubernetes_validate", "--strict", "--quiet"])
            .args(["-k", version])
            .arg(file)
            .output()
            .expect("kubernetes-validate is needed: run `cargo xtask setup`");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.trim().is_empty(),
            "{what} against Kubernetes {version}:\n{said}"
        );
    }
}

/// `kubectl kustomize deploy/overlays/dra`: its text and its documents.
fn dra_rendered() -> (String, Vec<Value>) {
    let text = kubectl_kustomize(&workspace_root().join("deploy/overlays").join(DRA_OVERLAY));
    let docs = serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
    (text, docs)
}

fn dra_doc<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("dra: no {kind}"))
}

/// The DRA overlay, as `kubectl kustomize` renders it, and every example
/// of deploy/examples/dra pass kubernetes-validate in strict mode at 1.34
/// and the newest version it knows.
#[test]
fn the_dra_overlay_and_its_examples_are_schema_valid() {
    let (text, docs) = dra_rendered();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Service",
        "DeviceClass",
    ] {
        assert!(kinds.contains(&kind), "dra: no {kind} in {kinds:?}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("dra.yaml");
    std::fs::write(&file, &text).unwrap();
    assert_schema_valid_at(&file, "deploy/overlays/dra", &DRA_KUBERNETES_VERSIONS);
    let examples = workspace_root().join("deploy/examples/dra");
    let mut files: Vec<_> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for f in &files {
        assert_schema_valid_at(f, &f.display().to_string(), &DRA_KUBERNETES_VERSIONS);
    }
}

/// What the examples promise: a template of 8 GiB and 30 %, two pods with
/// a claim each from it, a latency service at priority 0; every request of
/// the overlay's DeviceClass, whose selector picks the plugin's driver.
#[test]
fn the_dra_examples_ask_the_overlays_class_for_what_they_say() {
    let (_, docs) = dra_rendered();
    let ds: DaemonSet = serde_yaml::from_value(dra_doc(&docs, "DaemonSet").clone()).unwrap();
    let spec = ds.spec.template.spec.unwrap();
    let plugin = container(&spec.containers, "dra-plugin");
    let driver = arg_after(plugin.args.as_ref().unwrap(), "--driver").to_owned();
    let class = dra_doc(&docs, "DeviceClass");
    let class_name = class["metadata"]["name"].as_str().unwrap();
    assert_eq!(
        class["spec"]["selectors"][0]["cel"]["expression"].as_str(),
        Some(format!("device.driver == \"{driver}\"").as_str())
    );
    let mut templates = BTreeMap::new();
    let mut pods = Vec::new();
    let examples = workspace_root().join("deploy/examples/dra");
    for f in [
        "claim-template.yaml",
        "two-pods-one-gpu.yaml",
        "latency-service.yaml",
    ] {
        for d in read_docs(&examples.join(f)) {
            match d["kind"].as_str() {
                Some("ResourceClaimTemplate") => {
                    templates.insert(d["metadata"]["name"].as_str().unwrap().to_owned(), d);
                }
                Some("Pod") => pods.push(d["spec"].clone()),
                Some("Deployment") => pods.push(d["spec"]["template"]["spec"].clone()),
                other => panic!("{f}: {other:?}"),
            }
        }
    }
    let request =
        |t: &str| templates[t]["spec"]["spec"]["devices"]["requests"][0]["exactly"].clone();
    for t in templates.keys() {
        assert_eq!(
            request(t)["deviceClassName"].as_str(),
            Some(class_name),
            "{t}"
        );
    }
    let capacity = |t: &str, k: &str| {
        request(t)["capacity"]["requests"][k]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        (
            capacity("gpu-8gi-30pct", "memory"),
            capacity("gpu-8gi-30pct", "cores")
        ),
        ("8Gi".to_owned(), "30".to_owned())
    );
    let config = &templates["gpu-latency"]["spec"]["spec"]["devices"]["config"][0]["opaque"];
    assert_eq!(config["driver"].as_str(), Some(driver.as_str()));
    assert_eq!(config["parameters"]["kind"].as_str(), Some("VgpuConfig"));
    assert_eq!(config["parameters"]["priority"].as_u64(), Some(0));
    // Two pods of the 8 GiB template, and the service of the latency one;
    // each container asks for its pod's claim.
    let uses = |t: &str| {
        pods.iter()
            .filter(|p| p["resourceClaims"][0]["resourceClaimTemplateName"].as_str() == Some(t))
            .count()
    };
    assert_eq!((uses("gpu-8gi-30pct"), uses("gpu-latency")), (2, 1));
    for p in &pods {
        let claim = p["resourceClaims"][0]["name"].as_str().unwrap();
        for c in p["containers"].as_sequence().unwrap() {
            assert_eq!(c["resources"]["claims"][0]["name"].as_str(), Some(claim));
        }
    }
}

/// The plugin runs beside the daemon with kubelet's plugin paths, the CDI
/// directory the runtimes read, the hook directory and the host's /dev,
/// each flag pointing at its mount; only it gets a token; every flag exists;
/// every object carries the standard labels.
#[test]
fn the_dra_plugin_runs_beside_the_daemon_with_kubelets_paths() {
    let (_, docs) = dra_rendered();
    let ds: DaemonSet = serde_yaml::from_value(dra_doc(&docs, "DaemonSet").clone()).unwrap();
    let pod = ds.spec.template.spec.as_ref().unwrap();
    let plugin = container(&pod.containers, "dra-plugin");
    let daemon = container(&pod.containers, "daemon");
    let args = plugin.args.as_ref().unwrap();
    assert_eq!(args[0], "dra-plugin");
    let driver = arg_after(args, "--driver");
    for (flag, host) in [
        ("--cdi-dir", "/var/run/cdi".to_owned()),
        ("--hook-dir", paths::HOOK_DIR.to_owned()),
        ("--state-dir", "/var/lib/vgpu/dra".to_owned()),
        (
            "--registry-dir",
            "/var/lib/kubelet/plugins_registry".to_owned(),
        ),
        ("--plugin-dir", format!("/var/lib/kubelet/plugins/{driver}")),
        ("--dev-dir", "/dev".to_owned()),
    ] {
        let dir = arg_after(args, flag);
        assert_eq!(
            host_path_of(&ds, plugin, dir).as_deref(),
            Some(host.as_str()),
            "{flag} {dir}"
        );
    }
    // Where NVIDIA's CDI spec may be: the two directories the runtimes read.
    let nvidia: Vec<Option<String>> = args
        .iter()
        .enumerate()
        .filter(|(_, a)| *a == "--nvidia-cdi-dir")
        .map(|(i, _)| host_path_of(&ds, plugin, &args[i + 1]))
        .collect();
    assert_eq!(
        nvidia,
        [Some("/etc/cdi".to_owned()), Some("/var/run/cdi".to_owned())]
    );
    // The daemon reads the claims' regions under the same hook directory.
    assert_eq!(
        host_path_of(&ds, daemon, paths::HOOK_DIR).as_deref(),
        Some(paths::HOOK_DIR)
    );
    let install = container(pod.init_containers.as_ref().unwrap(), "install-hook");
    assert_eq!(
        arg_after(install.args.as_ref().unwrap(), "--host-dir"),
        paths::HOOK_DIR
    );
    // The node's name, the pool of its devices.
    let node_name = plugin
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(node_name.as_deref(), Some("spec.nodeName"));
    // Only the plugin has the service account's token; the daemon calls no
    // API.
    let token_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert_eq!(pod.automount_service_account_token, Some(false));
    let token_mount = |c: &Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == token_dir)
            .map(|m| m.name.clone())
    };
    assert!(token_mount(daemon).is_none());
    let vol = token_mount(plugin).expect("the plugin's token");
    let sources = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == vol)
        .and_then(|v| v.projected.as_ref())
        .and_then(|p| p.sources.clone())
        .unwrap_or_default();
    assert!(sources.iter().any(|s| s.service_account_token.is_some()));
    // The binding gives the ClusterRole to the pod's account.
    let binding = dra_doc(&docs, "ClusterRoleBinding");
    assert_eq!(
        binding["subjects"][0]["name"].as_str(),
        pod.service_account_name.as_deref()
    );
    assert_eq!(
        binding["roleRef"]["name"].as_str(),
        dra_doc(&docs, "ClusterRole")["metadata"]["name"].as_str()
    );
    let sc = plugin.security_context.as_ref().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_owned()])
    );
    assert!(sc
        .capabilities
        .as_ref()
        .and_then(|c| c.add.as_ref())
        .is_none());
    let default = ds.spec.template.metadata.as_ref().unwrap();
    assert_eq!(
        default
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubectl.kubernetes.io/default-container"))
            .map(String::as_str),
        Some("daemon")
    );
    // Every flag either container passes exists.
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        let args = c.args.as_ref().unwrap();
        let out = Command::new(vgpu_tests::dist::vgpu_bin())
            .arg(&args[0])
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}: {help}", args[0]);
        for flag in args.iter().filter(|a| a.starts_with("--")) {
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "dra: `vgpu {}` has no {flag}",
                args[0]
            );
        }
    }
    let tag = image_tag(DRA_OVERLAY);
    for d in &docs {
        let (kind, name) = id(d);
        for key in STANDARD_LABELS {
            let v = d["metadata"]["labels"][key].as_str();
            assert!(
                v.is_some_and(|v| !v.is_empty()),
                "dra: {kind}/{name} lacks {key}"
            );
        }
        assert_eq!(
            d["metadata"]["labels"]["app.kubernetes.io/version"].as_str(),
            Some(tag.as_str()),
            "dra: {kind}/{name}"
        );
    }
}

/// With the TLS component listed after the ServiceMonitor one (as
/// docs/kubernetes.md shows), Prometheus scrapes over HTTPS: scheme https,
/// the CA from the TLS Secret's ca.crt, the Service's DNS name checked
/// (pod IPs are in no certificate); the rest of the rendering stays
/// schema-valid. Without the TLS component the scrape stays plain HTTP.
#[test]
fn the_servicemonitor_scrapes_https_with_the_tls_component() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/kubernetes.md")).unwrap();
    let documented = doc
        .split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split_once("```").map(|(code, _)| code))
        .find(|code| code.contains("components/servicemonitor") && code.contains("components/tls"))
        .expect("docs/kubernetes.md shows servicemonitor and tls together");
    let listed: Mapping = serde_yaml::from_str(documented).unwrap();
    let names: Vec<&str> = listed["components"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str()?.strip_prefix("../../components/"))
        .collect();
    assert_eq!(names, ["servicemonitor", "tls"], "{documented}");
    for o in OVERLAYS {
        for (combo, https) in [(&names[..], true), (&["servicemonitor"][..], false)] {
            let copy = with_components(o, combo);
            let text = kubectl_kustomize(&copy.path().join("overlays").join(o));
            let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
                .map(|d| Value::deserialize(d).unwrap())
                .collect();
            let sm = docs
                .iter()
                .find(|d| d["kind"].as_str() == Some("ServiceMonitor"))
                .unwrap_or_else(|| panic!("{o} {combo:?}: no ServiceMonitor"));
            let ep = &sm["spec"]["endpoints"][0];
            if !https {
                assert!(
                    ep["scheme"].is_null() && ep["tlsConfig"].is_null(),
                    "{o}: {ep:?}"
                );
                continue;
            }
            assert_eq!(ep["scheme"].as_str(), Some("https"), "{o}: {ep:?}");
            let tls = &ep["tlsConfig"];
            assert_eq!(
                tls["ca"]["secret"]["name"].as_str(),
                Some("vgpu-metrics-tls"),
                "{o}: {tls:?}"
            );
            assert_eq!(tls["ca"]["secret"]["key"].as_str(), Some("ca.crt"), "{o}");
            // The name the certificate must carry: the headless Service's.
            let svc: Service = serde_yaml::from_value(
                docs.iter()
                    .find(|d| d["kind"].as_str() == Some("Service"))
                    .unwrap()
                    .clone(),
            )
            .unwrap();
            let meta = &svc.metadata;
            assert_eq!(
                tls["serverName"].as_str().map(str::to_owned),
                Some(format!(
                    "{}.{}.svc",
                    meta.name.as_deref().unwrap(),
                    meta.namespace.as_deref().unwrap()
                )),
                "{o}"
            );
            // The Secret is the one the daemon mounts, in the monitor's namespace.
            assert!(text.contains("secretName: vgpu-metrics-tls"), "{o}");
            assert_eq!(
                sm["metadata"]["namespace"],
                docs.iter()
                    .find(|d| d["kind"].as_str() == Some("DaemonSet"))
                    .unwrap()["metadata"]["namespace"],
                "{o}"
            );
            // The scraped port serves HTTPS: the daemon has its certificate.
            assert!(text.contains("--tls-cert=/etc/vgpu/tls/tls.crt"), "{o}");
            let core: Vec<&str> = text
                .split("\n---\n")
                .filter(|d| !d.lines().any(|l| l.trim() == "kind: ServiceMonitor"))
                .collect();
            let file = copy.path().join("rendered.yaml");
            std::fs::write(&file, core.join("\n---\n")).unwrap();
            assert_schema_valid(&file, &format!("{o} with servicemonitor and tls"));
        }
    }
}
