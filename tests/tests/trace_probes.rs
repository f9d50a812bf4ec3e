//! `vgpu trace` end to end (root): real uprobes on a small libcuda that
//! exports every probed entry point, called by a program inside a PID
//! namespace and a child cgroup ("container").
//!
//! The library is built per test in a temp dir (its own inode), so tests
//! running in parallel do not see each other's calls.

use std::{
    collections::HashMap,
    ffi::OsStr,
    io::{BufRead as _, BufReader, Read as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use serde_json::Value;
use vgpu_tests::{container::Cgroup, dist};

/// A libcuda stand-in: every probed entry point, each a distinct function.
const FAKE_LIBCUDA: &str = r#"
#include <stddef.h>
#include <stdint.h>
typedef uint64_t CUdeviceptr;
typedef struct { unsigned g[3], b[3], sh; void *stream; void *attrs; unsigned nattrs; } CUlaunchConfig;
static uint64_t next_ptr = 0x7f0000000000ull, next_handle = 0xabc000;
static volatile unsigned long long hits[32];
static CUdeviceptr bump(size_t n) { CUdeviceptr p = next_ptr; next_ptr += (n + 255) & ~255ull; return p; }
int cuInit(unsigned f) { (void)f; return 0; }
int cuMemAlloc_v2(CUdeviceptr *p, size_t n) { hits[0]++; if (!n) return 1; *p = bump(n); return 0; }
int cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    hits[1]++; (void)e; *pitch = (w + 511) & ~(size_t)511; *p = bump(*pitch * h); return 0; }
int cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { hits[2]++; (void)f; *p = bump(n); return 0; }
int cuMemFree_v2(CUdeviceptr p) { hits[3]++; (void)p; return 0; }
int cuMemAllocAsync(CUdeviceptr *p, size_t n, void *s) { hits[4]++; (void)s; *p = bump(n); return 0; }
int cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, void *s) { hits[5]++; (void)s; *p = bump(n); return 0; }
int cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, void *pool, void *s) { hits[6]++; (void)pool; (void)s; *p = bump(n); return 0; }
int cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, void *pool, void *s) { hits[7]++; (void)pool; (void)s; *p = bump(n); return 0; }
int cuMemFreeAsync(CUdeviceptr p, void *s) { hits[8]++; (void)p; (void)s; return 0; }
int cuMemFreeAsync_ptsz(CUdeviceptr p, void *s) { hits[9]++; (void)p; (void)s; return 0; }
int cuMemCreate(uint64_t *h, size_t n, const void *prop, unsigned long long f) { hits[10]++; (void)n; (void)prop; (void)f; *h = next_handle++; return 0; }
int cuMemRelease(uint64_t h) { hits[11]++; (void)h; return 0; }
#define LAUNCH(name, i) int name(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
    unsigned sh, void *s, void **pa, void **ex) { hits[i]++; (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; \
    (void)bz; (void)sh; (void)s; (void)pa; (void)ex; return 0; }
LAUNCH(cuLaunchKernel, 12)
LAUNCH(cuLaunchKernel_ptsz, 13)
#define COOP(name, i) int name(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
    unsigned sh, void *s, void **pa) { hits[i]++; (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; \
    (void)bz; (void)sh; (void)s; (void)pa; return 0; }
COOP(cuLaunchCooperativeKernel, 14)
COOP(cuLaunchCooperativeKernel_ptsz, 15)
int cuLaunchKernelEx(const CUlaunchConfig *c, void *f, void **p, void **e) { hits[16]++; (void)c; (void)f; (void)p; (void)e; return 0; }
int cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, void *f, void **p, void **e) { hits[17]++; (void)c; (void)f; (void)p; (void)e; return 0; }
int cuGraphLaunch(void *g, void *s) { hits[18]++; (void)g; (void)s; return 0; }
int cuGraphLaunch_ptsz(void *g, void *s) { hits[19]++; (void)g; (void)s; return 0; }
"#;

/// Waits for a line on stdin, then makes a known set of calls:
/// launch entry point i (0..8, in [`LAUNCH_FUNCS`] order) is called (i+1)*N
/// times with function 0x1000+i, grid (i+1,2,3), block (32(i+1),1,1),
/// shared memory 16i, stream 0x500+i; then the allocations and frees of
/// [`allocs`].
const PROGRAM: &str = r#"
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
typedef uint64_t CUdeviceptr;
typedef struct { unsigned g[3], b[3], sh; void *stream; void *attrs; unsigned nattrs; } CUlaunchConfig;
int cuInit(unsigned);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
int cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
int cuMemFree_v2(CUdeviceptr);
int cuMemAllocAsync(CUdeviceptr *, size_t, void *);
int cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, void *);
int cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, void *, void *);
int cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, void *, void *);
int cuMemFreeAsync(CUdeviceptr, void *);
int cuMemFreeAsync_ptsz(CUdeviceptr, void *);
int cuMemCreate(uint64_t *, size_t, const void *, unsigned long long);
int cuMemRelease(uint64_t);
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
typedef int (*coop_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
int cuLaunchKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
int cuLaunchCooperativeKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **);
int cuLaunchCooperativeKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **);
int cuLaunchKernelEx(const CUlaunchConfig *, void *, void **, void **);
int cuLaunchKernelEx_ptsz(const CUlaunchConfig *, void *, void **, void **);
int cuGraphLaunch(void *, void *);
int cuGraphLaunch_ptsz(void *, void *);

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1;
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    cuInit(0);
    for (int i = 0; i < 8; i++) {
        void *f = (void *)(uintptr_t)(0x1000 + i), *s = (void *)(uintptr_t)(0x500 + i);
        unsigned gx = i + 1, bx = 32 * (i + 1), sh = 16 * i;
        CUlaunchConfig c = { {gx, 2, 3}, {bx, 1, 1}, sh, s, 0, 0 };
        for (long k = 0; k < (i + 1) * n; k++) {
            switch (i) {
            case 0: cuLaunchKernel(f, gx, 2, 3, bx, 1, 1, sh, s, 0, 0); break;
            case 1: cuLaunchKernel_ptsz(f, gx, 2, 3, bx, 1, 1, sh, s, 0, 0); break;
            case 2: cuLaunchKernelEx(&c, f, 0, 0); break;
            case 3: cuLaunchKernelEx_ptsz(&c, f, 0, 0); break;
            case 4: cuLaunchCooperativeKernel(f, gx, 2, 3, bx, 1, 1, sh, s, 0); break;
            case 5: cuLaunchCooperativeKernel_ptsz(f, gx, 2, 3, bx, 1, 1, sh, s, 0); break;
            case 6: cuGraphLaunch(f, s); break;
            case 7: cuGraphLaunch_ptsz(f, s); break;
            }
        }
    }
    CUdeviceptr a, bad, pitch_p, man, as1, as2, po1, po2;
    size_t pitch;
    uint64_t h;
    cuMemAlloc_v2(&a, 1 << 20);
    if (cuMemAlloc_v2(&bad, 0) != 1) return 3;
    cuMemAllocPitch_v2(&pitch_p, &pitch, 1000, 4, 4);
    cuMemAllocManaged(&man, 4096, 1);
    cuMemAllocAsync(&as1, 8192, (void *)0x77);
    cuMemAllocAsync_ptsz(&as2, 8192, (void *)0x78);
    cuMemAllocFromPoolAsync(&po1, 16384, (void *)0x90, (void *)0x79);
    cuMemAllocFromPoolAsync_ptsz(&po2, 16384, (void *)0x91, (void *)0x7a);
    cuMemCreate(&h, 2 << 20, 0, 0);
    cuMemFree_v2(a);
    cuMemFreeAsync(as1, (void *)0x77);
    cuMemFreeAsync_ptsz(as2, (void *)0x78);
    cuMemRelease(h);

    return 0;
}
"#;

/// Launch entry points in the program's order.
const LAUNCH_FUNCS: [&str; 8] = [
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
];

/// (entry point, bytes, result) of each allocation/free call, in order.
fn allocs() -> Vec<(&'static str, u64, u64)> {
    vec![
        ("cuMemAlloc_v2", 1 << 20, 0),
        ("cuMemAlloc_v2", 0, 1),
        ("cuMemAllocPitch_v2", 1024 * 4, 0),
        ("cuMemAllocManaged", 4096, 0),
        ("cuMemAllocAsync", 8192, 0),
        ("cuMemAllocAsync_ptsz", 8192, 0),
        ("cuMemAllocFromPoolAsync", 16384, 0),
        ("cuMemAllocFromPoolAsync_ptsz", 16384, 0),
        ("cuMemCreate", 2 << 20, 0),
        ("cuMemFree_v2", 1 << 20, 0),
        ("cuMemFreeAsync", 8192, 0),
        ("cuMemFreeAsync_ptsz", 8192, 0),
        ("cuMemRelease", 2 << 20, 0),
    ]
}

/// Bytes still held after the program: pitch + managed + two pool allocations.
const HELD: u64 = 4096 + 4096 + 16384 + 16384;

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    /// Builds the library and the program in a fresh, world-readable temp dir.
    fn new() -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("vgpu-trace-")
            .tempdir()
            .expect("tempdir");
        std::fs::write(dir.path().join("fake.c"), FAKE_LIBCUDA).unwrap();
        std::fs::write(dir.path().join("prog.c"), PROGRAM).unwrap();
        cc(
            &[
                "-shared",
                "-fPIC",
                "-O0",
                "-Wall",
                "-Werror",
                "-o",
                "libcuda.so.1",
                "fake.c",
            ],
            dir.path(),
        );
        cc(
            &[
                "-O0",
                "-Wall",
                "-Werror",
                "-o",
                "prog",
                "prog.c",
                "-L.",
                "-l:libcuda.so.1",
                "-Wl,-rpath,$ORIGIN",
            ],
            dir.path(),
        );
        Command::new("chmod")
            .args(["-R", "a+rX"])
            .arg(dir.path())
            .status()
            .unwrap();
        Fixture { dir }
    }

    fn lib(&self) -> PathBuf {
        self.dir.path().join("libcuda.so.1")
    }

    fn prog(&self) -> PathBuf {
        self.dir.path().join("prog")
    }
}

fn cc(args: &[&str], dir: &Path) {
    let out = Command::new("cc")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running `vgpu trace`.
struct Trace {
    child: Child,
    stderr: mpsc::Receiver<String>,
    /// What it wrote before its probes were attached.
    early: Vec<String>,
}

impl Trace {
    /// Starts `vgpu trace --libcuda LIB ARGS` and waits until its probes are attached.
    fn start(lib: &Path, args: &[&str]) -> Trace {
        let mut child = Command::new(dist::vgpu_bin())
            .arg("trace")
            .arg("--libcuda")
            .arg(lib)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn vgpu trace");
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(l) if l.contains("Ctrl-C to stop") => break,
                Ok(l) => seen.push(l),
                Err(_) => {
                    let _ = child.kill();
                    panic!("vgpu trace did not attach: {seen:#?}");
                }
            }
        }
        Trace {
            child,
            stderr: rx,
            early: seen,
        }
    }

    /// Stops it (SIGINT) if still running and returns (stdout, stderr).
    fn finish(self) -> (String, String) {
        std::thread::sleep(Duration::from_millis(200));
        let _ = Command::new("kill")
            .arg("-INT")
            .arg(self.child.id().to_string())
            .status();
        self.wait()
    }

    /// Waits for it to exit by itself and returns (stdout, stderr).
    fn wait(mut self) -> (String, String) {
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let status = self.child.wait().unwrap();
        let mut err = std::mem::take(&mut self.early);
        err.extend(self.stderr.try_iter());
        let err = err.join("\n");
        assert!(status.success(), "vgpu trace failed: {status}\n{err}");
        (out, err)
    }
}

/// Runs the program `n` in a fresh container and returns (host pid, cgroup).
fn run_in_container(fx: &Fixture, cg: &Cgroup, n: u32) -> u32 {
    let mut p = cg.spawn(&[fx.prog().as_os_str(), OsStr::new(&n.to_string())], &[]);
    let host_pid = p.host_pid();
    p.send_line("go");
    assert!(p.wait().success());
    host_pid
}

fn parse_json(out: &str) -> Vec<Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

#[test]
fn trace_json_reports_host_and_namespace_ids() {
    let fx = Fixture::new();
    let cg = Cgroup::unique("ids");
    let trace = Trace::start(&fx.lib(), &["--json"]);
    let mut p = cg.spawn(&[fx.prog().as_os_str(), OsStr::new("1")], &[]);
    let host_pid = p.host_pid();
    let pidns = p.pidns_inum();
    p.send_line("go");
    assert!(p.wait().success());
    let (out, err) = trace.finish();
    let events = parse_json(&out);
    assert!(err.contains("lost events: 0"), "{err}");
    let mine: Vec<&Value> = events
        .iter()
        .filter(|e| e["host_tgid"] == host_pid)
        .collect();
    assert!(
        !mine.is_empty(),
        "no events from host pid {host_pid}: {out}"
    );
    for e in &mine {
        assert_eq!(e["host_pid"], host_pid, "{e}");
        assert_eq!(e["ns_tgid"], 1, "{e}");
        assert_eq!(e["ns_pid"], 1, "{e}");
        assert_eq!(e["pidns_inum"], pidns, "{e}");
        assert_eq!(e["cgroup_id"], cg.id(), "{e}");
        assert_eq!(e["cgroup"], cg.rel(), "{e}");
        assert_eq!(e["comm"], "prog", "{e}");
        assert!(e["ts_ns"].as_u64().unwrap() > 0);
    }
    let alloc = mine
        .iter()
        .find(|e| e["func"] == "cuMemAlloc_v2" && e["result"] == 0)
        .expect("cuMemAlloc_v2 event");
    assert_eq!(alloc["args"]["bytesize"], 1 << 20);
    assert_eq!(alloc["args"]["dptr"], "0x7f0000000000");
    assert_eq!(alloc["result_name"], "CUDA_SUCCESS");
    let failed = mine
        .iter()
        .find(|e| e["func"] == "cuMemAlloc_v2" && e["result"] == 1)
        .expect("failed cuMemAlloc_v2 event");
    assert_eq!(failed["args"]["bytesize"], 0);
    let launch = mine
        .iter()
        .find(|e| e["func"] == "cuLaunchKernel")
        .expect("cuLaunchKernel event");
    assert_eq!(launch["args"]["function"], "0x1000");
    assert_eq!(launch["args"]["grid"], serde_json::json!([1, 2, 3]));
    assert_eq!(launch["args"]["block"], serde_json::json!([32, 1, 1]));
    assert_eq!(launch["args"]["shared_mem_bytes"], 0);
    assert_eq!(launch["args"]["stream"], "0x500");
    assert_eq!(launch["result"], 0);
    let ex = mine
        .iter()
        .find(|e| e["func"] == "cuLaunchKernelEx_ptsz")
        .expect("cuLaunchKernelEx_ptsz event");
    assert_eq!(ex["args"]["grid"], serde_json::json!([4, 2, 3]));
    assert_eq!(ex["args"]["block"], serde_json::json!([128, 1, 1]));
    assert_eq!(ex["args"]["shared_mem_bytes"], 48);
    assert_eq!(ex["args"]["stream"], "0x503");
}

/// On this kernel (6.6 or later) the probes are uprobe_multi links.
#[test]
fn trace_json_counts_every_entry_point_exactly() {
    json_counts_every_entry_point(&[], "probes attach as uprobe_multi links");
}

/// The same with perf-event uprobes, the path of kernels before 6.6.
#[test]
fn trace_json_counts_every_entry_point_exactly_with_perf_uprobes() {
    json_counts_every_entry_point(&["--perf-uprobes"], "perf-event uprobes, as asked");
}

fn json_counts_every_entry_point(extra: &[&str], attached_as: &str) {
    const N: u32 = 25;
    let fx = Fixture::new();
    let cg = Cgroup::unique("json-counts");
    let mut args = vec!["--json", "-v"];
    args.extend_from_slice(extra);
    let trace = Trace::start(&fx.lib(), &args);
    let host_pid = run_in_container(&fx, &cg, N);
    let (out, err) = trace.finish();
    assert!(err.contains("lost events: 0"), "{err}");
    assert!(err.contains(attached_as), "{err}");
    let events = parse_json(&out);
    let mut per_func: HashMap<String, u64> = HashMap::new();
    for e in events.iter().filter(|e| e["host_tgid"] == host_pid) {
        *per_func
            .entry(e["func"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    for (i, f) in LAUNCH_FUNCS.iter().enumerate() {
        assert_eq!(
            per_func.get(*f).copied(),
            Some(u64::from(N) * (i as u64 + 1)),
            "{f}: {per_func:?}"
        );
    }
    let mut want: HashMap<&str, u64> = HashMap::new();
    for (f, _, _) in allocs() {
        *want.entry(f).or_default() += 1;
    }
    for (f, n) in want {
        assert_eq!(per_func.get(f).copied(), Some(n), "{f}: {per_func:?}");
    }
    // Sizes and results of the allocation/free calls, in call order.
    let mem: Vec<&Value> = events
        .iter()
        .filter(|e| e["host_tgid"] == host_pid && e["func"].as_str().unwrap().starts_with("cuMem"))
        .collect();
    for (e, (f, bytes, result)) in mem.iter().zip(allocs()) {
        assert_eq!(e["func"], f, "{e}");
        assert_eq!(e["result"], result, "{e}");
        let args = &e["args"];
        let got = ["bytesize", "bytes", "size"]
            .iter()
            .find_map(|k| args[*k].as_u64())
            .unwrap();
        assert_eq!(got, bytes, "{e}");
    }
}

/// The last table of the default view: (process row columns, kernel lines).
fn last_table(out: &str, host_pid: u32) -> (Vec<String>, Vec<String>) {
    let start = out.rfind("vgpu trace ").expect("a table");
    let table = &out[start..];
    assert!(table.lines().next().unwrap().contains("final"), "{table}");
    let mut row = None;
    let mut kernels = Vec::new();
    let mut in_row = false;
    for l in table.lines().skip(2) {
        let cols: Vec<String> = l.split_whitespace().map(str::to_owned).collect();
        if cols.first().map(String::as_str) == Some("kernel") {
            if in_row {
                kernels.push(l.trim().to_owned());
            }
            continue;
        }
        in_row = cols.first() == Some(&host_pid.to_string());
        if in_row {
            row = Some(cols);
        }
    }
    (
        row.unwrap_or_else(|| panic!("no row for {host_pid}: {table}")),
        kernels,
    )
}

#[test]
fn trace_table_counts_every_entry_point_exactly() {
    const N: u32 = 2000;
    let fx = Fixture::new();
    let cg = Cgroup::unique("table");
    let trace = Trace::start(&fx.lib(), &["--interval", "0.5", "--top", "10"]);
    let host_pid = run_in_container(&fx, &cg, N);
    let (out, err) = trace.finish();
    assert!(err.contains("lost events: 0"), "{err}");
    let (row, kernels) = last_table(&out, host_pid);
    // PID NSPID CGROUP CONTAINER COMM LAUNCH/s GRAPH/s LAUNCHES GRAPHS ALLOCS FREES HELD_BYTES
    assert_eq!(row[1], "1", "{row:?}");
    assert_eq!(row[2], cg.id().to_string(), "{row:?}");
    assert_eq!(row[4], "prog", "{row:?}");
    assert_eq!(row[7], (21 * N).to_string(), "launches {row:?}");
    assert_eq!(row[8], (15 * N).to_string(), "graph launches {row:?}");
    assert_eq!(row[9], "8", "allocs {row:?}");
    assert_eq!(row[10], "4", "frees {row:?}");
    assert_eq!(row[11], HELD.to_string(), "held {row:?}");
    for (i, f) in LAUNCH_FUNCS.iter().enumerate() {
        let (grid, block) = if i < 6 {
            (format!("{}x2x3", i + 1), format!("{}x1x1", 32 * (i + 1)))
        } else {
            ("0x0x0".to_owned(), "0x0x0".to_owned())
        };
        let want = format!(
            "kernel {:#x} {f} grid {grid} block {block} launches {}",
            0x1000 + i,
            N * (i as u32 + 1)
        );
        assert!(kernels.contains(&want), "missing {want:?} in {kernels:#?}");
    }
}

#[test]
fn trace_filters_select_the_process() {
    let fx = Fixture::new();
    let pod = "0f9c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f";
    let cid = "4f1b3c0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";
    let a = Cgroup::unique("filter-a");
    let b = Cgroup::create(&format!(
        "vgpu-test/kubepods-{}/burstable/pod{pod}/{cid}",
        std::process::id()
    ));
    // One trace per filter, all attached before the programs run.
    let by_cgroup_id = Trace::start(&fx.lib(), &["--json", "--cgroup", &b.id().to_string()]);
    let by_cgroup_path = Trace::start(&fx.lib(), &["--json", "--cgroup", &b.rel()]);
    let by_pod = Trace::start(&fx.lib(), &["--json", "--pod", pod]);
    let by_container = Trace::start(&fx.lib(), &["--json", "--container", &cid[..12]]);
    let by_ns_pid = Trace::start(&fx.lib(), &["--json", "--pid", "1"]);
    // A host process (not in a container) and two containers.
    let mut host = Command::new(fx.prog())
        .arg("1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let host_pid = host.id();
    let mut pa = a.spawn(&[fx.prog().as_os_str(), OsStr::new("1")], &[]);
    let mut pb = b.spawn(&[fx.prog().as_os_str(), OsStr::new("1")], &[]);
    let (a_pid, b_pid) = (pa.host_pid(), pb.host_pid());
    let by_host_pid = Trace::start(&fx.lib(), &["--json", "--pid", &a_pid.to_string()]);
    use std::io::Write as _;
    writeln!(host.stdin.as_mut().unwrap(), "go").unwrap();
    pa.send_line("go");
    pb.send_line("go");
    assert!(host.wait().unwrap().success());
    assert!(pa.wait().success());
    assert!(pb.wait().success());

    let pids = |t: Trace| -> Vec<u64> {
        let (out, _) = t.finish();
        let mut p: Vec<u64> = parse_json(&out)
            .iter()
            .map(|e| e["host_tgid"].as_u64().unwrap())
            .collect();
        p.sort_unstable();
        p.dedup();
        p
    };
    let b_only = vec![u64::from(b_pid)];
    assert_eq!(pids(by_cgroup_id), b_only, "--cgroup id");
    assert_eq!(pids(by_cgroup_path), b_only, "--cgroup path");
    assert_eq!(pids(by_pod), b_only, "--pod");
    assert_eq!(pids(by_container), b_only, "--container");
    assert_eq!(pids(by_host_pid), vec![u64::from(a_pid)], "--pid host");
    let ns1 = pids(by_ns_pid);
    let mut want = vec![u64::from(a_pid), u64::from(b_pid)];
    want.sort_unstable();
    assert_eq!(
        ns1, want,
        "--pid 1 selects both namespace PID 1s, not host pid {host_pid}"
    );
}

#[test]
fn trace_without_privileges_says_so_in_one_sentence() {
    let fx = Fixture::new();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(dist::vgpu_bin())
        .arg("trace")
        .arg("--libcuda")
        .arg(fx.lib())
        .arg("--duration")
        .arg("1")
        .output()
        .expect("run setpriv");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("vgpu trace needs root or CAP_BPF+CAP_PERFMON:"),
        "{err}"
    );
}
