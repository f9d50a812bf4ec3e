//! Issue #38, `vgpu dra-plugin` end to end: a **stand-in for kubelet**
//! (`vgpu_tests::kubelet`, a gRPC client of the plugin's Unix sockets) and
//! a **stand-in for the API server** (`vgpu_tests::apiserver`, serving one
//! ResourceClaim fixture per case from `tests/fixtures/dra/`, shaped as the
//! scheduler leaves a claim and validated against Kubernetes' schemas
//! here), with the plugin on a simulated node of two 8 GiB GPUs.
//!
//! The API server is reached over plain HTTP, and once over HTTPS through a
//! TLS front (trusting only the CA given, sending the token).
//!
//! Checked: registration (`GetInfo`, `NotifyRegistrationStatus`), prepare
//! and the CDI spec it writes (validated against the CDI project's JSON
//! schema and the spec's types, and checked line by line), a repeated
//! prepare, a plugin restart between prepare and unprepare, unprepare; the
//! cleaning at start; bad input getting its error and changing nothing
//! (another driver's claim, an unknown config field, more memory than the
//! GPU has, a GPU the node lacks, a read-only CDI directory, the hook not
//! installed); the ResourceSlice following the GPUs NVML reports; and the
//! dra overlay's RBAC granting exactly the requests the plugin makes.

use std::ffi::OsStr;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use vgpu_tests::apiserver::{claim_path, StandInApiServer};
use vgpu_tests::dist;
use vgpu_tests::kubelet::StandInKubelet;
use vgpu_tests::sim::SimGpu;

const DRIVER: &str = "vgpu.dev";
const NODE: &str = "node-a";
const NS: &str = "team-a";

/// A fixture: the claim's (name, UID) and its JSON.
fn fixture(name: &str) -> (String, String, String) {
    let path = dist::workspace_root()
        .join("tests/fixtures/dra")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let meta = &v["metadata"];
    (
        meta["name"].as_str().unwrap().to_owned(),
        meta["uid"].as_str().unwrap().to_owned(),
        text,
    )
}

/// One plugin's node: directories, the stand-in API server, the simulated
/// GPUs.
struct Node {
    dir: tempfile::TempDir,
    gpu: SimGpu,
    api: StandInApiServer,
    /// The plugin's `--driver`.
    driver: String,
    /// Its `--cdi-dir`.
    cdi_dir: PathBuf,
}

impl Node {
    fn new() -> Self {
        let mut node = Node::bare();
        node.cdi_dir = node.path("cdi");
        node
    }

    /// A node whose plugin is `driver` and writes its specs into `cdi_dir`,
    /// with no device nodes (a runtime applying the spec looks for them on
    /// the host, and the simulated GPUs have none).
    fn with(driver: &str, cdi_dir: &Path) -> Self {
        let mut node = Node::bare();
        for n in ["dev/nvidia1", "dev/nvidiactl"] {
            std::fs::remove_file(node.path(n)).unwrap();
        }
        node.driver = driver.to_owned();
        node.cdi_dir = cdi_dir.to_owned();
        node
    }

    fn bare() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("vgpu-dra-plugin-")
            .tempdir()
            .unwrap();
        for d in [
            "cdi",
            "state",
            "hook",
            "registry",
            "plugin",
            "dev",
            "nvidia-cdi",
        ] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        // As `vgpu install-hook` leaves the hook directory.
        std::fs::copy(dist::hook_lib(), dir.path().join("hook/libvgpu.so")).unwrap();
        std::fs::write(
            dir.path().join("hook/ld.so.preload"),
            "/usr/local/vgpu/libvgpu.so\n",
        )
        .unwrap();
        // A device node of GPU 1 only: the spec must list what exists.
        std::fs::write(dir.path().join("dev/nvidia1"), "").unwrap();
        std::fs::write(dir.path().join("dev/nvidiactl"), "").unwrap();
        Node {
            dir,
            gpu: SimGpu::builder().devices(2).memory("8g").build(),
            api: StandInApiServer::start(),
            driver: DRIVER.to_owned(),
            cdi_dir: PathBuf::new(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn registration_socket(&self) -> PathBuf {
        self.path(&format!("registry/{}-reg.sock", self.driver))
    }

    fn dra_socket(&self) -> PathBuf {
        self.path("plugin/dra.sock")
    }

    fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_dir
            .join(format!("{}-claim-{uid}.json", self.driver))
    }

    fn claim_dir(&self, uid: &str) -> PathBuf {
        self.path(&format!("hook/claims/{uid}"))
    }

    /// Serves fixture `name` as the API server would, for this node's
    /// driver; (name, UID).
    fn serve(&self, name: &str) -> (String, String) {
        let (claim, uid, text) = fixture(name);
        let text = text.replace("\"vgpu.dev\"", &format!("\"{}\"", self.driver));
        self.api.put(&claim_path(NS, &claim), &text);
        (claim, uid)
    }

    /// Starts the plugin on the stand-in API server's plain HTTP and waits
    /// for its registration socket.
    fn start(&self, log: &str) -> Plugin {
        self.start_with(log, &["--api-server".into(), self.api.url().into()])
    }

    /// The same with `api_args` to reach the API server.
    fn start_with(&self, log: &str, api_args: &[std::ffi::OsString]) -> Plugin {
        let mut cmd = Command::new(dist::vgpu_bin());
        cmd.arg("dra-plugin")
            .arg("--driver")
            .arg(&self.driver)
            .args(["--node-name", NODE])
            .args(api_args)
            .arg("--cdi-dir")
            .arg(&self.cdi_dir)
            .arg("--hook-dir")
            .arg(self.path("hook"))
            .arg("--state-dir")
            .arg(self.path("state"))
            .arg("--registry-dir")
            .arg(self.path("registry"))
            .arg("--plugin-dir")
            .arg(self.path("plugin"))
            .arg("--dev-dir")
            .arg(self.path("dev"))
            // Not the host's /etc/cdi and /var/run/cdi: NVIDIA's spec is
            // whatever a test puts here.
            .arg("--nvidia-cdi-dir")
            .arg(self.path("nvidia-cdi"))
            .envs(self.gpu.envs())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.path(log)).unwrap());
        let child = cmd.spawn().unwrap();
        let mut p = Plugin {
            child,
            log: self.path(log),
        };
        let t = Instant::now();
        while !self.registration_socket().exists() {
            if let Ok(Some(st)) = p.child.try_wait() {
                panic!("dra-plugin exited {st}: {}", p.log_text());
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "no registration socket: {}",
                p.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    /// The checkpoint's claims (none without a checkpoint).
    fn checkpointed(&self) -> Vec<String> {
        std::fs::read(self.path("state/dra-checkpoint.json"))
            .map(|b| {
                let v: Value = serde_json::from_slice(&b).unwrap();
                v["claims"].as_object().unwrap().keys().cloned().collect()
            })
            .unwrap_or_default()
    }

    /// Every file and directory under the node's CDI and hook directories
    /// and the checkpoint's claims: what bad input must leave as it was.
    fn snapshot(&self) -> (Vec<String>, Vec<String>) {
        let mut files = Vec::new();
        for d in ["cdi", "hook"] {
            walk(&self.path(d), &mut files);
        }
        files.sort();
        (files, self.checkpointed())
    }
}

fn walk(dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        out.push(e.path().display().to_string());
        if e.path().is_dir() {
            walk(&e.path(), out);
        }
    }
}

struct Plugin {
    child: Child,
    log: PathBuf,
}

impl Plugin {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to 20 s for `text` in the log.
    fn wait_log(&self, text: &str) {
        let t = Instant::now();
        while !self.log_text().contains(text) {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "no {text:?} in the log: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, as kubelet's pod deletion sends it; waits for the exit.
    fn stop(mut self) -> String {
        // SAFETY: kill(2) on the child's PID, which has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let st = self.child.wait().unwrap();
        assert!(st.success(), "dra-plugin exited {st}: {}", self.log_text());
        self.log_text()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Checks a CDI spec against the CDI spec's types (the Go `specs` package:
/// required fields, no field it does not have, versions): panics with
/// what is wrong.
fn validate_cdi(spec: &Value) {
    fn keys(v: &Value, allowed: &[&str], required: &[&str], what: &str) {
        let o = v
            .as_object()
            .unwrap_or_else(|| panic!("{what} is not an object"));
        for k in o.keys() {
            assert!(
                allowed.contains(&k.as_str()),
                "{what} has unknown field {k}"
            );
        }
        for r in required {
            assert!(o.contains_key(*r), "{what} lacks required field {r}");
        }
    }
    let name_ok = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c))
    };
    keys(
        spec,
        &[
            "cdiVersion",
            "kind",
            "annotations",
            "devices",
            "containerEdits",
        ],
        &["cdiVersion", "kind", "devices"],
        "spec",
    );
    let version = spec["cdiVersion"].as_str().unwrap();
    let known = [
        "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
    ];
    assert!(known.contains(&version), "cdiVersion {version}");
    // A field needs the version that brought it: the CDI library refuses a
    // spec that uses a field newer than its cdiVersion.
    let at_least = |since: &str, what: &str| {
        let rank = |v: &str| known.iter().position(|k| *k == v).unwrap();
        assert!(
            rank(version) >= rank(since),
            "{what} needs cdiVersion {since}, the spec says {version}"
        );
    };
    if spec.get("annotations").is_some() {
        at_least("0.6.0", "annotations");
    }
    let (vendor, class) = spec["kind"].as_str().unwrap().split_once('/').unwrap();
    assert!(
        vendor.contains('.') && name_ok(vendor) && name_ok(class),
        "kind"
    );
    let edits = |e: &Value, what: &str| {
        for (field, since) in [
            ("intelRdt", "0.7.0"),
            ("additionalGids", "0.7.0"),
            ("netDevices", "1.1.0"),
        ] {
            if e.get(field).is_some() {
                at_least(since, field);
            }
        }
        keys(
            e,
            &[
                "env",
                "deviceNodes",
                "netDevices",
                "hooks",
                "mounts",
                "intelRdt",
                "additionalGids",
            ],
            &[],
            what,
        );
        for env in e["env"].as_array().into_iter().flatten() {
            let env = env.as_str().unwrap();
            assert!(
                env.split_once('=').is_some_and(|(k, _)| !k.is_empty()),
                "env {env}"
            );
        }
        for m in e["mounts"].as_array().into_iter().flatten() {
            keys(
                m,
                &["hostPath", "containerPath", "options", "type"],
                &["hostPath", "containerPath"],
                "mount",
            );
            assert!(m["hostPath"].as_str().unwrap().starts_with('/'));
            assert!(m["containerPath"].as_str().unwrap().starts_with('/'));
            if m.get("type").is_some() {
                at_least("0.4.0", "a mount's type");
            }
        }
        for d in e["deviceNodes"].as_array().into_iter().flatten() {
            keys(
                d,
                &[
                    "path",
                    "hostPath",
                    "type",
                    "major",
                    "minor",
                    "fileMode",
                    "permissions",
                    "uid",
                    "gid",
                ],
                &["path"],
                "deviceNode",
            );
            if d.get("hostPath").is_some() {
                at_least("0.5.0", "a device node's hostPath");
            }
        }
    };
    let devices = spec["devices"].as_array().unwrap();
    assert!(!devices.is_empty(), "a spec needs a device");
    for d in devices {
        keys(
            d,
            &["name", "annotations", "containerEdits"],
            &["name", "containerEdits"],
            "device",
        );
        if d.get("annotations").is_some() {
            at_least("0.6.0", "annotations");
        }
        assert!(name_ok(d["name"].as_str().unwrap()), "device name");
        edits(&d["containerEdits"], "device containerEdits");
    }
    if spec.get("containerEdits").is_some() {
        edits(&spec["containerEdits"], "spec containerEdits");
    }
}

/// Validates a CDI spec against the CDI project's JSON schema
/// (`tests/fixtures/cdi-schema/`, vendored from
/// cncf-tags/container-device-interface) with python's `jsonschema`, which
/// kubernetes-validate brings (`cargo xtask setup`): the errors, none when
/// it is valid.
fn cdi_schema_errors(spec: &Value) -> String {
    const VALIDATE: &str = r#"
import json, pathlib, sys
import jsonschema, referencing, referencing.jsonschema
d = pathlib.Path(sys.argv[1])
defs = referencing.Resource.from_contents(
    json.loads((d / "defs.json").read_text()),
    default_specification=referencing.jsonschema.DRAFT7)
v = jsonschema.Draft7Validator(
    json.loads((d / "schema.json").read_text()),
    registry=referencing.Registry().with_resource("defs.json", defs))
for e in sorted(v.iter_errors(json.load(sys.stdin)), key=str):
    print("/".join(map(str, e.absolute_path)) or "(root)", ":", e.message)
"#;
    let mut child = Command::new("python3")
        .args(["-c", VALIDATE])
        .arg(dist::workspace_root().join("tests/fixtures/cdi-schema"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 with jsonschema (cargo xtask setup installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(spec.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the schema check did not run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A CDI spec passes both checks: the spec's types and the CDI schema.
fn assert_valid_cdi(spec: &Value) {
    validate_cdi(spec);
    let errors = cdi_schema_errors(spec);
    assert!(errors.is_empty(), "not valid by the CDI schema:\n{errors}");
}

#[test]
fn the_cdi_schema_check_refuses_what_the_schema_refuses() {
    // The check itself can fail: a mount without its container path and a
    // device without edits are refused, each by name.
    let bad = serde_json::json!({
        "cdiVersion": "0.5.0",
        "kind": "vgpu.dev/claim",
        "devices": [
            {"name": "a", "containerEdits": {"mounts": [{"hostPath": "/x"}]}},
            {"name": "b"},
        ],
    });
    let errors = cdi_schema_errors(&bad);
    assert!(
        errors
            .contains("devices/0/containerEdits/mounts/0 : 'containerPath' is a required property"),
        "{errors}"
    );
    assert!(
        errors.contains("devices/1 : 'containerEdits' is a required property"),
        "{errors}"
    );
}

#[test]
fn fixtures_are_resource_claims_as_the_api_server_serves_them() {
    let dir = dist::workspace_root().join("tests/fixtures/dra");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 6, "{files:?}");
    for v in ["1.34.0", "1.37.0"] {
        let out = Command::new("kubernetes-validate")
            .args(["--strict", "-k", v])
            .args(&files)
            .output()
            .expect("kubernetes-validate (cargo xtask setup installs it)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{v}: {text}");
        assert_eq!(text.matches(" passed ").count(), files.len(), "{v}: {text}");
    }
    for f in &files {
        // And the typed API of k8s-openapi reads each.
        let c: k8s_openapi::api::resource::v1::ResourceClaim =
            serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
        let results = c
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap_or_default();
        assert!(!results.is_empty(), "{} is allocated", f.display());
        assert!(results.iter().all(|r| r.pool == NODE));
    }
}

#[test]
fn a_stand_in_kubelet_registers_prepares_across_a_restart_and_unprepares() {
    let node = Node::new();
    let (claim, uid) = node.serve("shared");
    let kubelet = StandInKubelet::new();
    let plugin = node.start("plugin-1.log");

    let info = kubelet.register(&node.registration_socket(), true, "");
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(Path::new(&info.endpoint), node.dra_socket());
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);

    let first = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    let answer = &first[&uid];
    assert_eq!(answer.error, "");
    let cdi_id = format!("{DRIVER}/claim={uid}");
    // In the host's device order, each with the request it serves.
    let devices: Vec<(Vec<String>, &str, &str, Vec<String>)> = answer
        .devices
        .iter()
        .map(|d| {
            (
                d.request_names.clone(),
                d.pool_name.as_str(),
                d.device_name.as_str(),
                d.cdi_device_ids.clone(),
            )
        })
        .collect();
    assert_eq!(
        devices,
        [
            (
                vec!["small".to_owned()],
                NODE,
                "gpu-0",
                vec![cdi_id.clone()]
            ),
            (vec!["big".to_owned()], NODE, "gpu-1", vec![cdi_id.clone()]),
        ]
    );

    let spec_text = std::fs::read_to_string(node.spec_path(&uid)).unwrap();
    let spec: Value = serde_json::from_str(&spec_text).unwrap();
    assert_valid_cdi(&spec);
    // The oldest version with every field used (Debian 12's podman takes
    // up to 0.5.0).
    assert_eq!(spec["cdiVersion"], "0.5.0");
    assert_eq!(spec["kind"], "vgpu.dev/claim");
    let dev = &spec["devices"][0];
    assert_eq!(dev["name"], uid.as_str());
    let env: Vec<&str> = dev["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    let uuids = format!(
        "{},{}",
        simgpu::model::device_uuid_string(0),
        simgpu::model::device_uuid_string(1)
    );
    // _0 is gpu-0 (the "small" request: 1 GiB, 30 %), _1 is gpu-1 (3 GiB,
    // 50 %), though the allocation lists gpu-1 first; priority 0 from the
    // claim's config overrides the class's 1; oversubscription off from
    // the class; NVIDIA's config ignored.
    assert_eq!(
        env,
        [
            format!("NVIDIA_VISIBLE_DEVICES={uuids}").as_str(),
            "CUDA_DEVICE_MEMORY_LIMIT_0=1073741824",
            "CUDA_DEVICE_SM_LIMIT_0=30",
            "CUDA_DEVICE_MEMORY_LIMIT_1=3221225472",
            "CUDA_DEVICE_SM_LIMIT_1=50",
            format!("CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/claims/{uid}/vgpu.cache")
                .as_str(),
            "CUDA_TASK_PRIORITY=0",
            "CUDA_OVERSUBSCRIBE=false",
        ]
    );
    let mounts: Vec<(String, String, String)> = dev["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["hostPath"].as_str().unwrap().to_owned(),
                m["containerPath"].as_str().unwrap().to_owned(),
                m["options"][0].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        [
            (
                node.claim_dir(&uid).display().to_string(),
                format!("/usr/local/vgpu/claims/{uid}"),
                "rw".to_owned()
            ),
            (
                node.path("hook/libvgpu.so").display().to_string(),
                "/usr/local/vgpu/libvgpu.so".to_owned(),
                "ro".to_owned()
            ),
            (
                node.path("hook/ld.so.preload").display().to_string(),
                "/etc/ld.so.preload".to_owned(),
                "ro".to_owned()
            ),
        ]
    );
    // Only the device nodes the host has (here: gpu-1's and nvidiactl).
    let nodes: Vec<&str> = dev["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["/dev/nvidia1", "/dev/nvidiactl"]);
    assert!(node.claim_dir(&uid).is_dir());
    // Whatever user the claim's containers run as, their hook creates its
    // region there.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(node.claim_dir(&uid))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o7777, 0o777, "{mode:o}");
    assert_eq!(node.checkpointed(), std::slice::from_ref(&uid));

    // kubelet retries: the same answer, the spec untouched, no API read.
    let claim_reads = || node.api.requests_to("GET", &claim_path(NS, &claim));
    let reads = claim_reads();
    let mtime = std::fs::metadata(node.spec_path(&uid))
        .unwrap()
        .modified()
        .unwrap();
    let again = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(again, first);
    assert_eq!(claim_reads(), reads);
    assert_eq!(
        std::fs::metadata(node.spec_path(&uid))
            .unwrap()
            .modified()
            .unwrap(),
        mtime
    );

    // The plugin restarts (a rollout) between prepare and unprepare.
    let log = plugin.stop();
    assert!(
        log.contains("kubelet registered the plugin vgpu.dev"),
        "{log}"
    );
    assert!(!node.registration_socket().exists() && !node.dra_socket().exists());
    let plugin = node.start("plugin-2.log");
    assert_eq!(
        kubelet.register(&node.registration_socket(), true, "").name,
        DRIVER
    );
    let after_restart = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(after_restart, first);
    assert_eq!(
        std::fs::read_to_string(node.spec_path(&uid)).unwrap(),
        spec_text
    );

    let un = kubelet.unprepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(un[&uid].error, "");
    assert!(!node.spec_path(&uid).exists());
    assert!(!node.claim_dir(&uid).exists());
    assert!(node.checkpointed().is_empty());
    // Unprepare again (kubelet retries that too): nothing to do, no error.
    let un = kubelet.unprepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(un[&uid].error, "");
    let log = plugin.stop();
    assert!(
        log.contains(&format!("unprepared claim {NS}/{claim} ({uid})")),
        "{log}"
    );
}

#[test]
fn bad_input_gets_its_error_and_changes_nothing() {
    let node = Node::new();
    let kubelet = StandInKubelet::new();
    let plugin = node.start("plugin.log");
    let cases = [
        (
            "other-driver",
            "has no device of driver vgpu.dev (its devices are of gpu.nvidia.com)",
        ),
        ("malformed-config", "unknown field `priorityClass`"),
        (
            "too-much-memory",
            "is given 9663676416 bytes of memory, more than its 8589934592 bytes",
        ),
        // The allocation names a GPU this node does not have (lost since
        // the scheduler saw it, or never there).
        (
            "missing-gpu",
            "device gpu-2 of pool node-a is not a GPU of this node \
             (pool node-a, devices gpu-0, gpu-1)",
        ),
    ];
    let before = node.snapshot();
    for (fixture, expected) in cases {
        let (claim, uid) = node.serve(fixture);
        let answer = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
        let a = &answer[&uid];
        assert!(a.error.contains(expected), "{fixture}: {:?}", a.error);
        assert!(a.devices.is_empty(), "{fixture}");
        assert_eq!(node.snapshot(), before, "{fixture} changed the node");
    }

    // A claim the API server does not have.
    let answer = kubelet.prepare(&node.dra_socket(), &[(NS, "gone", "0000-gone")]);
    assert!(
        answer["0000-gone"].error.contains("does not exist"),
        "{answer:?}"
    );
    assert_eq!(node.snapshot(), before);

    // A CDI directory that cannot be written, root or not: mounted
    // read-only (a bind mount of itself, undone when the guard drops).
    let (claim, uid) = node.serve("whole-gpu");
    {
        let _ro = ReadOnlyMount::new(&node.path("cdi"));
        let before_ro = node.snapshot();
        let answer = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
        let a = &answer[&uid];
        assert!(
            a.error
                .contains(&format!("writing {}", node.spec_path(&uid).display()))
                && a.error.contains("Read-only file system"),
            "{:?}",
            a.error
        );
        assert!(a.devices.is_empty());
        assert_eq!(node.snapshot(), before_ro, "a failed write left something");
        assert!(!node.claim_dir(&uid).exists());
    }

    // The hook not installed (yet): a spec would name files the host
    // lacks, and the container would fail at start; the claim is refused.
    std::fs::rename(node.path("hook/libvgpu.so"), node.path("libvgpu.so")).unwrap();
    let before_hook = node.snapshot();
    let answer = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert!(
        answer[&uid].error.contains(&format!(
            "the hook is not installed: no {}",
            node.path("hook/libvgpu.so").display()
        )),
        "{:?}",
        answer[&uid].error
    );
    assert_eq!(node.snapshot(), before_hook);
    std::fs::rename(node.path("libvgpu.so"), node.path("hook/libvgpu.so")).unwrap();

    // A CDI directory that cannot be written: here, a file in its place.
    std::fs::remove_dir(node.path("cdi")).unwrap();
    std::fs::write(node.path("cdi"), "not a directory").unwrap();
    let before_cdi = node.snapshot();
    let answer = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    let a = &answer[&uid];
    assert!(
        a.error.contains("writing") && a.error.contains(&format!("{DRIVER}-claim-{uid}.json")),
        "{:?}",
        a.error
    );
    assert_eq!(node.snapshot(), before_cdi, "a failed write left something");
    assert!(!node.claim_dir(&uid).exists());

    // The directory back: the same claim prepares, the whole GPU.
    std::fs::remove_file(node.path("cdi")).unwrap();
    std::fs::create_dir(node.path("cdi")).unwrap();
    let answer = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(answer[&uid].error, "");
    let spec: Value =
        serde_json::from_slice(&std::fs::read(node.spec_path(&uid)).unwrap()).unwrap();
    assert_valid_cdi(&spec);
    let env = spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap();
    assert!(
        env.contains(&Value::from("CUDA_DEVICE_MEMORY_LIMIT_0=8589934592")),
        "{env:?}"
    );
    assert!(
        env.contains(&Value::from("CUDA_DEVICE_SM_LIMIT_0=100")),
        "{env:?}"
    );
    assert!(
        env.contains(&Value::from("CUDA_TASK_PRIORITY=1")),
        "{env:?}"
    );
    drop(plugin);
}

/// `dir` bind-mounted read-only over itself until dropped.
struct ReadOnlyMount(PathBuf);

impl ReadOnlyMount {
    fn new(dir: &Path) -> Self {
        let run = |args: &[&OsStr]| {
            let st = Command::new("mount").args(args).status().expect("mount(8)");
            assert!(st.success(), "mount {args:?}");
        };
        run(&[OsStr::new("--bind"), dir.as_os_str(), dir.as_os_str()]);
        let guard = ReadOnlyMount(dir.to_owned());
        run(&[
            OsStr::new("-o"),
            OsStr::new("remount,bind,ro"),
            dir.as_os_str(),
        ]);
        assert!(
            std::fs::write(dir.join("probe"), "").is_err(),
            "{} is still writable",
            dir.display()
        );
        guard
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn leftovers_and_claims_deleted_while_the_plugin_was_down_are_cleaned_at_start() {
    let node = Node::new();
    let kubelet = StandInKubelet::new();
    let (claim, uid) = node.serve("shared");
    let plugin = node.start("plugin-1.log");
    assert_eq!(
        kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)])[&uid].error,
        ""
    );
    plugin.stop();

    // While it is down: the claim is deleted; a spec of this plugin's kind
    // that no checkpoint names appears (a crash between writing the spec
    // and the checkpoint), with its claim directory; and another vendor's
    // spec, which must stay.
    node.api.remove(&claim_path(NS, &claim));
    let orphan = "4e5f6071-8293-4a4b-9cde-3f4a5b6c7d8e";
    std::fs::write(node.spec_path(orphan), "{}").unwrap();
    std::fs::create_dir_all(node.claim_dir(orphan)).unwrap();
    std::fs::write(node.path("cdi/nvidia.com-gpu.json"), "{}").unwrap();

    let plugin = node.start("plugin-2.log");
    // The deletion is found once the plugin serves (it asks the API server
    // before it binds the sockets).
    assert!(!node.spec_path(orphan).exists());
    assert!(!node.claim_dir(orphan).exists());
    assert!(!node.spec_path(&uid).exists());
    assert!(!node.claim_dir(&uid).exists());
    assert!(node.checkpointed().is_empty());
    assert!(node.path("cdi/nvidia.com-gpu.json").exists());
    let log = plugin.stop();
    assert!(
        log.contains(&format!("removed the CDI spec of claim {orphan}")),
        "{log}"
    );
    assert!(
        log.contains(&format!("claim {NS}/{claim} ({uid}) is gone: unprepared")),
        "{log}"
    );
}

/// A TLS front for the stand-in API server (the API server speaks only
/// HTTPS): it terminates TLS with `cert`, keeps each request's head, and
/// forwards the request to the stand-in's plain port.
struct TlsFront {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsFront {
    fn start(backend: u16, cert: &rcgen::CertifiedKey) -> Self {
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
            rustls::pki_types::PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()),
        );
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (heads, stop) = (heads.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((sock, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    let _ = sock.set_nonblocking(false);
                    let _ = sock.set_read_timeout(Some(Duration::from_secs(5)));
                    let conn = rustls::ServerConnection::new(config.clone()).unwrap();
                    let mut tls = rustls::StreamOwned::new(conn, sock);
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    // A client that does not trust the certificate fails
                    // the handshake here: nothing is forwarded.
                    while !head.ends_with(b"\r\n\r\n") {
                        match tls.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => break,
                        }
                    }
                    if !head.ends_with(b"\r\n\r\n") {
                        continue;
                    }
                    heads
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).into_owned());
                    let head_text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                    let length: usize = head_text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    let mut body = vec![0u8; length];
                    if tls.read_exact(&mut body).is_err() {
                        continue;
                    }
                    let mut back = TcpStream::connect(("127.0.0.1", backend)).unwrap();
                    back.write_all(&head).unwrap();
                    back.write_all(&body).unwrap();
                    let mut answer = Vec::new();
                    back.read_to_end(&mut answer).unwrap();
                    let _ = tls.write_all(&answer);
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                }
            })
        };
        Self {
            port,
            heads,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn the_api_server_is_read_over_https_trusting_only_its_ca_with_the_token() {
    let node = Node::new();
    let kubelet = StandInKubelet::new();
    let (claim, uid) = node.serve("shared");
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let front = TlsFront::start(node.api.port, &made);
    std::fs::write(node.path("ca.crt"), made.cert.pem()).unwrap();
    std::fs::write(node.path("token"), "s3cret-token\n").unwrap();
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    std::fs::write(node.path("other-ca.crt"), other.cert.pem()).unwrap();
    let url = format!("https://127.0.0.1:{}", front.port);
    let args = |ca: &str| -> Vec<std::ffi::OsString> {
        vec![
            "--api-server".into(),
            url.clone().into(),
            "--ca-file".into(),
            node.path(ca).into(),
            "--token-file".into(),
            node.path("token").into(),
        ]
    };

    // A CA that did not sign the server's certificate: refused, nothing
    // written, nothing sent.
    let plugin = node.start_with("plugin-1.log", &args("other-ca.crt"));
    let before = node.snapshot();
    let a = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert!(
        a[&uid].error.contains("TLS with the API server"),
        "{:?}",
        a[&uid].error
    );
    assert_eq!(node.snapshot(), before);
    assert!(front.heads.lock().unwrap().is_empty());
    plugin.stop();

    let plugin = node.start_with("plugin-2.log", &args("ca.crt"));
    let a = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(a[&uid].error, "");
    assert!(node.spec_path(&uid).exists());
    // The claim was read through the front (besides the ResourceSlice's
    // requests), every request with the token.
    let heads = front.heads.lock().unwrap().clone();
    let claim_get = format!("GET {} HTTP/1.1\r\n", claim_path(NS, &claim));
    assert_eq!(
        heads.iter().filter(|h| h.starts_with(&claim_get)).count(),
        1,
        "{heads:?}"
    );
    for h in &heads {
        assert!(
            h.to_ascii_lowercase()
                .contains("authorization: bearer s3cret-token\r\n"),
            "{h:?}"
        );
    }
    plugin.stop();
}

/// Removes a file when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `podman run` of `cmd` (as runc runs it, in a throw-away overlay of the
/// host's root, so the test programs and their C library are there) with
/// the simulated GPU's directory, libraries and environment, `binds` bound
/// at their own paths, and the CDI `devices` in order: its stdout.
fn podman_run(node: &Node, devices: &[String], binds: &[&Path], cmd: &[&OsStr]) -> String {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc", "run", "--rm", "--network", "none"])
        .args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ])
        .args(["--pid", "host"]);
    for d in devices {
        c.arg("--device").arg(d);
    }
    for d in [node.gpu.dir(), node.gpu.lib_dir()]
        .into_iter()
        .chain(binds.iter().copied())
    {
        c.arg("-v").arg(format!("{0}:{0}", d.display()));
    }
    for (k, v) in node.gpu.envs() {
        c.arg("-e").arg(format!("{k}={v}"));
    }
    let out = c
        .args(["--rootfs", "/:O"])
        .args(cmd)
        .output()
        .expect("podman (cargo xtask setup installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "podman run {cmd:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn podman_applies_a_prepared_claim_and_the_hook_enforces_its_limits() {
    // podman 4.3 (Debian 12's) reads CDI specs only from /etc/cdi and
    // /var/run/cdi: the plugin writes there, under a driver name of this
    // test's own, so its specs and its cleaning at start touch no one
    // else's.
    let driver = format!("vgpu-e2e-{}.dev", std::process::id());
    let cdi_dir = PathBuf::from("/var/run/cdi");
    std::fs::create_dir_all(&cdi_dir).unwrap();
    let node = Node::with(&driver, &cdi_dir);
    let kubelet = StandInKubelet::new();
    let (claim, uid) = node.serve("shared");
    let _spec = RemoveOnDrop(node.spec_path(&uid));
    let plugin = node.start("plugin.log");
    let a = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(a[&uid].error, "");
    let device = &a[&uid].devices[0].cdi_device_ids[0];
    assert_eq!(device, &format!("{driver}/claim={uid}"));

    // The container: the host's root as a throw-away overlay (so the test
    // program and its C library are there), the simulated GPU's directory
    // and libraries bound in, and the claim's device: everything of vgpu
    // in it (the hook, /etc/ld.so.preload, the limits, the region
    // directory) comes from the CDI spec. No LD_PRELOAD is set.
    let prog_dir = tempfile::Builder::new()
        .prefix("vgpu-dra-prog-")
        .tempdir()
        .unwrap();
    let prog = dist::compile_c("hook_mem", prog_dir.path(), false);
    let run = |args: &[&str]| -> String {
        let mut cmd = vec![prog.as_os_str()];
        cmd.extend(args.iter().map(OsStr::new));
        podman_run(
            &node,
            std::slice::from_ref(device),
            &[prog_dir.path()],
            &cmd,
        )
    };
    const G: u64 = 1 << 30;
    let total = |text: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix("devtotal "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no devtotal in {text:?}"))
    };
    // CUDA's device 0 is gpu-0 (the claim's 1 GiB), device 1 is gpu-1
    // (3 GiB), not the simulated GPUs' 8 GiB.
    assert_eq!(total(&run(&["-d", "0", "info"])), G);
    assert_eq!(total(&run(&["-d", "1", "info"])), 3 * G);
    // And allocations stop at the limit: 2 GiB is refused on device 0
    // (CUDA_ERROR_OUT_OF_MEMORY, 2) and granted on device 1.
    let two_g = (2 * G).to_string();
    let d0 = run(&["-d", "0", "module", &two_g]);
    assert!(d0.contains("\nalloc rc 2\n"), "{d0}");
    let d1 = run(&["-d", "1", "module", &two_g]);
    assert!(d1.contains("\nalloc rc 0\n"), "{d1}");

    // The hook's region is in the claim's directory on the host, with the
    // claim's limits, SM shares included.
    let region = node.claim_dir(&uid).join("vgpu.cache");
    assert!(region.exists(), "no region at {}", region.display());
    let out = Command::new(dist::vgpu_bin())
        .arg("inspect")
        .arg(&region)
        .arg("--json")
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices = &doc["regions"][0]["devices"];
    assert_eq!(devices[0]["limit_bytes"], G, "{doc:#}");
    assert_eq!(devices[0]["sm_limit_percent"], 30, "{doc:#}");
    assert_eq!(devices[1]["limit_bytes"], 3 * G, "{doc:#}");
    assert_eq!(devices[1]["sm_limit_percent"], 50, "{doc:#}");
    assert_eq!(doc["regions"][0]["priority"], 0, "{doc:#}");

    let un = kubelet.unprepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(un[&uid].error, "");
    assert!(!node.spec_path(&uid).exists());
    plugin.stop();
}

/// Validates `object` with kubernetes-validate in strict mode (unknown
/// fields refused) at Kubernetes 1.34, where `resource.k8s.io/v1` came,
/// and 1.37, the newest it knows.
fn kubernetes_validate(object: &Value, dir: &Path) {
    let file = dir.join("object.json");
    std::fs::write(&file, object.to_string()).unwrap();
    for v in ["1.34.0", "1.37.0"] {
        let out = Command::new("kubernetes-validate")
            .args(["--strict", "-k", v])
            .arg(&file)
            .output()
            .expect("kubernetes-validate (cargo xtask setup installs it)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains(" passed "),
            "{v}: {text}"
        );
    }
}

#[test]
fn the_plugin_publishes_the_nodes_resource_slice_and_replaces_it_only_when_it_differs() {
    let node = Node::new();
    let node_uid = "6b1d2c3e-4f50-4617-8829-3a4b5c6d7e8f";
    node.api.put(
        &format!("/api/v1/nodes/{NODE}"),
        &serde_json::json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "uid": node_uid, "resourceVersion": "7"}})
        .to_string(),
    );
    let slices = "/apis/resource.k8s.io/v1/resourceslices";
    let path = format!("{slices}/{NODE}-vgpu-dev");
    let plugin = node.start("plugin-1.log");
    plugin.wait_log("ResourceSlice node-a-vgpu-dev: Created");
    let slice = node.api.object(&path).expect("the slice");
    kubernetes_validate(&slice, node.dir.path());
    let owner = &slice["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["uid"].as_str()),
        (Some("Node"), Some(node_uid))
    );
    let spec = &slice["spec"];
    assert_eq!(spec["driver"], DRIVER);
    assert_eq!(spec["nodeName"], NODE);
    assert_eq!(
        spec["pool"],
        serde_json::json!({"name": NODE, "generation": 1, "resourceSliceCount": 1})
    );
    let devices = spec["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d["name"], format!("gpu-{i}"));
        assert_eq!(d["allowMultipleAllocations"], true);
        assert_eq!(
            d["attributes"]["uuid"]["string"],
            simgpu::model::device_uuid_string(i as u32)
        );
        assert_eq!(d["attributes"]["index"]["int"], i);
        // The whole GPU by default; shares of 256 MiB and of 1 %.
        assert_eq!(
            d["capacity"]["memory"],
            serde_json::json!({"value": "8Gi", "requestPolicy": {"default": "8Gi",
                "validRange": {"min": "256Mi", "max": "8Gi", "step": "256Mi"}}})
        );
        assert_eq!(
            d["capacity"]["cores"],
            serde_json::json!({"value": "100", "requestPolicy": {"default": "100",
                "validRange": {"min": "1", "max": "100", "step": "1"}}})
        );
    }
    plugin.stop();

    // A restart on the same GPUs changes nothing.
    let plugin = node.start("plugin-2.log");
    plugin.wait_log("ResourceSlice node-a-vgpu-dev: Unchanged");
    assert_eq!(node.api.requests_to("POST", slices), 1);
    assert_eq!(node.api.requests_to("PUT", &path), 0);
    plugin.stop();

    // A slice that no longer says what the node has (here: one GPU lost
    // from it) is replaced, the pool's generation one up.
    let mut stale = node.api.object(&path).unwrap();
    stale["spec"]["devices"].as_array_mut().unwrap().pop();
    node.api.put(&path, &stale.to_string());
    let plugin = node.start("plugin-3.log");
    plugin.wait_log("ResourceSlice node-a-vgpu-dev: Replaced { generation: 2 }");
    assert_eq!(node.api.requests_to("PUT", &path), 1);
    let slice = node.api.object(&path).unwrap();
    assert_eq!(slice["spec"]["pool"]["generation"], 2);
    assert_eq!(slice["spec"]["devices"].as_array().unwrap().len(), 2);
    kubernetes_validate(&slice, node.dir.path());
    plugin.stop();
}

/// The API server's (group, resource, verb) of a request, as RBAC names
/// it: `/api/v1/...` is the core group, `/apis/<group>/<version>/...` a
/// named one; a GET of a collection is `list`.
fn rbac_of(method: &str, path: &str) -> (String, String, String) {
    let parts: Vec<&str> = path
        .split('?')
        .next()
        .unwrap()
        .trim_start_matches('/')
        .split('/')
        .collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => ((*group).to_owned(), rest),
        _ => panic!("not an API path: {path}"),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        r => r,
    };
    let (resource, named) = (rest[0].to_owned(), rest.len() > 1);
    let verb = match (method, named) {
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => panic!("{method} {path}"),
    };
    (group, resource, verb.to_owned())
}

/// The (group, resource, verb) triples the dra overlay's ClusterRole
/// grants, from `kubectl kustomize deploy/overlays/dra`.
fn overlay_grants() -> std::collections::BTreeSet<(String, String, String)> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dist::workspace_root().join("deploy/overlays/dra"))
        .output()
        .expect("kubectl (with kustomize)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let role = text
        .split("\n---\n")
        .map(|d| serde_yaml::from_str::<Value>(d).unwrap())
        .find(|d| d["kind"] == "ClusterRole")
        .expect("a ClusterRole in deploy/overlays/dra");
    let mut grants = std::collections::BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        let list = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect()
        };
        for g in list("apiGroups") {
            for r in list("resources") {
                for v in list("verbs") {
                    assert!(g != "*" && r != "*" && v != "*", "a wildcard in {rule}");
                    grants.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    grants
}

#[test]
fn the_slice_follows_the_gpus_nvml_reports_and_the_overlays_rbac_allows_exactly_what_is_asked() {
    let node = Node::new();
    let kubelet = StandInKubelet::new();
    node.api.put(
        &format!("/api/v1/nodes/{NODE}"),
        &serde_json::json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "uid": "6b1d2c3e-4f50-4617-8829-3a4b5c6d7e8f",
                         "resourceVersion": "7"}})
        .to_string(),
    );
    let slices = "/apis/resource.k8s.io/v1/resourceslices";
    let path = format!("{slices}/{NODE}-vgpu-dev");
    let devices = |slice: &Value| -> Vec<String> {
        slice["spec"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                d["attributes"]["uuid"]["string"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    let uuid = simgpu::model::device_uuid_string;
    let plugin = node.start_with(
        "plugin.log",
        &[
            "--api-server".into(),
            node.api.url().into(),
            "--rescan-interval".into(),
            "0.2".into(),
        ],
    );
    plugin.wait_log("ResourceSlice node-a-vgpu-dev: Created");
    assert_eq!(
        devices(&node.api.object(&path).unwrap()),
        [uuid(0), uuid(1)]
    );

    // GPU 1 is lost (fell off the bus, or was taken out): the slice is
    // replaced, the same object one generation up, with GPU 0 alone.
    node.gpu.set_devices(1);
    plugin.wait_log("ResourceSlice node-a-vgpu-dev: Replaced { generation: 2 }");
    let slice = node.api.object(&path).unwrap();
    assert_eq!(devices(&slice), [uuid(0)]);
    assert_eq!(slice["spec"]["pool"]["generation"], 2);
    kubernetes_validate(&slice, node.dir.path());
    // A claim the scheduler allocated on the lost GPU before it learnt of
    // the loss: refused, naming what the node has, nothing written.
    let (claim, uid) = node.serve("shared");
    let before = node.snapshot();
    let a = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert!(
        a[&uid].error.contains(
            "device gpu-1 of pool node-a is not a GPU of this node (pool node-a, devices gpu-0)"
        ),
        "{:?}",
        a[&uid].error
    );
    assert_eq!(node.snapshot(), before);

    // It is back: replaced again, both GPUs, and the claim prepares.
    node.gpu.set_devices(2);
    plugin.wait_log("ResourceSlice node-a-vgpu-dev: Replaced { generation: 3 }");
    let slice = node.api.object(&path).unwrap();
    assert_eq!(devices(&slice), [uuid(0), uuid(1)]);
    let a = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(a[&uid].error, "");
    // Several rescans with nothing changed since: no further write. One
    // slice all along: created once, then updated, never made anew.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(node.api.requests_to("POST", slices), 1);
    assert_eq!(node.api.requests_to("PUT", &path), 2);
    let log = plugin.stop();
    assert_eq!(log.matches("the node's GPUs changed").count(), 2, "{log}");

    // Every request the plugin made is one the dra overlay's ClusterRole
    // grants, and it grants nothing the plugin did not ask for.
    let asked: std::collections::BTreeSet<_> = node
        .api
        .request_log()
        .iter()
        .map(|(m, p)| rbac_of(m, p))
        .collect();
    assert_eq!(asked, overlay_grants());
}

/// NVIDIA's CDI spec as `nvidia-ctk cdi generate` writes it (YAML), naming
/// GPU 0 by UUID and each of `by_index` by its index, with spec-wide edits.
fn nvidia_spec(by_index: &[u32]) -> String {
    let mut devices = format!(
        "- name: {}\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n",
        simgpu::model::device_uuid_string(0)
    );
    for i in by_index {
        devices.push_str(&format!(
            "- name: \"{i}\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia{i}\n"
        ));
    }
    format!(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n{devices}\
         - name: all\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n\
         containerEdits:\n  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n  deviceNodes:\n  \
         - path: /dev/nvidiactl\n  mounts:\n  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06\n    \
         containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06\n    options: [ro, nosuid, nodev, bind]\n"
    )
}

#[test]
fn where_the_node_has_nvidias_cdi_spec_a_claim_is_answered_with_nvidias_devices_beside_its_own() {
    let node = Node::new();
    let kubelet = StandInKubelet::new();
    let (claim, uid) = node.serve("shared");
    let ours = format!("{DRIVER}/claim={uid}");
    std::fs::write(node.path("nvidia-cdi/nvidia.yaml"), nvidia_spec(&[1])).unwrap();
    let plugin = node.start("plugin.log");
    type Answers = std::collections::HashMap<
        String,
        vgpu_tests::kubelet::pb::dra::NodePrepareResourceResponse,
    >;
    let ids = |a: &Answers| -> Vec<Vec<String>> {
        let r = &a[&uid];
        assert_eq!(r.error, "");
        r.devices.iter().map(|d| d.cdi_device_ids.clone()).collect()
    };
    let a = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    // gpu-0 by its UUID, gpu-1 by its index, as NVIDIA's spec names them;
    // NVIDIA's first, so the claim's NVIDIA_VISIBLE_DEVICES is the one the
    // runtime keeps.
    assert_eq!(
        ids(&a),
        [
            vec![
                format!("nvidia.com/gpu={}", simgpu::model::device_uuid_string(0)),
                ours.clone()
            ],
            vec!["nvidia.com/gpu=1".to_owned(), ours.clone()],
        ]
    );
    // The claim's spec restates no device node (NVIDIA's brings them and
    // the driver's files) and keeps everything of vgpu's.
    let spec: Value =
        serde_json::from_slice(&std::fs::read(node.spec_path(&uid)).unwrap()).unwrap();
    assert_valid_cdi(&spec);
    let edits = &spec["devices"][0]["containerEdits"];
    assert!(edits.get("deviceNodes").is_none(), "{edits:#}");
    let env: Vec<&str> = edits["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        env.iter()
            .any(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=GPU-")),
        "{env:?}"
    );
    assert!(
        env.contains(&"CUDA_DEVICE_MEMORY_LIMIT_1=3221225472"),
        "{env:?}"
    );
    assert_eq!(edits["mounts"].as_array().unwrap().len(), 3);

    // NVIDIA's spec names GPU 0 only now (another device-name strategy):
    // the claim, prepared anew, restates the device nodes and answers its
    // own device alone.
    let un = kubelet.unprepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(un[&uid].error, "");
    std::fs::write(node.path("nvidia-cdi/nvidia.yaml"), nvidia_spec(&[])).unwrap();
    let a = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(ids(&a), [vec![ours.clone()], vec![ours.clone()]]);
    let spec: Value =
        serde_json::from_slice(&std::fs::read(node.spec_path(&uid)).unwrap()).unwrap();
    assert_valid_cdi(&spec);
    let nodes: Vec<&str> = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["/dev/nvidia1", "/dev/nvidiactl"]);
    plugin.stop();
}

#[test]
fn podman_merges_nvidias_spec_with_the_claims_and_the_claims_values_stay() {
    // NVIDIA's spec stands in for `nvidia-ctk cdi generate`'s: kind
    // nvidia.com/gpu, a device per simulated GPU (their UUIDs, which no
    // real spec names), spec-wide edits with NVIDIA_VISIBLE_DEVICES=void and
    // a mount standing for the driver's files. podman reads it from
    // /var/run/cdi; the plugin from its --nvidia-cdi-dir.
    let driver = format!("vgpu-e2e-nv-{}.dev", std::process::id());
    let cdi_dir = PathBuf::from("/var/run/cdi");
    std::fs::create_dir_all(&cdi_dir).unwrap();
    let node = Node::with(&driver, &cdi_dir);
    let kubelet = StandInKubelet::new();
    let driver_files = tempfile::Builder::new()
        .prefix("vgpu-dra-driver-")
        .tempdir()
        .unwrap();
    std::fs::write(driver_files.path().join("marker"), "driver files\n").unwrap();
    let uuid = simgpu::model::device_uuid_string;
    let spec = format!(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n\
         - name: {}\n  containerEdits:\n    env: [STANDS_FOR_NVIDIA_DEVICE_0=1]\n\
         - name: {}\n  containerEdits:\n    env: [STANDS_FOR_NVIDIA_DEVICE_1=1]\n\
         containerEdits:\n  env: [NVIDIA_VISIBLE_DEVICES=void]\n  mounts:\n  \
         - hostPath: {}\n    containerPath: /opt/nvidia-driver\n    options: [ro, nosuid, nodev, bind]\n",
        uuid(0),
        uuid(1),
        driver_files.path().display()
    );
    let nvidia_spec = cdi_dir.join(format!("vgpu-e2e-nv-{}-nvidia.yaml", std::process::id()));
    let _nvidia = RemoveOnDrop(nvidia_spec.clone());
    std::fs::write(&nvidia_spec, &spec).unwrap();
    std::fs::write(node.path("nvidia-cdi/nvidia.yaml"), &spec).unwrap();
    let (claim, uid) = node.serve("shared");
    let _spec = RemoveOnDrop(node.spec_path(&uid));
    let plugin = node.start("plugin.log");
    let a = kubelet.prepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(a[&uid].error, "");
    // Every CDI device of the claim, in the answer's order, once: what a
    // runtime gets for a container using the claim's requests.
    let mut devices: Vec<String> = Vec::new();
    for d in &a[&uid].devices {
        for id in &d.cdi_device_ids {
            if !devices.contains(id) {
                devices.push(id.clone());
            }
        }
    }
    let ours = format!("{driver}/claim={uid}");
    assert_eq!(
        devices,
        [
            format!("nvidia.com/gpu={}", uuid(0)),
            ours,
            format!("nvidia.com/gpu={}", uuid(1)),
        ]
    );

    let out = podman_run(
        &node,
        &devices,
        &[],
        &[
            OsStr::new("/bin/sh"),
            OsStr::new("-c"),
            OsStr::new(
                "echo \"visible=$NVIDIA_VISIBLE_DEVICES\"; env | grep ^STANDS_FOR_ | sort; \
                 cat /opt/nvidia-driver/marker; echo \"limit0=$CUDA_DEVICE_MEMORY_LIMIT_0\"",
            ),
        ],
    );
    // NVIDIA's edits are in (both devices' and the spec-wide mount), and the
    // claim's NVIDIA_VISIBLE_DEVICES, which the daemon reads to map the
    // limits to GPUs, is the one kept.
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            format!("visible={},{}", uuid(0), uuid(1)).as_str(),
            "STANDS_FOR_NVIDIA_DEVICE_0=1",
            "STANDS_FOR_NVIDIA_DEVICE_1=1",
            "driver files",
            "limit0=1073741824",
        ],
        "{out}"
    );
    let un = kubelet.unprepare(&node.dra_socket(), &[(NS, &claim, &uid)]);
    assert_eq!(un[&uid].error, "");
    plugin.stop();
}
