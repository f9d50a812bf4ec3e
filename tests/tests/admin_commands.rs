//! The admin commands (`set-sm-limit`, `set-mem-limit`, `cleanup`,
//! `unlock`, `suspend`, `resume`) against regions used by live hooked
//! programs on the simulated GPU, and bad input that must write nothing.
//! Needs the built artifacts (`cargo xtask build`) and root.
#![allow(
    clippy::expect_used,
    reason = "test helpers panic with a message when the test machine misbehaves"
)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::region::{FILE_SIZE, REGION_SIZE};
use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::admin_prog::Prog;
use vgpu_tests::dist::vgpu_bin;
use vgpu_tests::hook::HookEnv;

const M: u64 = 1 << 20;
const G: u64 = 1 << 30;
const CUDA_ERROR_OUT_OF_MEMORY: &str = "2";

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn vgpu(args: &[&str]) -> Out {
    let out = Command::new(vgpu_bin())
        .args(args)
        .output()
        .expect("run vgpu");
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn region(path: &Path) -> RegionFile {
    RegionFile::open(path, Access::ReadOnly).expect("open region")
}

fn slot_bytes(path: &Path, slot: usize) -> Vec<u8> {
    let all = std::fs::read(path).expect("read region");
    let at = 1856 + slot * 1960;
    all[at..at + 1960].to_vec()
}

fn slot_index(path: &Path, pid: i32) -> usize {
    let rf = region(path);
    let r = rf.region();
    (0..r.proc_count())
        .find(|&i| r.procs[i].pid.load(SeqCst) == pid)
        .unwrap_or_else(|| panic!("no slot for pid {pid}"))
}

/// A running program blocked on stdin is allowed 256 MiB more, then the
/// limit is lowered under it: its next allocation gets OUT_OF_MEMORY; after
/// the limit is raised again it succeeds.
#[test]
fn set_mem_limit_changes_a_running_process() {
    let env = HookEnv::new("admin-mem", "2g");
    let exe = env.build("admin_prog");
    let path = env.region_path();
    let mut p = Prog::start(&env, &exe);
    assert_eq!(p.cmd(&format!("alloc {}", 256 * M)), "alloc 0");

    let out = vgpu(&["set-mem-limit", s(&path), "--device", "0", "600m"]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("2 GiB -> 600 MiB"), "{}", out.stdout);
    assert!(
        out.stdout.contains("already uses 756 MiB"),
        "{}",
        out.stdout
    );
    assert_eq!(region(&path).region().limit[0].load(SeqCst), 600 * M);
    assert_eq!(
        p.cmd(&format!("alloc {}", 64 * M)),
        format!("alloc {CUDA_ERROR_OUT_OF_MEMORY}")
    );

    let out = vgpu(&["set-mem-limit", s(&path), "--all", "1g"]);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(region(&path).region().limit[0].load(SeqCst), G);
    assert_eq!(p.cmd(&format!("alloc {}", 256 * M)), "alloc 0");
    assert_eq!(
        p.cmd(&format!("alloc {}", 64 * M)),
        format!("alloc {CUDA_ERROR_OUT_OF_MEMORY}"),
        "500 MiB context + 512 MiB + 64 MiB is over 1 GiB"
    );
}

/// set-sm-limit writes sm_limit[] of one device or all of them (the SM
/// limiter reads it at runtime; its throughput effect is tested with it).
#[test]
fn set_sm_limit_writes_the_region() {
    let env = HookEnv::new("admin-sm", "1g");
    let exe = env.build("admin_prog");
    let path = env.region_path();
    let _p = Prog::start(&env, &exe);
    let out = vgpu(&["set-sm-limit", s(&path), "--device", "0", "30"]);
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.contains("device 0: SM limit none -> 30%"),
        "{}",
        out.stdout
    );
    assert_eq!(region(&path).region().sm_limit[0].load(SeqCst), 30);
    let out = vgpu(&["set-sm-limit", s(&path), "--all", "none"]);
    assert!(out.ok, "{}", out.stderr);
    // device_num is 1: --all is device 0 only.
    assert_eq!(region(&path).region().sm_limit[0].load(SeqCst), 100);
}

/// A zero would lift the limit (the region's "no limit"): `... --all 0`
/// reads like "allow nothing", so it is refused and the limit stays;
/// removing a limit takes the word `none`.
#[test]
fn removing_a_limit_takes_the_word_none() {
    let env = HookEnv::new("admin-none", "1g");
    let exe = env.build("admin_prog");
    let path = env.region_path();
    let _p = Prog::start(&env, &exe);
    let before = std::fs::read(&path).expect("read");
    for args in [
        ["set-mem-limit", s(&path), "--all", "0"],
        ["set-mem-limit", s(&path), "--all", "0m"],
        ["set-sm-limit", s(&path), "--all", "0"],
    ] {
        let out = vgpu(&args);
        assert!(!out.ok, "{args:?} accepted: {}", out.stdout);
        assert!(
            out.stderr.contains("would remove the limit") && out.stderr.contains("`none`"),
            "{args:?}: {}",
            out.stderr
        );
    }
    assert_eq!(region(&path).region().limit[0].load(SeqCst), G);
    assert_eq!(
        std::fs::read(&path).expect("read"),
        before,
        "a refused zero writes nothing"
    );

    let out = vgpu(&["set-mem-limit", s(&path), "--all", "none"]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("1 GiB -> none"), "{}", out.stdout);
    assert_eq!(region(&path).region().limit[0].load(SeqCst), 0);
}

/// cleanup frees the slots of SIGKILLed programs and nothing else: the live
/// programs' slots are byte-identical afterwards; proc_num drops only over
/// trailing free slots.
#[test]
fn cleanup_removes_only_dead_slots() {
    let env = HookEnv::new("admin-cleanup", "4g");
    let exe = env.build("admin_prog");
    let path = env.region_path();
    let mut a = Prog::start(&env, &exe);
    let mut b = Prog::start(&env, &exe);
    let mut c = Prog::start(&env, &exe);
    for (p, mb) in [(&mut a, 10), (&mut b, 20), (&mut c, 30)] {
        assert_eq!(p.cmd(&format!("alloc {}", mb * M)), "alloc 0");
    }
    let (ia, ib, ic) = (
        slot_index(&path, a.pid),
        slot_index(&path, b.pid),
        slot_index(&path, c.pid),
    );
    assert_eq!((ia, ib, ic), (0, 1, 2));

    let out = vgpu(&["cleanup", s(&path)]);
    assert!(
        out.ok && out.stdout.contains("no dead slots"),
        "{}{}",
        out.stdout,
        out.stderr
    );

    b.run.kill9();
    let before_a = slot_bytes(&path, ia);
    let before_c = slot_bytes(&path, ic);
    // Cleanup frees only slots it can prove dead: when processes exit
    // while it reads every process's mappings (a busy host), it leaves the
    // slot alone and says so, and a later run decides.
    let mut out = vgpu(&["cleanup", s(&path)]);
    for _ in 0..5 {
        if !out.stdout.contains("cannot tell whether its process lives") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        out = vgpu(&["cleanup", s(&path)]);
    }
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout
            .contains(&format!("reclaimed slot 1 of dead pid {}", b.pid)),
        "{}",
        out.stdout
    );
    assert_eq!(slot_bytes(&path, ia), before_a, "live slot a untouched");
    assert_eq!(slot_bytes(&path, ic), before_c, "live slot c untouched");
    assert!(
        slot_bytes(&path, ib).iter().all(|&b| b == 0),
        "dead slot zeroed"
    );
    assert_eq!(
        region(&path).region().proc_num.load(SeqCst),
        3,
        "slot 1 is not trailing"
    );

    c.run.kill9();
    let out = vgpu(&["cleanup", s(&path)]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("proc_num 3 -> 1"), "{}", out.stdout);
    assert_eq!(slot_bytes(&path, ia), before_a, "live slot a untouched");
    assert!(a.alive());
    // The survivor keeps working in its slot.
    assert_eq!(a.cmd(&format!("alloc {}", M)), "alloc 0");
    assert_eq!(
        region(&path).region().procs[0].used[0]
            .data_size
            .load(SeqCst),
        11 * M
    );
}

/// unlock refuses while the lock holder lives (and changes nothing), and
/// after the holder is SIGKILLed it clears owner_pid and resets the
/// HAMi-core semaphore the holder left at 0. cleanup refuses while a live
/// process holds the lock.
#[test]
fn unlock_refuses_while_the_holder_lives_and_recovers_after() {
    let env = HookEnv::new("admin-unlock", "1g");
    let exe = env.build("admin_prog");
    let path = env.region_path();
    let mut user = Prog::start(&env, &exe);
    let mut holder = Prog::start_plain(&env, &exe);
    assert_eq!(holder.cmd(&format!("lock {}", s(&path))), "lock 0");
    {
        let rf = region(&path);
        assert_eq!(rf.region().owner_pid.load(SeqCst), holder.pid as u64);
        assert_eq!(rf.region().sem[0].load(SeqCst), 0);
    }
    let before = std::fs::read(&path).expect("read");
    let out = vgpu(&["unlock", s(&path)]);
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains(&format!("held by live pid {}", holder.pid)),
        "{}",
        out.stderr
    );
    let out2 = vgpu(&["cleanup", s(&path)]);
    assert!(
        !out2.ok && out2.stderr.contains("held by live pid"),
        "{}",
        out2.stderr
    );
    assert_eq!(
        std::fs::read(&path).expect("read"),
        before,
        "refusals write nothing"
    );

    holder.run.kill9();
    let json = vgpu(&["inspect", "--json", s(&path)]);
    assert!(
        json.stdout.contains("\"lock_holder_dead\""),
        "{}",
        json.stdout
    );
    let out = vgpu(&["unlock", s(&path)]);
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.contains("was dead: cleared it"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("semaphore from 0 to 1"),
        "{}",
        out.stdout
    );
    let rf = region(&path);
    assert_eq!(rf.region().owner_pid.load(SeqCst), 0);
    assert_eq!(rf.region().sem[0].load(SeqCst), 1);
    // Nothing left to do; the hooked program still allocates.
    let out = vgpu(&["unlock", s(&path)]);
    assert!(
        out.ok && out.stdout.contains("nothing to do"),
        "{}",
        out.stdout
    );
    assert_eq!(user.cmd(&format!("alloc {}", M)), "alloc 0");
}

/// suspend / resume against programs that handle SIGUSR2 / SIGUSR1 the way
/// HAMi-core does (setting their slot's status): the command waits until
/// the slots report it.
#[test]
fn suspend_and_resume_wait_for_the_slots() {
    let env = HookEnv::new("admin-suspend", "1g");
    let exe = env.build("admin_prog");
    let path = env.region_path();
    let mut a = Prog::start(&env, &exe);
    let mut b = Prog::start(&env, &exe);
    for p in [&mut a, &mut b] {
        let got = p.cmd(&format!("sigs {}", s(&path)));
        assert!(got.starts_with("sigs ") && got != "sigs -1", "{got}");
    }
    let out = vgpu(&["suspend", s(&path), "--timeout", "5"]);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        out.stdout.matches("suspended slot").count(),
        2,
        "{}",
        out.stdout
    );
    assert_eq!(a.cmd("status"), "status 2");
    assert_eq!(b.cmd("status"), "status 2");
    let json = vgpu(&["inspect", "--json", s(&path)]);
    assert_eq!(
        json.stdout
            .matches("\"status_name\": \"suspended\"")
            .count(),
        2,
        "{}",
        json.stdout
    );

    let out = vgpu(&["resume", s(&path), "--timeout", "5"]);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(a.cmd("status"), "status 1");
    assert_eq!(b.cmd("status"), "status 1");
}

/// A process that does not handle SIGUSR2 (here: one that reset the hook's
/// handler) would be killed by it: suspend refuses and signals nobody, not
/// even the processes that would cope.
#[test]
fn suspend_refuses_processes_without_handlers() {
    let env = HookEnv::new("admin-nosig", "1g");
    let exe = env.build("admin_prog");
    let path = env.region_path();
    let mut with = Prog::start(&env, &exe);
    let mut without = Prog::start(&env, &exe);
    assert_ne!(with.cmd(&format!("sigs {}", s(&path))), "sigs -1");
    // The hook installs handlers in every process it registers; this one
    // resets them to the default action, as an application may.
    assert_eq!(without.cmd("nosigs"), "nosigs 0");
    let out = vgpu(&["suspend", s(&path), "--timeout", "2"]);
    assert!(!out.ok);
    assert!(
        out.stderr.contains(&format!("pid {}", without.pid))
            && out.stderr.contains("does not handle SIGUSR2"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(without.alive() && with.alive());
    assert_eq!(with.cmd("status"), "status 1");
}

/// Every bad input fails with one sentence on stderr, exit code non-zero,
/// and the file byte-identical.
#[test]
fn bad_input_writes_nothing() {
    let env = HookEnv::new("admin-bad", "1g");
    let exe = env.build("admin_prog");
    let good = env.region_path();
    let mut p = Prog::start(&env, &exe);
    assert_eq!(p.cmd("quit"), "");
    assert_eq!(region(&good).region().device_num.load(SeqCst), 1);
    let full = std::fs::read(&good).expect("read");
    assert_eq!(full.len() as u64, FILE_SIZE);

    let make = |name: &str, bytes: Vec<u8>| -> PathBuf {
        let p = env.dir.join(name);
        std::fs::write(&p, bytes).expect("write");
        p
    };
    let truncated = make("truncated.cache", full[..REGION_SIZE / 2].to_vec());
    let foreign = make("foreign.cache", vec![0x5a; FILE_SIZE as usize]);
    let empty = make("empty.cache", Vec::new());
    let mut v2 = full.clone();
    v2[4..8].copy_from_slice(&2u32.to_le_bytes());
    let major2 = make("major2.cache", v2);
    let missing = env.dir.join("missing.cache");

    let mut cases: Vec<(Vec<String>, PathBuf, &str)> = Vec::new();
    let files = [
        (&truncated, "shorter than a v1 shared region"),
        (&foreign, "not a HAMi shared region"),
        (&empty, "shorter than a v1 shared region"),
        (&major2, "region version 2.2"),
        (&missing, "cannot open region file"),
    ];
    for (file, want) in files {
        let f = s(file).to_owned();
        for args in [
            vec!["inspect", &f],
            vec!["set-sm-limit", &f, "--all", "50"],
            vec!["set-mem-limit", &f, "--device", "0", "1g"],
            vec!["cleanup", &f],
            vec!["unlock", &f],
            vec!["suspend", &f],
            vec!["resume", &f],
        ] {
            cases.push((
                args.iter().map(|a| a.to_string()).collect(),
                file.clone(),
                want,
            ));
        }
    }
    let g = s(&good).to_owned();
    for (args, want) in [
        (
            vec!["set-sm-limit", &g, "--device", "1", "50"],
            "device 1 is out of range",
        ),
        (
            vec!["set-sm-limit", &g, "--device", "16", "50"],
            "device 16 is out of range",
        ),
        (
            vec!["set-mem-limit", &g, "--device", "3", "1g"],
            "device 3 is out of range",
        ),
        (
            vec!["set-mem-limit", &g, "--all", "1024mb"],
            "is not a size",
        ),
        (vec!["set-mem-limit", &g, "--all", "1.5g"], "is not a size"),
        (vec!["set-mem-limit", &g, "--all", "010m"], "leading zero"),
        (vec!["set-sm-limit", &g, "--all", "101"], "not a percentage"),
        (vec!["set-sm-limit", &g, "--all", "30%"], "not a percentage"),
        (vec!["set-sm-limit", &g, "50"], "--device"),
        (
            vec!["set-sm-limit", &g, "--device", "0", "--all", "50"],
            "cannot be used with",
        ),
    ] {
        cases.push((
            args.iter().map(|a| a.to_string()).collect(),
            good.clone(),
            want,
        ));
    }

    let mut failures = Vec::new();
    for (args, file, want) in cases {
        let before = std::fs::read(&file).ok();
        let out = Command::new(vgpu_bin())
            .args(&args)
            .output()
            .expect("run vgpu");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let after = std::fs::read(&file).ok();
        let bad = if out.status.success() {
            Some("succeeded")
        } else if !stderr.contains(want) {
            Some("wrong message")
        } else if stderr.contains("panicked") || stderr.contains("backtrace") {
            Some("panicked")
        } else if before != after {
            Some("file changed")
        } else if !stderr.starts_with("error:") && stderr.trim().lines().count() != 1 {
            // Ours are one sentence; clap's usage errors ("error: …") add a
            // usage line.
            Some("more than one line")
        } else {
            None
        };
        if let Some(why) = bad {
            failures.push(format!("{args:?}: {why} (want {want:?}): {stderr}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(!missing.exists(), "nothing creates a missing region");
}

/// A process in its own PID namespace has a small `pid` that names another,
/// live process on the host (here 2, the host's kthreadd), and no daemon
/// filled its `hostpid`. inspect finds it alive through its mapping of the
/// region (with its real host PID); once it is killed, cleanup reclaims its
/// slot although host PID 2 lives.
#[test]
fn container_pids_are_judged_by_mapping_not_by_host_pid_of_the_same_number() {
    let env = HookEnv::new("admin-ns", "1g");
    let exe = env.build("admin_prog");
    let path = env.region_path();
    // A hooked process on the host first: it starts the simulated driver's
    // server in the host PID namespace (which is what makes NVML report host
    // PIDs, as the real driver does), and it measures the context and stores
    // the size for the container. The namespaced process then reuses that
    // size instead of learning its host PID from NVML, so no host PID is
    // known for it: the case this test is about.
    let mut warm = Prog::start(&env, &exe);
    assert_eq!(warm.cmd(&format!("alloc {M}")), "alloc 0");
    let _ = writeln!(warm.run.child.stdin.as_mut().expect("stdin"), "quit");
    assert!(warm.run.child.wait().expect("wait").success());
    // A dead process keeps its slot until someone reclaims it, and the
    // namespaced process does not judge another namespace's slots.
    let out = vgpu(&["cleanup", s(&path)]);
    assert!(
        out.stdout
            .contains(&format!("reclaimed slot 0 of dead pid {}", warm.pid)),
        "{}{}",
        out.stdout,
        out.stderr
    );
    let inner = env.hooked(&exe, &[]);
    let mut c = Command::new("unshare");
    c.args([
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "sh",
        "-c",
        "\"$0\"; :",
    ])
    .arg(&exe);
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let mut p = Prog::start_cmd(c, true);
    assert_eq!(p.pid, 2, "sh is pid 1 of the namespace, the program pid 2");
    assert!(Path::new("/proc/2").exists(), "host pid 2 lives");
    assert_eq!(p.cmd(&format!("alloc {}", 8 * M)), "alloc 0");

    let json = vgpu(&["inspect", "--json", s(&path)]);
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
    let slot = &doc["regions"][0]["slots"][0];
    assert_eq!(slot["pid"], 2, "{slot:#}");
    assert_eq!(slot["hostpid"], 0, "{slot:#}");
    assert_eq!(slot["alive"]["alive"], true, "{slot:#}");
    assert_eq!(slot["alive"]["by"], "mapping", "{slot:#}");
    let host_pid = slot["alive"]["host_pid"].as_i64().expect("host pid");
    assert!(host_pid > 2, "{slot:#}");
    let out = vgpu(&["cleanup", s(&path)]);
    assert!(
        out.ok && out.stdout.contains("no dead slots"),
        "{}",
        out.stdout
    );

    // SIGKILL the program itself (no exit handler runs).
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(host_pid as i32, libc::SIGKILL) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while Path::new(&format!("/proc/{host_pid}")).exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = vgpu(&["cleanup", s(&path)]);
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.contains("reclaimed slot 0 of dead pid 2"),
        "{}",
        out.stdout
    );
    assert!(slot_bytes(&path, 0).iter().all(|&b| b == 0));
}
