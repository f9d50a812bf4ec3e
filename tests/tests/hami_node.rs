//! An emulated HAMi node, written from what HAMi's device plugin does
//! (docs/kubernetes.md cites the source), in three generations, and a node
//! of Volcano's vGPU device plugin, which injects HAMi-core too:
//! - 2.10: its start (postStart `vgpu-init.sh <hookPath>/vgpu/`) copies each
//!   file of its image's `/k8s-vgpu/lib/nvidia/` (`libvgpu.so.<version>`)
//!   to the host directory when the host file is missing or its MD5 differs
//!   (`cp`: an existing file is rewritten in place), skipping
//!   `ld.so.preload`, then writes `ld.so.preload` naming
//!   `<hookPath>/vgpu/libvgpu.so`;
//! - 2.5 to 2.9: the same, but the image's `ld.so.preload` (no newline) is
//!   copied by the MD5 rule like the library, and nothing is regenerated;
//! - 2.4: the image ships an unversioned `libvgpu.so`, and the chart's
//!   postStart `cp -f /k8s-vgpu/lib/nvidia/* <hookPath>/vgpu/` rewrites every
//!   file in place on every start; `Allocate` always mounts `libvgpu.so`;
//! - `Allocate` (2.5 and later) picks `<hookPath>/vgpu/libvgpu.so.<version>`
//!   if it exists, else `<hookPath>/vgpu/libvgpu.so`, and mounts it read-only at
//!   `<hookPath>/vgpu/libvgpu.so`, the container's own directory
//!   `<hookPath>/vgpu/containers/<podUID>_<ctr>` at `<hookPath>/vgpu`, the
//!   host's `/tmp/vgpulock` at `/tmp/vgpulock` and `<hookPath>/vgpu/ld.so.preload`
//!   read-only at `/etc/ld.so.preload`, with `CUDA_DEVICE_MEMORY_LIMIT_<i>`,
//!   `CUDA_DEVICE_SM_LIMIT`, `CUDA_DEVICE_MEMORY_SHARED_CACHE=<hookPath>/vgpu/<uuid>.cache`.
//!
//! - Volcano's vGPU device plugin (Project-HAMi/volcano-vgpu-device-plugin
//!   at 4fb76ba): its chart (`deployments/helm/volcano-vgpu-device-plugin/
//!   templates/daemonset.yaml`) sets `HOOK_PATH=/usr/local/vgpu` and a
//!   postStart `cp -f /k8s-vgpu/lib/nvidia/* /usr/local/vgpu/`, the image
//!   (`docker/Dockerfile.ubuntu20.04`) holding HAMi-core's `libvgpu.so` and
//!   `lib/nvidia/ld.so.preload` (`/usr/local/vgpu/libvgpu.so`, no newline);
//!   `Allocate` (`pkg/plugin/server.go`) mounts `<HOOK_PATH>/libvgpu.so`
//!   read-only at `/usr/local/vgpu/libvgpu.so`, the region directory
//!   `<HOOK_PATH>/vgpu/containers/<podUID>_<ctr>` at `/tmp/vgpu`, the host's
//!   `/tmp/vgpulock`, and `<HOOK_PATH>/ld.so.preload` read-only at
//!   `/etc/ld.so.preload` unless the container's spec has
//!   `CUDA_DISABLE_CONTROL` (any value), with `CUDA_DEVICE_MEMORY_LIMIT_<i>=
//!   <memory × gpuMemoryFactor>m`, `CUDA_DEVICE_SM_LIMIT`,
//!   `CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu/<random uuid>.cache` and
//!   `CUDA_OVERSUBSCRIBE=true` (where `deviceCoresScaling` > 1).
//!
//! - KAI's resource isolator (Project-HAMi/KAI-resource-isolator, webhook
//!   cmd/webhook/main.go and chart/kai-resource-isolator/templates/daemonset.yaml at
//!   1609f2f/508dee7): its libsync DaemonSet's start `mkdir -p`s
//!   `<containerVgpuMount>/containers` and `/tmp/vgpulock`, `cp -f`s its
//!   image's `/artifacts/libvgpu.so` (HAMi-core) and its ConfigMap's
//!   `ld.so.preload` (`/usr/local/vgpu/libvgpu.so`) into
//!   `<containerVgpuMount>` (`/usr/local/vgpu`), `chmod 0644`s both and
//!   `chmod 1777`s the two directories; its webhook, for a pod annotated
//!   `gpu-fraction` or `gpu-memory` (unless `kai-resource-isolator.io/inject:
//!   "false"`), gives the fraction container (named by
//!   `gpu-fraction-container-name`, else the first) the host's
//!   `/usr/local/vgpu` read-write at the same path, its `ld.so.preload`
//!   read-only at `/etc/ld.so.preload`, the host's
//!   `/usr/local/vgpu/containers` and `/tmp/vgpulock` at the same paths, and
//!   `POD_UID` (the pod's UID), `CONTAINER_NAME`, `CONTAINER_VGPU_MOUNT=
//!   /usr/local/vgpu`; no cache path is named, so HAMi-core puts the region
//!   at `<mount>/containers/<POD_UID>_<CONTAINER_NAME>/usage.cache`. KAI's
//!   binder (kai-scheduler/KAI-Scheduler `pkg/binder/plugins/hamicore`)
//!   sets `CUDA_DEVICE_MEMORY_LIMIT=<node GPU MiB × portion>m` (no device
//!   index) and, with `gpu-sm-percentage`, `CUDA_DEVICE_SM_LIMIT`, through
//!   the pod's GPU-sharing ConfigMap. A pod without the annotations gets
//!   nothing: no preload, no limit.
//!
//! The node's "host" directories live under the test's directory; inside a
//! container (a mount and PID namespace, mounts made in the runtime's
//! parent-first order) every path is the real one. HAMi's library is a
//! stand-in that says so on stderr when it loads.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::dist::{self, vgpu_bin};
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::eventually;

/// A HAMi release whose device-plugin start and `Allocate` are emulated.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Gen {
    V2_4,
    V2_5,
    V2_10,
    Volcano,
    Kai,
}

impl Gen {
    fn version(self) -> &'static str {
        match self {
            Gen::V2_4 => "v2.4.1",
            Gen::V2_5 => "v2.5.0",
            Gen::V2_10 => "v2.10.0",
            Gen::Volcano => "volcano-4fb76ba",
            Gen::Kai => "kai-resource-isolator-1609f2f",
        }
    }

    /// The library's name in the image and on the host.
    fn lib_name(self) -> String {
        match self {
            Gen::V2_4 | Gen::Volcano | Gen::Kai => "libvgpu.so".into(),
            _ => format!("libvgpu.so.{}", self.version()),
        }
    }
}

/// HAMi's default `global.gpuHookPath`, as containers see it.
const HOOK_PATH: &str = "/usr/local";
const STANDIN_SAYS: &str = "hami-standin loaded";
const VGPU_SAYS: &str = "[vgpu pid=";

struct Node {
    gen: Gen,
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
    fn new(name: &str, gen: Gen) -> Node {
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
            .arg(image_lib.join(gen.lib_name()))
            .arg(&src));
        // HAMi's image also ships an ld.so.preload (no newline at the end).
        std::fs::write(
            image_lib.join("ld.so.preload"),
            format!("{HOOK_PATH}/vgpu/libvgpu.so"),
        )
        .unwrap();
        Node {
            gen,
            vgpulock: root.join("host/tmp/vgpulock"),
            root,
            vgpu_dir,
            image_lib,
            seq: 0,
        }
    }

    /// HAMi's library on the host (2.4: the unversioned name).
    fn versioned(&self) -> PathBuf {
        self.vgpu_dir.join(self.gen.lib_name())
    }

    /// The device plugin's start: HAMi's copy-back rule, then (2.10)
    /// ld.so.preload.
    fn device_plugin_start(&self) {
        std::fs::create_dir_all(&self.vgpu_dir).unwrap();
        for e in std::fs::read_dir(&self.image_lib).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            if name == "ld.so.preload" && self.gen == Gen::V2_10 {
                continue;
            }
            let dst = self.vgpu_dir.join(&name);
            let src = std::fs::read(e.path()).unwrap();
            // Equal bytes, equal MD5 (2.4's `cp -f` copies regardless);
            // `fs::copy` truncates and rewrites an existing file in place,
            // as `cp` does.
            if self.rewrites() || std::fs::read(&dst).ok().as_deref() != Some(&src[..]) {
                std::fs::copy(e.path(), &dst).unwrap();
            }
        }
        if self.gen == Gen::V2_10 {
            std::fs::write(
                self.vgpu_dir.join("ld.so.preload"),
                format!("{HOOK_PATH}/vgpu/libvgpu.so\n"),
            )
            .unwrap();
        }
        if self.gen == Gen::Kai {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = |p: &Path, m: u32| {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
            };
            for d in [self.vgpu_dir.join("containers"), self.vgpulock.clone()] {
                std::fs::create_dir_all(&d).unwrap();
                mode(&d, 0o1777);
            }
            for f in ["libvgpu.so", "ld.so.preload"] {
                mode(&self.vgpu_dir.join(f), 0o644);
            }
        }
    }

    /// Does the device plugin's start `cp -f` every file (in place)?
    fn rewrites(&self) -> bool {
        matches!(self.gen, Gen::V2_4 | Gen::Volcano | Gen::Kai)
    }

    /// `GetLibPath()` (2.4 and Volcano: always `libvgpu.so`).
    fn lib_path(&self) -> PathBuf {
        let v = self.versioned();
        if !self.rewrites() && v.exists() {
            v
        } else {
            self.vgpu_dir.join("libvgpu.so")
        }
    }

    /// HAMi's Allocate for container `ctr` of a new pod, 256 MiB and 50 % SM.
    fn allocate(&mut self, ctr: &str) -> Allocation {
        match self.gen {
            Gen::Volcano => return self.allocate_volcano(ctr, None),
            Gen::Kai => return self.allocate_kai(ctr, true),
            _ => {}
        }
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

    /// Volcano's Allocate for container `ctr` of a new pod: 128 MiB asked,
    /// times a `gpuMemoryFactor` of 2, and 50 % SM; `disable_control` is
    /// the value of the container spec's `CUDA_DISABLE_CONTROL`, if any.
    fn allocate_volcano(&mut self, ctr: &str, disable_control: Option<&str>) -> Allocation {
        const ASKED_MIB: u32 = 128;
        const MEMORY_FACTOR: u32 = 2;
        self.seq += 1;
        let pod_uid = format!("5d1e7a90-4444-5555-6666-{:012}", self.seq);
        let cache_dir = self
            .vgpu_dir
            .join("vgpu/containers")
            .join(format!("{pod_uid}_{ctr}"));
        let _ = std::fs::remove_dir_all(&cache_dir);
        std::fs::create_dir_all(&cache_dir).unwrap();
        std::fs::create_dir_all(&self.vgpulock).unwrap();
        let region_name = format!("{:08x}-dddd-eeee-ffff-{:012x}.cache", self.seq, self.seq);
        let mut mounts = vec![
            (
                self.vgpu_dir.join("libvgpu.so"),
                "/usr/local/vgpu/libvgpu.so".to_owned(),
                true,
            ),
            (cache_dir.clone(), "/tmp/vgpu".to_owned(), false),
            (self.vgpulock.clone(), "/tmp/vgpulock".into(), false),
        ];
        let mut env = vec![
            (
                "CUDA_DEVICE_MEMORY_LIMIT_0".to_owned(),
                format!("{}m", ASKED_MIB * MEMORY_FACTOR),
            ),
            ("CUDA_DEVICE_SM_LIMIT".into(), "50".into()),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
                format!("/tmp/vgpu/{region_name}"),
            ),
            ("CUDA_OVERSUBSCRIBE".into(), "true".into()),
            ("LIBCUDA_LOG_LEVEL".into(), "3".into()),
        ];
        match disable_control {
            // The container's own env holds it; the preload is not mounted.
            Some(v) => env.push(("CUDA_DISABLE_CONTROL".into(), v.into())),
            None => mounts.push((
                self.vgpu_dir.join("ld.so.preload"),
                "/etc/ld.so.preload".into(),
                true,
            )),
        }
        Allocation {
            mounts,
            env,
            region: cache_dir.join(region_name),
        }
    }

    /// KAI's webhook and binder for container `ctr` of a new pod: with
    /// `fraction`, a `gpu-fraction` pod given 1/32 of an 8 GiB GPU (256 MiB)
    /// and `gpu-sm-percentage: 50`; without, a pod KAI leaves alone.
    fn allocate_kai(&mut self, ctr: &str, fraction: bool) -> Allocation {
        const GPU_MIB: f64 = 8192.0;
        const PORTION: f64 = 1.0 / 32.0;
        self.seq += 1;
        let pod_uid = format!("7c3a9e15-7777-8888-9999-{:012}", self.seq);
        let region = self
            .vgpu_dir
            .join("containers")
            .join(format!("{pod_uid}_{ctr}"))
            .join("usage.cache");
        if !fraction {
            return Allocation {
                mounts: Vec::new(),
                env: vec![("LIBCUDA_LOG_LEVEL".into(), "3".into())],
                region,
            };
        }
        let mount = "/usr/local/vgpu";
        Allocation {
            mounts: vec![
                (self.vgpu_dir.clone(), mount.into(), false),
                (
                    self.vgpu_dir.join("ld.so.preload"),
                    "/etc/ld.so.preload".into(),
                    true,
                ),
                (
                    self.vgpu_dir.join("containers"),
                    format!("{mount}/containers"),
                    false,
                ),
                (self.vgpulock.clone(), "/tmp/vgpulock".into(), false),
            ],
            env: vec![
                ("POD_UID".into(), pod_uid),
                ("CONTAINER_NAME".into(), ctr.into()),
                ("CONTAINER_VGPU_MOUNT".into(), mount.into()),
                (
                    "CUDA_DEVICE_MEMORY_LIMIT".into(),
                    format!("{}m", (GPU_MIB * PORTION) as u64),
                ),
                ("CUDA_DEVICE_SM_LIMIT".into(), "50".into()),
                ("LIBCUDA_LOG_LEVEL".into(), "3".into()),
            ],
            region,
        }
    }

    /// Runs `exe` in a new container made from `a`: a mount and PID
    /// namespace whose /etc and /usr/local are overlays (so mount points
    /// can be made without touching the machine's), and a private /tmp
    /// that keeps only the simulated GPU's directory.
    fn run(&self, a: &Allocation, gpu: &SimGpu, exe: &Path) -> Output {
        let (mut cmd, scratch) = self.container(a, gpu, exe, &[]);
        let out = cmd.output().expect("run container");
        // Only the mount point is left on the machine (the mounts ended
        // with the namespace).
        let _ = std::fs::remove_dir(&scratch);
        out
    }

    /// `run`'s container, not started yet, and its scratch mount point.
    fn container(
        &self,
        a: &Allocation,
        gpu: &SimGpu,
        exe: &Path,
        args: &[&str],
    ) -> (Command, PathBuf) {
        // The scratch directory must not lie under /tmp, which the
        // container replaces: a checkout (and so CARGO_TARGET_TMPDIR) may.
        let scratch = PathBuf::from(format!(
            "/run/vgpu-{}-{}",
            // Unique per node (tests run in parallel) and per container.
            self.root.file_name().unwrap_or_default().to_string_lossy(),
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
        script.push_str(&format!("exec {} {}\n", exe.display(), args.join(" ")));
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--pid", "--fork", "sh", "-c", &script])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        for (k, v) in gpu.envs().into_iter().chain(a.env.iter().cloned()) {
            cmd.env(k, v);
        }
        (cmd, scratch)
    }
}

/// `vgpu install-hook --hami` for the node, with extra arguments.
fn install_hook(node: &Node, extra: &[&str]) -> Command {
    hook_cmd(node, true, extra)
}

/// `vgpu install-hook` for the node, with `--hami` or without.
fn hook_cmd(node: &Node, hami: bool, extra: &[&str]) -> Command {
    let mut c = Command::new(vgpu_bin());
    c.arg("install-hook");
    if hami {
        c.arg("--hami");
    }
    c.arg("--host-dir")
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

struct Watcher(Child);

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process's read-only mapping of a library, as a container that loaded
/// it has (the mounted inode, `MAP_PRIVATE`: a rewrite in place shows).
struct Mapped {
    file: std::fs::File,
    addr: *mut libc::c_void,
    len: usize,
    bytes: Vec<u8>,
}

impl Mapped {
    fn new(path: &Path) -> Mapped {
        use std::os::fd::AsRawFd as _;
        let f = std::fs::File::open(path).unwrap();
        let bytes = std::fs::read(path).unwrap();
        let len = bytes.len();
        // SAFETY: a fresh private read-only mapping of an open file, unmapped in Drop.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        Mapped {
            file: f,
            addr,
            len,
            bytes,
        }
    }

    /// The mapped pages still hold the bytes the process loaded.
    fn unchanged(&self) -> bool {
        // A page past a shortened file's end would raise SIGBUS: a file
        // that shrank has changed (the copies here are complete when this
        // runs, so the length is final).
        if self.file.metadata().unwrap().len() < self.len as u64 {
            return false;
        }
        // SAFETY: the mapping is `len` bytes, live until Drop, and the
        // file is at least that long.
        let now = unsafe { std::slice::from_raw_parts(self.addr.cast::<u8>(), self.len) };
        now == &self.bytes[..]
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// The host directory's files (names and bytes), HAMi's per-container
/// directories left out.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, Vec<u8>)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries {
            let e = e.unwrap();
            let name = format!("{prefix}{}", e.file_name().to_string_lossy());
            if name == "containers" {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                walk(&e.path(), &format!("{name}/"), out);
            } else {
                out.push((name, std::fs::read(e.path()).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out);
    out.sort();
    out
}

/// Without `--force`, `install-hook` (plain and `--hami`) refuses the
/// node, naming `host`, and changes nothing there; `--check` names it too
/// and exits 3.
fn refused_without_force(node: &Node, host: &str) {
    let before = snapshot(&node.vgpu_dir);
    for hami in [false, true] {
        let out = hook_cmd(node, hami, &[]).output().unwrap();
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!out.status.success(), "--hami: {hami}: {said}");
        assert!(
            said.contains(host),
            "--hami: {hami}: the refusal names {host}: {said}"
        );
        assert_eq!(snapshot(&node.vgpu_dir), before, "--hami: {hami}");
    }
    let out = hook_cmd(node, false, &["--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains(host), "{}", text(&out.stdout));
}

/// A check that a new pod of the node runs under vgpu's hook.
type RunsVgpu = fn(&mut Node, &SimGpu, &Path, &str);

/// The host's restart (`host`'s) copies its library over vgpu's in place
/// (what `--force` accepted) and the keeper puts vgpu's back by rename,
/// after which `runs_vgpu` holds for a new pod; then the documented
/// uninstall restores the host's library and preload (`was`), and a pod
/// runs HAMi-core again.
fn restart_kept_then_uninstalled(
    node: &mut Node,
    (gpu, exe): (&SimGpu, &Path),
    (host, runs_vgpu): (&str, RunsVgpu),
    (lib, preload): (&[u8], &[u8]),
) {
    let keeper = Watcher(
        hook_cmd(node, false, &["--force", "--watch", "60"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let running = Mapped::new(&node.lib_path());
    node.device_plugin_start();
    assert!(
        !running.unchanged(),
        "{host} restart rewrote the mapped library in place"
    );
    drop(running);
    let ours = std::fs::read(dist::hook_lib()).unwrap();
    eventually(
        Duration::from_secs(2),
        "the keeper puts vgpu's library back after the restart",
        || std::fs::read(node.lib_path()).ok().as_ref() == Some(&ours),
    );
    runs_vgpu(node, gpu, exe, &format!("after {host} restart"));

    uninstall(node);
    drop(keeper);
    assert_eq!(std::fs::read(node.versioned()).unwrap(), lib);
    assert_eq!(
        std::fs::read(node.vgpu_dir.join("ld.so.preload")).unwrap(),
        preload
    );
    assert_runs_hami(node, gpu, exe, "after uninstall");
}

fn uninstall(node: &Node) -> Output {
    sh(Command::new(vgpu_bin())
        .args(["install-hook", "--uninstall", "--host-dir"])
        .arg(&node.vgpu_dir))
}

/// HAMi 2.5 or later: install, `--check`, a keeper across two device-plugin
/// restarts under a process that has vgpu's library mapped, then the
/// documented uninstall while the keeper still runs.
fn lifecycle(gen: Gen) {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let mut node = Node::new(&format!("lifecycle-{}", gen.version()), gen);
    let exe = dist::compile_c("demo_workload", &node.root, false);
    let version = gen.version();

    // HAMi alone: its library is mounted and loaded.
    node.device_plugin_start();
    assert_eq!(node.lib_path(), node.versioned());
    assert_runs_hami(&mut node, &gpu, &exe, "HAMi before vgpu");
    let hami_bytes = std::fs::read(node.versioned()).unwrap();
    let hami_preload = std::fs::read(node.vgpu_dir.join("ld.so.preload")).unwrap();

    // Without --hami: refused, naming --hami; nothing changes.
    let before = snapshot(&node.vgpu_dir);
    let plain = hook_cmd(&node, false, &[]).output().unwrap();
    assert!(
        !plain.status.success() && text(&plain.stderr).contains("--hami"),
        "plain install-hook on HAMi {version}: {}{}",
        text(&plain.stdout),
        text(&plain.stderr)
    );
    assert_eq!(
        snapshot(&node.vgpu_dir),
        before,
        "a refusal changes nothing"
    );

    // Install: HAMi's versioned file moves aside, vgpu's is mounted.
    let out = sh(&mut install_hook(&node, &[]));
    assert!(
        text(&out.stdout).contains(&format!("moved aside HAMi's libvgpu.so.{version}")),
        "{}",
        text(&out.stdout)
    );
    assert!(!node.versioned().exists());
    let out = install_hook(&node, &["--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("get vgpu's hook"));
    assert!(
        text(&out.stdout).contains(&format!("HAMi {version}")),
        "--check names the HAMi release: {}",
        text(&out.stdout)
    );
    assert_runs_vgpu(&mut node, &gpu, &exe, "after install-hook --hami");

    // A hooked container keeps running across two device-plugin restarts
    // and the uninstall, and works after them; so does a mapping of the
    // library (its pages must stay vgpu's). The keeper moves each
    // copied-back file aside, woken by inotify long before its 60 s period.
    let go = node.root.join("go");
    let long = node.allocate("long");
    let longrun_exe = dist::compile_c("hook_longrun", &node.root, false);
    let (mut cmd, long_scratch) =
        node.container(&long, &gpu, &longrun_exe, &[&go.display().to_string()]);
    let mut longrun = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut long_out = std::io::BufReader::new(longrun.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead as _;
    long_out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n", "the long-running container started");
    let running = Mapped::new(&node.lib_path());
    let keeper = Watcher(
        install_hook(&node, &["--watch", "60"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Let it start watching first.
    std::thread::sleep(Duration::from_millis(500));
    let ours = std::fs::metadata(node.vgpu_dir.join("libvgpu.so")).unwrap();
    for restart in ["first", "second"] {
        node.device_plugin_start();
        eventually(
            Duration::from_secs(2),
            &format!("the keeper moves the library copied back at the {restart} restart aside"),
            || !node.versioned().exists(),
        );
        assert!(running.unchanged(), "{restart} restart: mapped pages kept");
        assert_runs_vgpu(
            &mut node,
            &gpu,
            &exe,
            &format!("after the {restart} restart"),
        );
    }
    // HAMi's copy created new files: the library running containers have
    // mapped was not written to.
    use std::os::unix::fs::MetadataExt as _;
    let now = std::fs::metadata(node.vgpu_dir.join("libvgpu.so")).unwrap();
    assert_eq!(
        (now.ino(), now.mtime_nsec()),
        (ours.ino(), ours.mtime_nsec())
    );

    // The documented uninstall: `kubectl exec … hook-keeper -- vgpu
    // install-hook --uninstall` with the keeper running, then a while for
    // it to react (and a device-plugin restart), then the DaemonSet deleted.
    let out = uninstall(&node);
    assert!(
        text(&out.stdout).contains(&format!("put back HAMi's libvgpu.so.{version}")),
        "{}",
        text(&out.stdout)
    );
    std::thread::sleep(Duration::from_millis(1500));
    node.device_plugin_start();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        node.versioned().exists(),
        "the keeper stood down: HAMi's file stays"
    );
    assert_eq!(std::fs::read(node.versioned()).unwrap(), hami_bytes);
    assert!(
        !node.vgpu_dir.join("libvgpu.so").exists(),
        "vgpu's library is gone and stays gone"
    );
    assert_eq!(
        std::fs::read(node.vgpu_dir.join("ld.so.preload")).unwrap(),
        hami_preload
    );
    assert!(running.unchanged(), "uninstall: mapped pages kept");
    std::fs::write(&go, b"").unwrap();
    let status = longrun.wait().unwrap();
    let mut rest = String::new();
    use std::io::Read as _;
    long_out.read_to_string(&mut rest).unwrap();
    let mut long_err = String::new();
    longrun
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut long_err)
        .unwrap();
    let _ = std::fs::remove_dir(&long_scratch);
    assert!(
        status.success() && rest.contains("total 256 MiB") && rest.contains("still working"),
        "the hooked container kept working through two restarts and the uninstall: {rest}{long_err}"
    );
    assert!(
        long_err.contains(VGPU_SAYS) && !long_err.contains(STANDIN_SAYS),
        "{long_err}"
    );
    let mut keeper = keeper;
    let _ = keeper.0.kill();
    let _ = keeper.0.wait();
    let mut said = String::new();
    keeper
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert!(said.contains("stands down"), "keeper said: {said}");
    let out = install_hook(&node, &["--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains(&format!(
            "HAMi's library ({}/libvgpu.so.{version})",
            node.vgpu_dir.display()
        )),
        "{}",
        text(&out.stdout)
    );
    assert_runs_hami(&mut node, &gpu, &exe, "after uninstall");
    node.device_plugin_start();
    assert_runs_hami(&mut node, &gpu, &exe, "after uninstall and a restart");
    // A new install clears the keeper's stand-down.
    sh(&mut install_hook(&node, &[]));
    let keeper = Watcher(
        install_hook(&node, &["--watch", "60"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    node.device_plugin_start();
    eventually(
        Duration::from_secs(2),
        "a keeper after a new install",
        || !node.versioned().exists(),
    );
    drop(keeper);
    let _ = std::fs::remove_dir_all(&node.root);
}

#[test]
fn hami_2_10_node_loads_vgpu_survives_restarts_and_uninstalls_with_the_keeper_running() {
    lifecycle(Gen::V2_10);
}

#[test]
fn hami_2_5_node_loads_vgpu_survives_restarts_and_uninstalls_with_the_keeper_running() {
    lifecycle(Gen::V2_5);
}

/// HAMi 2.4 rewrites `libvgpu.so` in place on every device-plugin start:
/// vgpu refuses to install (with and without --hami), changing nothing,
/// HAMi's containers keep working, and `--check` never calls vgpu's library
/// there served.
#[test]
fn hami_2_4_node_is_refused_and_never_reported_served() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let mut node = Node::new("v2.4", Gen::V2_4);
    let exe = dist::compile_c("demo_workload", &node.root, false);
    node.device_plugin_start();
    assert_runs_hami(&mut node, &gpu, &exe, "HAMi 2.4 before vgpu");

    let before = snapshot(&node.vgpu_dir);
    for hami in [true, false] {
        let out = hook_cmd(&node, hami, &[]).output().unwrap();
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(
            !out.status.success(),
            "install-hook (--hami: {hami}) on HAMi 2.4: {said}"
        );
        assert!(
            said.contains("2.4") && said.contains("in place"),
            "--hami: {hami}: the refusal says why: {said}"
        );
        assert_eq!(
            snapshot(&node.vgpu_dir),
            before,
            "--hami: {hami}: nothing changed"
        );
    }
    let out = install_hook(&node, &["--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stdout));

    // HAMi's containers keep working across two restarts.
    for restart in ["first", "second"] {
        node.device_plugin_start();
        assert_runs_hami(&mut node, &gpu, &exe, &format!("{restart} restart"));
    }

    // vgpu's library at the unversioned name (as an older vgpu installed
    // it): `--check` says it is not served, and rightly so, since the next
    // restart rewrites it under the process that mapped it.
    let tmp = node.vgpu_dir.join(".vgpu-by-hand");
    std::fs::copy(dist::hook_lib(), &tmp).unwrap();
    std::fs::rename(&tmp, node.vgpu_dir.join("libvgpu.so")).unwrap();
    for hami in [true, false] {
        let out = hook_cmd(&node, hami, &["--check"]).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(4),
            "--hami: {hami}: {}",
            text(&out.stdout)
        );
        assert!(
            text(&out.stdout).contains("in place"),
            "--hami: {hami}: {}",
            text(&out.stdout)
        );
    }
    let running = Mapped::new(&node.lib_path());
    node.device_plugin_start();
    assert!(
        !running.unchanged(),
        "HAMi 2.4's restart rewrote the mapped library: exit 4 was right"
    );
    drop(running);
    let _ = std::fs::remove_dir_all(&node.root);
}

/// Issue #41: HAMi 2.4 (HAMi 678eaf0, tag v2.4.1: the chart's
/// templates/device-plugin/daemonsetnvidia.yaml, postStart `cp -f
/// /k8s-vgpu/lib/nvidia/* <gpuHookPath>/vgpu/`, the image's `lib/nvidia/`
/// holding `ld.so.preload` and the `libvgpu.so` `docker/Dockerfile` adds)
/// whose device plugin has started but allocated nothing: no `containers/`
/// yet, only HAMi's unversioned library and `ld.so.preload`. A plain
/// install-hook used to take this for a node without HAMi and overwrite
/// HAMi's library; now it refuses, saying what it found and what to do,
/// `--check` names the host, and only `--force` installs (and uninstall
/// puts HAMi's library back).
#[test]
fn hami_2_4_node_before_its_first_pod_keeps_its_library_without_force() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let mut node = Node::new("v2.4-idle", Gen::V2_4);
    let exe = dist::compile_c("demo_workload", &node.root, false);
    node.device_plugin_start();
    assert!(!node.vgpu_dir.join("containers").exists());
    let hami_lib = std::fs::read(node.versioned()).unwrap();

    let before = snapshot(&node.vgpu_dir);
    let out = hook_cmd(&node, false, &[]).output().unwrap();
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        !out.status.success(),
        "plain install-hook on an idle HAMi 2.4 node: {said}"
    );
    assert!(
        said.contains("HAMi 2.4 or earlier")
            && said.contains("in place")
            && said.contains("--force"),
        "the refusal names the host and the way on: {said}"
    );
    assert_eq!(snapshot(&node.vgpu_dir), before, "nothing changed");

    let out = hook_cmd(&node, false, &["--check"]).output().unwrap();
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("HAMi 2.4 or earlier, or Volcano") && said.contains("--force"),
        "--check names the host and what to do: {said}"
    );

    // The operator's word: installed, with the warning, and served until
    // the next restart; uninstall puts HAMi's library back.
    let out = sh(&mut hook_cmd(&node, false, &["--force"]));
    assert!(
        text(&out.stdout).contains("drained"),
        "{}",
        text(&out.stdout)
    );
    assert_runs_vgpu(&mut node, &gpu, &exe, "after install-hook --force");
    uninstall(&node);
    assert_eq!(std::fs::read(node.versioned()).unwrap(), hami_lib);
    assert_runs_hami(&mut node, &gpu, &exe, "after uninstall");
    let _ = std::fs::remove_dir_all(&node.root);
}

/// Issue #41: a Volcano vGPU node. install-hook tells it from HAMi 2.4 by
/// the region directories only Volcano makes (`vgpu/containers/`), refuses
/// without `--force` (its start `cp -f`s HAMi-core over the host file in
/// place, as 2.4 does), and with it installs: a container runs under vgpu's
/// hook with Volcano's environment (the factor-scaled limit, the region in
/// `/tmp/vgpu`), a container whose spec has `CUDA_DISABLE_CONTROL` (any
/// value) gets no control, the keeper puts vgpu's library back after a
/// device-plugin restart (whose in-place copy is the hazard `--force`
/// accepts), and uninstall gives Volcano its library back.
#[test]
fn volcano_node_installs_with_force_runs_vgpu_and_uninstalls() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let mut node = Node::new("volcano", Gen::Volcano);
    let exe = dist::compile_c("demo_workload", &node.root, false);
    node.device_plugin_start();
    assert_runs_hami(&mut node, &gpu, &exe, "Volcano before vgpu");
    let volcano_lib = std::fs::read(node.versioned()).unwrap();
    let volcano_preload = std::fs::read(node.vgpu_dir.join("ld.so.preload")).unwrap();

    refused_without_force(&node, "Volcano's vGPU device plugin");

    let out = sh(&mut hook_cmd(&node, false, &["--force"]));
    assert!(
        text(&out.stdout).contains("Volcano") && text(&out.stdout).contains("drained"),
        "{}",
        text(&out.stdout)
    );
    let out = hook_cmd(&node, false, &["--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stdout));
    assert_runs_vgpu(&mut node, &gpu, &exe, "after install-hook --force");

    // CUDA_DISABLE_CONTROL, whatever its value: no preload, no hook.
    for value in ["true", "false", ""] {
        let a = node.allocate_volcano("free", Some(value));
        let out = node.run(&a, &gpu, &exe);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{value:?}: {stdout}{stderr}");
        assert!(
            !stderr.contains(VGPU_SAYS) && !stderr.contains(STANDIN_SAYS),
            "CUDA_DISABLE_CONTROL={value:?}: no hook loaded: {stderr}"
        );
        assert!(!stdout.contains("total 256 MiB"), "{value:?}: {stdout}");
    }

    restart_kept_then_uninstalled(
        &mut node,
        (&gpu, &exe),
        ("Volcano's", assert_runs_vgpu),
        (&volcano_lib, &volcano_preload),
    );
    let _ = std::fs::remove_dir_all(&node.root);
}

/// Issue #41: `vgpu daemon` finds and labels the regions of a Volcano node
/// (`<HOOK_PATH>/vgpu/containers/<podUID>_<ctr>/`, with `HOOK_PATH` the
/// host directory the DaemonSet mounts), beside HAMi's root, as its default
/// `--regions-root` pair does on a node (here under the emulated node's
/// host directory).
#[test]
fn the_daemon_labels_regions_under_volcanos_layout() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let mut node = Node::new("volcano-daemon", Gen::Volcano);
    let exe = dist::compile_c("demo_workload", &node.root, false);
    node.device_plugin_start();
    sh(&mut hook_cmd(&node, false, &["--force"]));
    let a = node.allocate("trainer");
    let out = node.run(&a, &gpu, &exe);
    assert!(
        out.status.success() && text(&out.stderr).contains(VGPU_SAYS),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let dir = a.region.parent().unwrap().file_name().unwrap();
    let (pod_uid, _) = dir.to_str().unwrap().split_once('_').unwrap();

    let work = vgpu_tests::daemon::Workdir::new("vgpu-volcano-", &["state"]);
    let volcano_root = node.vgpu_dir.join("vgpu/containers");
    let daemon = work.start_daemon(
        &gpu,
        &work.path("state"),
        &node.vgpu_dir.join("containers"),
        &["--regions-root", volcano_root.to_str().unwrap()],
    );
    let want = format!("pod_uid=\"{pod_uid}\"");
    eventually(
        Duration::from_secs(10),
        "the Volcano container's region in /metrics",
        || daemon.metrics().contains(&want),
    );
    let metrics = daemon.metrics();
    let limit = metrics
        .lines()
        .find(|l| l.starts_with("hami_vgpu_memory_limit_bytes{") && l.contains(&want))
        .unwrap_or_else(|| panic!("no limit series for {pod_uid}: {metrics}"));
    assert!(
        limit.contains("container=\"trainer\"") && limit.ends_with(&(256u64 << 20).to_string()),
        "the region's limit, labelled with its pod and container: {limit}"
    );
    drop(daemon);
    let _ = std::fs::remove_dir_all(&node.root);
}

/// A fractional pod on a KAI node ran under vgpu's hook: its log lines, the
/// limit KAI's binder set (no device index), and the region where HAMi-core
/// puts it when only the webhook's three variables say where.
fn assert_kai_runs_vgpu(node: &mut Node, gpu: &SimGpu, exe: &Path, when: &str) {
    let a = node.allocate("main");
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
        "{when}: the hook reports KAI's limit: {stdout}"
    );
    let region = RegionFile::open(&a.region, Access::ReadOnly)
        .unwrap_or_else(|e| panic!("{when}: region {}: {e:?}", a.region.display()));
    let r = region.region();
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(r.limit[0].load(SeqCst), 256 << 20, "{when}");
    assert_eq!(r.sm_limit[0].load(SeqCst), 50, "{when}");
}

/// Issue #41: a node of KAI's resource isolator. install-hook tells it by
/// the sticky `containers/` its libsync makes, refuses without `--force`
/// (its start `cp -f`s HAMi-core over the host file in place) naming it,
/// and warns that KAI mounts the directory read-write into pods; with
/// `--force` a fractional pod runs under vgpu's hook with KAI's environment
/// (the region in `containers/<POD_UID>_<CONTAINER_NAME>/usage.cache`, made
/// by the hook), a pod KAI leaves alone gets no hook, the keeper puts vgpu's
/// library back after an isolator restart, and uninstall gives KAI its
/// library back.
#[test]
fn kai_isolator_node_installs_with_force_runs_vgpu_and_uninstalls() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let mut node = Node::new("kai", Gen::Kai);
    let exe = dist::compile_c("demo_workload", &node.root, false);
    node.device_plugin_start();
    assert_runs_hami(&mut node, &gpu, &exe, "KAI before vgpu");
    let kai_lib = std::fs::read(node.versioned()).unwrap();
    let kai_preload = std::fs::read(node.vgpu_dir.join("ld.so.preload")).unwrap();

    refused_without_force(&node, "KAI's resource isolator");

    let out = sh(&mut hook_cmd(&node, false, &["--force"]));
    let said = text(&out.stdout);
    assert!(
        said.contains("KAI") && said.contains("drained") && said.contains("read-write"),
        "{said}"
    );
    let out = hook_cmd(&node, false, &["--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stdout));
    assert_kai_runs_vgpu(&mut node, &gpu, &exe, "after install-hook --force");

    // A pod with no gpu-fraction / gpu-memory: KAI injects nothing.
    let a = node.allocate_kai("plain", false);
    let out = node.run(&a, &gpu, &exe);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        !stderr.contains(VGPU_SAYS) && !stderr.contains(STANDIN_SAYS),
        "a pod KAI leaves alone loads no hook: {stderr}"
    );
    assert!(!a.region.exists(), "and makes no region");

    restart_kept_then_uninstalled(
        &mut node,
        (&gpu, &exe),
        ("the isolator's", assert_kai_runs_vgpu),
        (&kai_lib, &kai_preload),
    );
    let _ = std::fs::remove_dir_all(&node.root);
}

/// Issue #41: `vgpu daemon` finds and labels a KAI pod's region
/// (`<mount>/containers/<POD_UID>_<CONTAINER_NAME>/usage.cache`, made by
/// vgpu's hook) under the default root it shares with HAMi.
#[test]
fn the_daemon_labels_regions_under_kais_layout() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let mut node = Node::new("kai-daemon", Gen::Kai);
    let exe = dist::compile_c("demo_workload", &node.root, false);
    node.device_plugin_start();
    sh(&mut hook_cmd(&node, false, &["--force"]));
    let a = node.allocate("trainer");
    let out = node.run(&a, &gpu, &exe);
    assert!(
        out.status.success() && text(&out.stderr).contains(VGPU_SAYS) && a.region.is_file(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let dir = a.region.parent().unwrap().file_name().unwrap();
    let (pod_uid, _) = dir.to_str().unwrap().split_once('_').unwrap();

    let work = vgpu_tests::daemon::Workdir::new("vgpu-kai-", &["state"]);
    let daemon = work.start_daemon(
        &gpu,
        &work.path("state"),
        &node.vgpu_dir.join("containers"),
        &[],
    );
    let want = format!("pod_uid=\"{pod_uid}\"");
    eventually(
        Duration::from_secs(10),
        "the KAI container's region in /metrics",
        || daemon.metrics().contains(&want),
    );
    let metrics = daemon.metrics();
    let limit = metrics
        .lines()
        .find(|l| l.starts_with("hami_vgpu_memory_limit_bytes{") && l.contains(&want))
        .unwrap_or_else(|| panic!("no limit series for {pod_uid}: {metrics}"));
    assert!(
        limit.contains("container=\"trainer\"") && limit.ends_with(&(256u64 << 20).to_string()),
        "the region's limit, labelled with its pod and container: {limit}"
    );
    // A live KAI process names no cache file: the daemon finds its region
    // by KAI's rule, from the process's own environment and root, so it
    // is no `no_region` or `untracked` finding (NVML lists it: the
    // containers load the simulator's libcuda, not the daemon's copy).
    let hold = dist::compile_c("hook_mem", &node.root, false);
    let b = node.allocate_kai("server", true);
    let (mut cmd, scratch) = node.container(&b, &gpu, &hold, &["hold", "1048576"]);
    let mut live = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("a KAI container holding memory");
    let (b_dir, _) = b
        .region
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .split_once('_')
        .unwrap();
    let b_want = format!("pod_uid=\"{b_dir}\"");
    eventually(
        Duration::from_secs(10),
        "the live KAI container's region in /metrics",
        || daemon.metrics().contains(&b_want),
    );
    // A control: a pod KAI leaves alone, unhooked, is a finding once past
    // the daemon's slot grace, so the daemon does judge these processes.
    let c = node.allocate_kai("plain", false);
    let (mut cmd, c_scratch) = node.container(&c, &gpu, &hold, &["hold", "1048576"]);
    let mut plain = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("an unhooked container holding memory");
    std::thread::sleep(Duration::from_secs(5));
    let findings = daemon.findings();
    for p in [&mut live, &mut plain] {
        drop(p.stdin.take());
        let _ = p.wait();
    }
    let _ = std::fs::remove_dir(&scratch);
    let _ = std::fs::remove_dir(&c_scratch);
    // The control alone: without KAI's rule the daemon would look for the
    // hooked process's region where the control's is not either.
    assert!(
        findings.len() == 1
            && findings[0]["kind"] == "no_region"
            && findings[0]["comm"] == "hook_mem",
        "one finding, the unhooked control's; a KAI process under vgpu's hook is none: \
         {findings:#?}\n{}",
        daemon.log_text()
    );
    drop(daemon);
    let _ = std::fs::remove_dir_all(&node.root);
}
