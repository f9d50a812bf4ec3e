//! An emulated HAMi node, written from what HAMi v2.10's device plugin does
//! (docs/kubernetes.md cites the source):
//! - its start (postStart `vgpu-init.sh <hookPath>/vgpu/`) copies each file
//!   of its image's `/k8s-vgpu/lib/nvidia/` to the host directory when the
//!   host file is missing or its MD5 differs (`cp`: an existing file is
//!   rewritten in place), then writes `ld.so.preload` naming
//!   `<hookPath>/vgpu/libvgpu.so`;
//! - `Allocate` picks `<hookPath>/vgpu/libvgpu.so.<version>` if it exists,
//!   else `<hookPath>/vgpu/libvgpu.so`, and mounts it read-only at
//!   `<hookPath>/vgpu/libvgpu.so`, the container's own directory
//!   `<hookPath>/vgpu/containers/<podUID>_<ctr>` at `<hookPath>/vgpu`, the
//!   host's `/tmp/vgpulock` at `/tmp/vgpulock` and `<hookPath>/vgpu/ld.so.preload`
//!   read-only at `/etc/ld.so.preload`, with `CUDA_DEVICE_MEMORY_LIMIT_<i>`,
//!   `CUDA_DEVICE_SM_LIMIT`, `CUDA_DEVICE_MEMORY_SHARED_CACHE=<hookPath>/vgpu/<uuid>.cache`.
//!
//! The node's "host" directories live under the test's directory; inside a
//! container (a mount and PID namespace, mounts made in the runtime's
//! parent-first order) every path is the real one. HAMi's library is a
//! stand-in that says so on stderr when it loads.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::dist::{self, vgpu_bin};
use vgpu_tests::sim::SimGpu;

const VERSION: &str = "v2.10.0";
/// HAMi's default `global.gpuHookPath`, as containers see it.
const HOOK_PATH: &str = "/usr/local";
const STANDIN_SAYS: &str = "hami-standin loaded";
const VGPU_SAYS: &str = "[vgpu pid=";

struct Node {
    root: PathBuf,
    /// The host's `<hookPath>/vgpu`.
    vgpu_dir: PathBuf,
    /// The device plugin image's `/k8s-vgpu/lib/nvidia`.
    image_lib: PathBuf,
    /// The host's `/tmp/vgpulock`.
    vgpulock: PathBuf,
    /// Containers allocated so far.
    seq: u32,
}

/// One container's share of HAMi's Allocate response.
struct Allocation {
    /// (host path, container path, read-only)
    mounts: Vec<(PathBuf, String, bool)>,
    env: Vec<(String, String)>,
    /// The host's copy of the container's region file.
    region: PathBuf,
}

fn sh(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Node {
    fn new(name: &str) -> Node {
        // Not under /tmp: containers get their own /tmp.
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("hami-node-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let vgpu_dir = root.join("host/usr/local/vgpu");
        let image_lib = root.join("image/k8s-vgpu/lib/nvidia");
        std::fs::create_dir_all(&image_lib).unwrap();
        // HAMi's library: a stand-in built here that announces itself.
        let src = root.join("standin.c");
        std::fs::write(
            &src,
            format!(
                "#include <unistd.h>\n__attribute__((constructor)) static void hello(void) {{\n\
                 static const char m[] = \"{STANDIN_SAYS}\\n\"; (void)!write(2, m, sizeof m - 1); }}\n"
            ),
        )
        .unwrap();
        sh(Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(image_lib.join(format!("libvgpu.so.{VERSION}")))
            .arg(&src));
        // HAMi's image also ships an ld.so.preload its start script skips.
        std::fs::write(image_lib.join("ld.so.preload"), "stale\n").unwrap();
        Node {
            vgpulock: root.join("host/tmp/vgpulock"),
            root,
            vgpu_dir,
            image_lib,
            seq: 0,
        }
    }

    fn versioned(&self) -> PathBuf {
        self.vgpu_dir.join(format!("libvgpu.so.{VERSION}"))
    }

    /// The device plugin's start: HAMi's copy-back rule, then ld.so.preload.
    fn device_plugin_start(&self) {
        std::fs::create_dir_all(&self.vgpu_dir).unwrap();
        for e in std::fs::read_dir(&self.image_lib).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            if name == "ld.so.preload" {
                continue;
            }
            let dst = self.vgpu_dir.join(&name);
            let src = std::fs::read(e.path()).unwrap();
            // Equal bytes, equal MD5; `fs::copy` truncates and rewrites an
            // existing file in place, as `cp` does.
            if std::fs::read(&dst).ok().as_deref() != Some(&src[..]) {
                std::fs::copy(e.path(), &dst).unwrap();
            }
        }
        std::fs::write(
            self.vgpu_dir.join("ld.so.preload"),
            format!("{HOOK_PATH}/vgpu/libvgpu.so\n"),
        )
        .unwrap();
    }

    /// `GetLibPath()`.
    fn lib_path(&self) -> PathBuf {
        let v = self.versioned();
        if v.exists() {
            v
        } else {
            self.vgpu_dir.join("libvgpu.so")
        }
    }

    /// HAMi's Allocate for container `ctr` of a new pod, 256 MiB and 50 % SM.
    fn allocate(&mut self, ctr: &str) -> Allocation {
        self.seq += 1;
        let pod_uid = format!("0b6c2f3e-1111-2222-3333-{:012}", self.seq);
        let cache_dir = self
            .vgpu_dir
            .join("containers")
            .join(format!("{pod_uid}_{ctr}"));
        let _ = std::fs::remove_dir_all(&cache_dir);
        std::fs::create_dir_all(&cache_dir).unwrap();
        std::fs::create_dir_all(&self.vgpulock).unwrap();
        let region_name = format!("{:08x}-aaaa-bbbb-cccc-{:012x}.cache", self.seq, self.seq);
        Allocation {
            mounts: vec![
                (
                    self.lib_path(),
                    format!("{HOOK_PATH}/vgpu/libvgpu.so"),
                    true,
                ),
                (cache_dir.clone(), format!("{HOOK_PATH}/vgpu"), false),
                (self.vgpulock.clone(), "/tmp/vgpulock".into(), false),
                (
                    self.vgpu_dir.join("ld.so.preload"),
                    "/etc/ld.so.preload".into(),
                    true,
                ),
            ],
            env: vec![
                ("CUDA_DEVICE_MEMORY_LIMIT_0".into(), "256m".into()),
                ("CUDA_DEVICE_SM_LIMIT".into(), "50".into()),
                (
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
                    format!("{HOOK_PATH}/vgpu/{region_name}"),
                ),
                ("LIBCUDA_LOG_LEVEL".into(), "3".into()),
            ],
            region: cache_dir.join(region_name),
        }
    }

    /// Runs `exe` in a new container made from `a`: a mount and PID
    /// namespace whose /etc and /usr/local are overlays (so mount points
    /// can be made without touching the machine's), and a private /tmp
    /// that keeps only the simulated GPU's directory.
    fn run(&self, a: &Allocation, gpu: &SimGpu, exe: &Path) -> Output {
        // The scratch directory must not lie under /tmp, which the
        // container replaces: a checkout (and so CARGO_TARGET_TMPDIR) may.
        let scratch = PathBuf::from(format!(
            "/run/vgpu-hami-node-{}-{}",
            std::process::id(),
            self.seq
        ));
        std::fs::create_dir_all(&scratch).unwrap();
        // What the container still needs from the machine's /tmp: the
        // simulated GPU, the node's files, the program and vgpu's build.
        let mut keep: Vec<PathBuf> = vec![
            gpu.dir().to_path_buf(),
            self.root.clone(),
            exe.parent().map(Path::to_path_buf).unwrap_or_default(),
            vgpu_tests::dist::dist_dir(),
        ];
        keep.extend(
            gpu.envs()
                .into_iter()
                .flat_map(|(_, v)| v.split(':').map(PathBuf::from).collect::<Vec<_>>())
                .filter(|p| p.is_dir()),
        );
        keep.retain(|p| p.starts_with("/tmp") && p != Path::new("/tmp"));
        keep.sort();
        keep.dedup();
        let mut kept: Vec<PathBuf> = Vec::new();
        for p in keep {
            if !kept.iter().any(|k| p.starts_with(k)) {
                kept.push(p);
            }
        }
        let mut script = format!(
            "set -e\nS={s}\nmount -t tmpfs tmpfs $S\n\
             for d in /etc /usr/local; do mkdir -p $S/u$d $S/w$d; \
             mount -t overlay overlay -o lowerdir=$d,upperdir=$S/u$d,workdir=$S/w$d $d; done\n\
             mkdir $S/oldtmp; mount --rbind /tmp $S/oldtmp; mount -t tmpfs tmpfs /tmp\n",
            s = scratch.display(),
        );
        for p in &kept {
            let rel = p.strip_prefix("/tmp").unwrap_or(p);
            script.push_str(&format!(
                "mkdir -p {p}; mount --bind $S/oldtmp/{rel} {p}\n",
                p = p.display(),
                rel = rel.display()
            ));
        }
        // Parent directories first, as container runtimes order mounts;
        // the preload file last, since the runtime makes every mount before
        // the container's first exec and this script execs on the way.
        let mut mounts = a.mounts.clone();
        mounts.sort_by_key(|(_, c, _)| (c == "/etc/ld.so.preload", c.matches('/').count()));
        for (host, ctr, ro) in &mounts {
            let host = host.display();
            if Path::new(host.to_string().as_str()).is_dir() {
                script.push_str(&format!("mkdir -p {ctr}\n"));
            } else {
                script.push_str(&format!("mkdir -p $(dirname {ctr}); touch {ctr}\n"));
            }
            script.push_str(&format!("mount --bind {host} {ctr}\n"));
            if *ro {
                script.push_str(&format!("mount -o remount,bind,ro {ctr}\n"));
            }
        }
        script.push_str(&format!("exec {}\n", exe.display()));
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--pid", "--fork", "sh", "-c", &script])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        for (k, v) in gpu.envs().into_iter().chain(a.env.iter().cloned()) {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run container");
        // Only the mount point is left on the machine (the mounts ended
        // with the namespace).
        let _ = std::fs::remove_dir(&scratch);
        out
    }
}

/// `vgpu install-hook --hami` for the node, with extra arguments.
fn install_hook(node: &Node, extra: &[&str]) -> Command {
    let mut c = Command::new(vgpu_bin());
    c.arg("install-hook")
        .arg("--hami")
        .arg("--host-dir")
        .arg(&node.vgpu_dir)
        .arg("--from")
        .arg(dist::hook_lib())
        .args(extra);
    c
}

/// A CUDA program in a new container ran under vgpu's hook: the hook's own
/// log lines, the allocation limit it enforces, and the region it created.
fn assert_runs_vgpu(node: &mut Node, gpu: &SimGpu, exe: &Path, when: &str) {
    let a = node.allocate("main");
    assert_eq!(
        a.mounts[0].0,
        node.vgpu_dir.join("libvgpu.so"),
        "{when}: the device plugin mounts vgpu's libvgpu.so"
    );
    let out = node.run(&a, gpu, exe);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{when}: {stdout}{stderr}");
    assert!(
        stderr.contains(VGPU_SAYS) && stderr.contains("created region with limits"),
        "{when}: vgpu's hook logs from inside the container: {stderr}"
    );
    assert!(!stderr.contains(STANDIN_SAYS), "{when}: {stderr}");
    assert!(
        stdout.contains("cuMemGetInfo: total 256 MiB"),
        "{when}: the hook reports the container's limit: {stdout}"
    );
    let region = RegionFile::open(&a.region, Access::ReadOnly)
        .unwrap_or_else(|e| panic!("{when}: region {}: {e:?}", a.region.display()));
    assert_eq!(
        region.region().limit[0].load(std::sync::atomic::Ordering::SeqCst),
        256 << 20,
        "{when}: the region in the container's HAMi directory"
    );
}

fn assert_runs_hami(node: &mut Node, gpu: &SimGpu, exe: &Path, when: &str) {
    let a = node.allocate("main");
    let out = node.run(&a, gpu, exe);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{when}: {stdout}{stderr}");
    assert!(stderr.contains(STANDIN_SAYS), "{when}: {stderr}");
    assert!(!stderr.contains(VGPU_SAYS), "{when}: {stderr}");
    assert!(
        !stdout.contains("total 256 MiB"),
        "{when}: no limit without vgpu: {stdout}"
    );
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Watcher(Child);

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn hami_node_loads_vgpu_survives_device_plugin_restarts_and_uninstalls_back_to_hami() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let mut node = Node::new("lifecycle");
    let exe = dist::compile_c("demo_workload", &node.root, false);

    // HAMi alone: its library is mounted and loaded.
    node.device_plugin_start();
    assert_eq!(node.lib_path(), node.versioned());
    assert_runs_hami(&mut node, &gpu, &exe, "HAMi before vgpu");
    let hami_bytes = std::fs::read(node.versioned()).unwrap();

    // Install: HAMi's versioned file moves aside, vgpu's is mounted.
    let out = sh(&mut install_hook(&node, &[]));
    assert!(
        text(&out.stdout).contains(&format!("moved aside HAMi's libvgpu.so.{VERSION}")),
        "{}",
        text(&out.stdout)
    );
    assert!(!node.versioned().exists());
    let out = install_hook(&node, &["--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("get vgpu's hook"));
    assert_runs_vgpu(&mut node, &gpu, &exe, "after install-hook --hami");

    // The device plugin restarts: its copy-back puts HAMi's file back (a new
    // file: the name did not exist) and the watcher moves it aside again,
    // woken by inotify long before its 60 s period.
    let watcher = Watcher(
        install_hook(&node, &["--watch", "60"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Let it start watching first.
    std::thread::sleep(Duration::from_millis(500));
    let ours = std::fs::metadata(node.vgpu_dir.join("libvgpu.so")).unwrap();
    node.device_plugin_start();
    wait_until(
        "the watcher moves the copied-back library aside",
        Duration::from_secs(2),
        || !node.versioned().exists(),
    );
    // HAMi's copy created a new file: the library running containers
    // have mapped was not written to.
    use std::os::unix::fs::MetadataExt as _;
    let now = std::fs::metadata(node.vgpu_dir.join("libvgpu.so")).unwrap();
    assert_eq!(
        (now.ino(), now.mtime_nsec()),
        (ours.ino(), ours.mtime_nsec())
    );
    assert_eq!(
        std::fs::read(node.vgpu_dir.join("libvgpu.so")).unwrap(),
        std::fs::read(dist::hook_lib()).unwrap()
    );
    assert_runs_vgpu(&mut node, &gpu, &exe, "after a device-plugin restart");
    node.device_plugin_start();
    wait_until("again", Duration::from_secs(2), || {
        !node.versioned().exists()
    });
    assert_runs_vgpu(&mut node, &gpu, &exe, "after a second restart");
    drop(watcher);

    // Uninstall: HAMi's file is back under its name, vgpu's is gone.
    let out = sh(Command::new(vgpu_bin())
        .args(["install-hook", "--uninstall", "--host-dir"])
        .arg(&node.vgpu_dir));
    assert!(
        text(&out.stdout).contains(&format!("put back HAMi's libvgpu.so.{VERSION}")),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(std::fs::read(node.versioned()).unwrap(), hami_bytes);
    assert!(!node.vgpu_dir.join("libvgpu.so").exists());
    assert!(!node.vgpu_dir.join(".vgpu-backup").exists());
    let out = install_hook(&node, &["--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains(&format!(
            "HAMi's library ({}/libvgpu.so.{VERSION})",
            node.vgpu_dir.display()
        )),
        "{}",
        text(&out.stdout)
    );
    assert_runs_hami(&mut node, &gpu, &exe, "after uninstall");
    node.device_plugin_start();
    assert_runs_hami(&mut node, &gpu, &exe, "after uninstall and a restart");
    let _ = std::fs::remove_dir_all(&node.root);
}
