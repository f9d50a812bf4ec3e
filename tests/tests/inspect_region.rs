//! `vgpu inspect` against regions written by hooked programs on the
//! simulated GPU, HAMi's directory layout, and counter anomalies. Needs the
//! built artifacts (`cargo xtask build`) and root (liveness reads every
//! process's /proc/<pid>/maps).
#![allow(
    clippy::expect_used,
    reason = "test helpers panic with a message when the test machine misbehaves"
)]

use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering::SeqCst;

use serde_json::Value;
use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::admin_prog::Prog;
use vgpu_tests::dist::vgpu_bin;
use vgpu_tests::hook::HookEnv;

const M: u64 = 1 << 20;
const G: u64 = 1 << 30;
/// The simulated context's default footprint.
const CONTEXT: u64 = 500 * M;

fn inspect(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(vgpu_bin())
        .arg("inspect")
        .args(args)
        .output()
        .expect("run vgpu inspect");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn inspect_json(path: &Path) -> Value {
    let (ok, out, err) = inspect(&[path.to_str().expect("utf-8 path"), "--json"]);
    assert!(ok, "inspect failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("bad JSON ({e}): {out}"))
}

fn slot_of(region: &Value, pid: i32) -> &Value {
    region["slots"]
        .as_array()
        .expect("slots")
        .iter()
        .find(|s| s["pid"] == pid)
        .unwrap_or_else(|| panic!("no slot with pid {pid}: {region:#}"))
}

fn usage0(slot: &Value) -> &Value {
    slot["usage"]
        .as_array()
        .expect("usage")
        .iter()
        .find(|u| u["device"] == 0)
        .unwrap_or_else(|| panic!("no device 0 usage: {slot:#}"))
}

fn kinds(region: &Value) -> Vec<String> {
    region["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Two programs allocate known amounts and wait; inspect --json shows each
/// one's context and data bytes, the container total, the limit, liveness
/// by mapping (no daemon fills hostpid here), and then a dead slot once one
/// is SIGKILLed.
#[test]
fn inspect_json_matches_what_programs_did() {
    let env = HookEnv::new("inspect-json", "2g");
    let exe = env.build("admin_prog");
    let mut a = Prog::start(&env, &exe);
    let mut b = Prog::start(&env, &exe);
    assert_eq!(a.cmd(&format!("alloc {}", 100 * M)), "alloc 0");
    assert_eq!(a.cmd(&format!("alloc {}", 28 * M)), "alloc 0");
    assert_eq!(b.cmd(&format!("alloc {}", 64 * M)), "alloc 0");

    let doc = inspect_json(&env.region_path());
    let region = &doc["regions"][0];
    assert_eq!(doc["errors"], Value::Array(vec![]));
    assert_eq!(region["major_version"], 1);
    assert_eq!(region["minor_version"], 2);
    assert_eq!(region["device_num"], 1);
    assert_eq!(region["proc_num"], 2);
    let dev0 = &region["devices"][0];
    assert_eq!(dev0["index"], 0);
    assert_eq!(dev0["limit_bytes"], 2 * G);
    assert_eq!(dev0["used_bytes"], 2 * CONTEXT + 192 * M);
    assert!(
        dev0["uuid"].as_str().unwrap_or("").starts_with("GPU-"),
        "{dev0}"
    );
    for (p, data) in [(&a, 128 * M), (&b, 64 * M)] {
        let slot = slot_of(region, p.pid);
        let u = usage0(slot);
        assert_eq!(u["context_bytes"], CONTEXT, "{slot:#}");
        assert_eq!(u["module_bytes"], 0, "{slot:#}");
        assert_eq!(u["data_bytes"], data, "{slot:#}");
        assert_eq!(u["total_bytes"], CONTEXT + data, "{slot:#}");
        assert_eq!(slot["status_name"], "running");
        assert_eq!(slot["alive"]["alive"], true, "{slot:#}");
        assert_eq!(slot["alive"]["by"], "mapping", "{slot:#}");
        assert_eq!(slot["alive"]["host_pid"], p.pid, "{slot:#}");
    }
    let k = kinds(region);
    assert!(k.iter().any(|k| k == "hostpid_missing"), "{k:?}");
    assert!(!k.iter().any(|k| k == "dead_slot"), "{k:?}");
    assert_eq!(region["lock"]["held"], false);
    assert_eq!(region["lock"]["owner_pid"], 0);
    assert_eq!(region["utilization_switch"], 1);

    // The human table shows the same numbers.
    let (ok, table, err) = inspect(&[env.region_path().to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    assert!(
        table.contains("500 MiB") && table.contains("628 MiB"),
        "{table}"
    );
    assert!(table.contains("hostpid_missing"), "{table}");

    // SIGKILL: no exit handler runs, the slot stays and is reported dead.
    a.run.kill9();
    let doc = inspect_json(&env.region_path());
    let region = &doc["regions"][0];
    let slot = slot_of(region, a.pid);
    assert_eq!(slot["alive"]["alive"], false, "{slot:#}");
    assert!(kinds(region).iter().any(|k| k == "dead_slot"), "{region:#}");
    // Usage of dead slots still counts (the hook sums nonzero pids).
    assert_eq!(region["devices"][0]["used_bytes"], 2 * CONTEXT + 192 * M);
    drop(b);
}

/// `--root` finds regions in HAMi's `<podUID>_<container>/` directories,
/// names pod and container, skips libvgpu.so files, and reports a foreign
/// `.cache` file as an error (exit 1) without hiding the good ones.
#[test]
fn root_discovers_hami_layout() {
    let env = HookEnv::new("inspect-root", "1g");
    let exe = env.build("admin_prog");
    let mut p = Prog::start(&env, &exe);
    assert_eq!(p.cmd("alloc 1048576"), "alloc 0");
    let root = env.dir.join("containers");
    let pod = "6a1f9a43-2b7e-4c8d-9e0f-123456789abc";
    let ctr = root.join(format!("{pod}_trainer"));
    std::fs::create_dir_all(&ctr).expect("mkdir");
    std::fs::copy(env.region_path(), ctr.join("f00d.cache")).expect("copy");
    std::fs::write(ctr.join("libvgpu.so"), b"ELF").expect("write");
    std::fs::write(ctr.join("libvgpu.so.cache"), b"ignored").expect("write");
    let other = root.join(format!("{pod}_sidecar"));
    std::fs::create_dir_all(&other).expect("mkdir");
    std::fs::write(other.join("junk.cache"), vec![7u8; 4096]).expect("write");

    let out = Command::new(vgpu_bin())
        .args(["inspect", "--json", "--root"])
        .arg(&root)
        .output()
        .expect("run");
    assert!(!out.status.success(), "a foreign file must fail the run");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    let regions = doc["regions"].as_array().expect("regions");
    assert_eq!(regions.len(), 1, "{doc:#}");
    assert_eq!(regions[0]["pod_uid"], pod);
    assert_eq!(regions[0]["container"], "trainer");
    let errors = doc["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1, "{doc:#}");
    assert!(errors[0]["path"]
        .as_str()
        .unwrap_or("")
        .ends_with("junk.cache"));
    assert!(
        errors[0]["error"]
            .as_str()
            .unwrap_or("")
            .contains("not a HAMi shared region"),
        "{doc:#}"
    );
    // A directory as PATH is a root too; the table names the pod.
    let (_, table, _) = inspect(&[root.to_str().expect("utf-8")]);
    assert!(
        table.contains(&format!("pod {pod} container trainer")),
        "{table}"
    );
}

/// Counter anomalies written into a real region are each reported: a free
/// slot with usage, total != sum of the kinds, an underflowed counter, an
/// invalid status, proc_num out of range, and usage over the limit.
#[test]
fn counter_anomalies_are_findings() {
    let env = HookEnv::new("inspect-anomalies", "1g");
    let exe = env.build("admin_prog");
    let mut p = Prog::start(&env, &exe);
    assert_eq!(p.cmd("quit"), "");
    let path = env.region_path();
    {
        let rf = RegionFile::open(&path, Access::ReadWrite).expect("open");
        let r = rf.region();
        // slot 1: freed by a HAMi-core exit (pid 0) with counters left.
        r.procs[1].used[0].data_size.store(5 * M, SeqCst);
        r.procs[1].used[0].total.store(5 * M, SeqCst);
        // slot 2: our own live pid, inconsistent total and an underflow.
        let me = std::process::id() as i32;
        r.procs[2].pid.store(me, SeqCst);
        r.procs[2].hostpid.store(me, SeqCst);
        r.procs[2].status.store(7, SeqCst);
        r.procs[2].used[0].context_size.store(M, SeqCst);
        r.procs[2].used[0].total.store(3 * M, SeqCst);
        r.procs[2].used[0].data_size.store(u64::MAX - 4095, SeqCst);
        r.proc_num.store(3, SeqCst);
        r.limit[0].store(M, SeqCst);
    }
    let doc = inspect_json(&path);
    let k = kinds(&doc["regions"][0]);
    for want in [
        "exited_slot_with_usage",
        "total_mismatch",
        "counter_underflow",
        "invalid_status",
        "over_limit",
    ] {
        assert!(k.iter().any(|k| k == want), "{want} missing from {k:?}");
    }
    {
        let rf = RegionFile::open(&path, Access::ReadWrite).expect("open");
        rf.region().proc_num.store(5000, SeqCst);
    }
    let doc = inspect_json(&path);
    assert!(kinds(&doc["regions"][0])
        .iter()
        .any(|k| k == "proc_num_out_of_range"));
}
