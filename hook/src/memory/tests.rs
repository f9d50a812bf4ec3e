//! Accounting logic against the fake driver (`driver::fake`; closures for
//! the allocation calls), the fake world (`world::fake`: this process's
//! PIDs, the container's measured context size) and a region file in a
//! temp dir.

use std::cell::Cell;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use super::alloc::{mem_alloc_in, mem_free_in};
use super::context::{counted_context, infer, released_by_destroy, released_by_reset, Measured};
use super::info::mem_get_info_in;
use super::nvml_line::{own_listed, Snapshot};
use super::track::Tracker;
use super::{counted, uncounted};
use crate::config::Config;
use crate::driver::fake::FakeDriver as Fake;
use crate::driver::Memory;
use crate::ffi::*;
use crate::region::{slots, usage, Kind};
use crate::state::Process;
use crate::world::fake::FakeWorld;

const M: u64 = 1 << 20;

/// A region file `r.cache` in a temp dir of its own, gone when dropped.
struct RegionDir(tempfile::TempDir);

impl RegionDir {
    fn new() -> Self {
        Self(tempfile::tempdir().unwrap())
    }

    fn file(&self) -> std::path::PathBuf {
        self.0.path().join("r.cache")
    }

    /// A process state over this region with `limit` and PID `pid`.
    fn process(&self, limit: &str, pid: i32) -> Process {
        let path = self.file().display().to_string();
        let limit = limit.to_owned();
        let cfg = Config::from_lookup(move |k| match k {
            "CUDA_DEVICE_MEMORY_SHARED_CACHE" => Some(path.clone()),
            "CUDA_DEVICE_MEMORY_LIMIT" => Some(limit.clone()),
            _ => None,
        });
        Process::new(&cfg, pid, 0).unwrap()
    }

    /// As [`RegionDir::process`], with the PID of `live`: registering another
    /// process does not reclaim its slot.
    fn process_of(&self, limit: &str, live: &Live) -> Process {
        self.process(limit, live.pid())
    }
}

/// A live PID other than ours (registration reclaims dead ones).
struct Live(std::process::Child);

impl Live {
    fn new() -> Self {
        Self(
            std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .unwrap(),
        )
    }
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process limited to `limit`, alone over a region of its own, under a
/// PID that stays alive as long as it does.
struct LoneProcess {
    p: Process,
    _live: Live,
    _dir: RegionDir,
}

impl LoneProcess {
    fn new(limit: &str) -> Self {
        let (dir, live) = (RegionDir::new(), Live::new());
        Self {
            p: dir.process_of(limit, &live),
            _live: live,
            _dir: dir,
        }
    }
}

fn used(p: &Process, dev: usize) -> u64 {
    usage::container_used(p.att.region(), dev)
}

/// An allocation of `bytes` on `dev` through the accounting, which the
/// driver grants at `key`.
fn alloc_granted(p: &Process, t: &Tracker, dev: usize, bytes: u64, key: u64) -> CUresult {
    counted(&Fake::default(), p, t, dev, bytes, Kind::Data, || {
        (CUDA_SUCCESS, key)
    })
}

/// A context on device 0 of `p` whose creation runs `create`; nothing
/// destroys it.
fn create_context(
    p: &Process,
    fake: &Fake,
    world: &FakeWorld,
    create: impl FnOnce() -> CUresult,
) -> (CUresult, u64) {
    counted_context(p, fake, world, 0, create, || {})
}

/// This process's world when its host PID is 4242 (it runs in the
/// initial PID namespace).
fn at_host_pid() -> FakeWorld {
    FakeWorld::default().with_pids(Some(4242), None)
}

/// A context of `bytes` on device 0 of `p`, measured and counted.
fn context_counted(p: &Process, bytes: u64) {
    p.ctx_size[0].store(bytes, SeqCst);
    assert!(super::limit::reserve_committed(
        &p.att,
        0,
        bytes,
        Kind::Context
    ));
}

/// NVML's process list, as the fake driver holds it.
fn nvml_list(procs: &[(u32, u64)]) -> std::sync::Mutex<Option<Vec<(u32, u64)>>> {
    std::sync::Mutex::new(Some(procs.to_vec()))
}

/// NVML lists `procs` from now on.
fn nvml_lists(fake: &Fake, procs: &[(u32, u64)]) {
    *fake.procs.lock().unwrap() = Some(procs.to_vec());
}

/// `cuMemAlloc` of `bytes` through the hook's entry logic: its result and
/// the pointer it wrote (0 when it wrote none).
fn hooked_alloc(d: &Fake, p: Option<&Process>, bytes: u64) -> (CUresult, CUdeviceptr) {
    let mut ptr: CUdeviceptr = 0;
    let dptr: *mut CUdeviceptr = &mut ptr;
    let rc = mem_alloc_in(
        d,
        p,
        || d.mem_alloc(dptr, bytes as usize),
        dptr,
        bytes as usize,
    );
    (rc, ptr)
}

/// `cuMemGetInfo` through the hook's entry logic: its result, free and
/// total.
fn hooked_mem_info(d: &Fake, p: Option<&Process>) -> (CUresult, u64, u64) {
    let (mut free, mut total) = (0usize, 0usize);
    let (f, t): (*mut usize, *mut usize) = (&mut free, &mut total);
    let w = FakeWorld::default();
    let rc = mem_get_info_in(d, &w, || p, || d.mem_get_info(f, t), f, t);
    (rc, free as u64, total as u64)
}

/// A context for `p` is refused with `CUDA_ERROR_OUT_OF_MEMORY` before the
/// driver is asked to create it.
fn refused_before_creating(p: &Process, fake: &Fake, world: &FakeWorld) {
    let created = Cell::new(false);
    let (rc, _) = create_context(p, fake, world, || {
        created.set(true);
        CUDA_SUCCESS
    });
    assert_eq!(rc, CUDA_ERROR_OUT_OF_MEMORY);
    assert!(!created.get());
}

#[test]
fn alloc_until_the_limit_then_oom_and_free_releases() {
    let dir = RegionDir::new();
    let p = dir.process("100m", 4242);
    let mut next = 0x1000u64;
    let mut alloc = |bytes: u64| {
        next += 0x1000;
        alloc_granted(&p, &p.ptrs, 0, bytes, next)
    };
    assert_eq!(alloc(60 * M), CUDA_SUCCESS);
    assert_eq!(alloc(40 * M), CUDA_SUCCESS, "exactly the limit fits");
    let called = Cell::new(false);
    let rc = counted(&Fake::default(), &p, &p.ptrs, 0, 1, Kind::Data, || {
        called.set(true);
        (CUDA_SUCCESS, 1)
    });
    assert_eq!(rc, CUDA_ERROR_OUT_OF_MEMORY);
    assert!(!called.get(), "the driver is not called past the limit");
    assert_eq!(used(&p, 0), 100 * M);
    // Free the first one; an unknown pointer is forwarded, not refused.
    assert_eq!(
        uncounted(&p, &p.ptrs, 0x2000, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(used(&p, 0), 40 * M);
    assert_eq!(uncounted(&p, &p.ptrs, 0xdead, || 1), 1, "driver's answer");
    assert_eq!(used(&p, 0), 40 * M);
    let slot = p.att.slot().unwrap();
    assert_eq!(slot.used[0].data_size.load(SeqCst), 40 * M);
}

#[test]
fn driver_failure_releases_the_reservation() {
    let dir = RegionDir::new();
    let p = dir.process("1g", 4243);
    let rc = counted(&Fake::default(), &p, &p.ptrs, 0, 10 * M, Kind::Data, || {
        (CUDA_ERROR_OUT_OF_MEMORY, 0)
    });
    assert_eq!(rc, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(used(&p, 0), 0);
    assert!(p.ptrs.is_empty());
    // A failed free keeps the entry tracked.
    assert_eq!(alloc_granted(&p, &p.ptrs, 0, M, 7), CUDA_SUCCESS);
    assert_eq!(uncounted(&p, &p.ptrs, 7, || 1), 1);
    assert_eq!(used(&p, 0), M);
    assert_eq!(p.ptrs.len(), 1);
}

#[test]
fn counters_never_underflow_and_total_stays_the_sum() {
    let dir = RegionDir::new();
    let p = dir.process("0", 4244);
    p.att.add_unchecked(1, 5, Kind::Context);
    p.att.add_unchecked(1, 7, Kind::Data);
    super::limit::release_counted(&p.att, 1, 100, Kind::Data);
    let m = &p.att.slot().unwrap().used[1];
    assert_eq!(m.data_size.load(SeqCst), 0);
    assert_eq!(m.context_size.load(SeqCst), 5);
    assert_eq!(m.total.load(SeqCst), 5);
    assert_eq!(p.att.slot().unwrap().seqlock.load(SeqCst) % 2, 0);
}

#[test]
fn two_processes_share_the_limit_and_never_pass_it_together() {
    let dir = RegionDir::new();
    let (la, lb) = (Live::new(), Live::new());
    let a = Arc::new(dir.process_of("64m", &la));
    let b = Arc::new(dir.process_of("64m", &lb));
    assert_ne!(a.att.slot_index(), b.att.slot_index());
    // What the "driver" handed out and nobody freed yet, across all
    // threads: the limit holds when this never passes 64 MiB. (The region's
    // sum can, for an instant: a reservation is added, then backed out if
    // it does not fit.)
    let granted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Each thread holds 3 MiB blocks until one is refused, then frees them
    // all: four threads over two processes keep pushing the container
    // against its 64 MiB.
    let threads: Vec<_> = [a.clone(), b.clone(), a.clone(), b.clone()]
        .into_iter()
        .enumerate()
        .map(|(t, p)| {
            let (granted, peak, refused) = (granted.clone(), peak.clone(), refused.clone());
            std::thread::spawn(move || {
                let mut next = 0u64;
                for _ in 0..200 {
                    let mut held = Vec::new();
                    for _ in 0..64 {
                        next += 1;
                        let key = ((t as u64) << 32) | next;
                        let driver = || {
                            let now = granted.fetch_add(3 * M, SeqCst) + 3 * M;
                            peak.fetch_max(now, SeqCst);
                            (CUDA_SUCCESS, key)
                        };
                        if counted(&Fake::default(), &p, &p.ptrs, 0, 3 * M, Kind::Data, driver)
                            != CUDA_SUCCESS
                        {
                            refused.fetch_add(1, SeqCst);
                            break;
                        }
                        held.push(key);
                    }
                    for key in held {
                        uncounted(&p, &p.ptrs, key, || {
                            granted.fetch_sub(3 * M, SeqCst);
                            CUDA_SUCCESS
                        });
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let peak = peak.load(SeqCst);
    assert!(peak <= 64 * M, "peak {peak}");
    // The limit was reached, not merely respected from afar: 21 blocks of
    // 3 MiB fit in 64 MiB.
    assert!(
        peak >= 63 * M,
        "peak {peak}: the threads never reached the limit"
    );
    assert!(refused.load(SeqCst) > 0);
    assert_eq!(used(&a, 0), 0);
    assert_eq!(used(&b, 0), 0);
}

#[test]
fn slots_are_reused_in_place_and_dead_ones_reclaimed() {
    let dir = RegionDir::new();
    let (la, lb, lc) = (Live::new(), Live::new(), Live::new());
    let a = dir.process_of("1g", &la);
    let b = dir.process_of("1g", &lb);
    let r = a.att.region();
    assert_eq!(r.proc_num.load(SeqCst), 2);
    a.att.add_unchecked(0, 10 * M, Kind::Data);
    slots::release(r, a.att.slot_index());
    assert_eq!(r.procs[0].pid.load(SeqCst), 0);
    assert_eq!(r.procs[0].used[0].total.load(SeqCst), 0);
    // A new process takes slot 0 in place; b's slot did not move.
    let c2 = dir.process_of("1g", &lc);
    assert_eq!(c2.att.slot_index(), 0);
    assert_eq!(b.att.slot_index(), 1);
    assert_eq!(r.proc_num.load(SeqCst), 2);
    // b "dies" holding memory: reclaimed by the next allocation that fails.
    b.att.add_unchecked(0, 1 << 30, Kind::Data);
    let me = vgpu_common::proc_identity::ProcIdentity::read(
        std::path::Path::new("/proc"),
        lc.pid(),
        lc.pid(),
    );
    let n = slots::reclaim_dead(r, &me, |pid| (pid != lb.pid()).then_some((0, 0)));
    assert_eq!(n, 1);
    assert_eq!(used(&c2, 0), 0);
    assert_eq!(r.procs[1].status.load(SeqCst), 0);
}

#[test]
fn the_first_creator_wins_and_the_header_is_hami_s() {
    let dir = RegionDir::new();
    let (la, lb) = (Live::new(), Live::new());
    let a = dir.process_of("1g", &la);
    let b = dir.process_of("2g", &lb);
    let r = b.att.region();
    assert_eq!(r.limit[0].load(SeqCst), 1 << 30);
    assert_eq!(r.limit[15].load(SeqCst), 1 << 30);
    assert_eq!(r.sm_limit[0].load(SeqCst), 100);
    assert_eq!(r.utilization_switch.load(SeqCst), 1);
    assert_eq!(r.recent_kernel.load(SeqCst), 2);
    assert_eq!(r.priority.load(SeqCst), 1);
    assert_eq!(r.sem[0].load(SeqCst), 1);
    assert_eq!(r.sem_postinit[0].load(SeqCst), 1);
    assert_eq!(r.procs[a.att.slot_index()].status.load(SeqCst), 1);
    assert_eq!(r.procs[a.att.slot_index()].hostpid.load(SeqCst), 0);
    assert!(r.is_initialized());
    let len = std::fs::metadata(dir.file()).unwrap().len();
    assert_eq!(len, vgpu_common::region::FILE_SIZE);
}

#[test]
fn context_is_measured_once_then_reserved_before_creation() {
    let dir = RegionDir::new();
    let p = dir.process("1g", 8001);
    let fake = Fake {
        used: (1000 * M).into(),
        ..Fake::on(0)
    };
    let world = FakeWorld::default();
    let (rc, bytes) = create_context(&p, &fake, &world, || {
        fake.used.fetch_add(300 * M, SeqCst);
        CUDA_SUCCESS
    });
    assert_eq!((rc, bytes), (CUDA_SUCCESS, 300 * M));
    let slot = p.att.slot().unwrap();
    assert_eq!(slot.used[0].context_size.load(SeqCst), 300 * M);
    // Second context: 300 more fits (600 <= 1024); a third does not, and
    // the driver is not asked to create it.
    let created = |p| create_context(p, &fake, &world, || CUDA_SUCCESS).0;
    assert_eq!(created(&p), CUDA_SUCCESS);
    assert_eq!(created(&p), CUDA_SUCCESS);
    refused_before_creating(&p, &fake, &world);
}

#[test]
fn a_first_context_over_the_limit_is_destroyed() {
    let dir = RegionDir::new();
    let p = dir.process("100m", 8002);
    let fake = Fake::on(0);
    let destroyed = Cell::new(false);
    let (rc, _) = counted_context(
        &p,
        &fake,
        &FakeWorld::default(),
        0,
        || {
            fake.used.store(500 * M, SeqCst);
            CUDA_SUCCESS
        },
        || destroyed.set(true),
    );
    assert_eq!(rc, CUDA_ERROR_OUT_OF_MEMORY);
    assert!(destroyed.get());
    assert_eq!(used(&p, 0), 0);
}

/// In a PID namespace under a driver that lists the container's processes
/// with namespace PIDs (R580), the one new PID is ours as the namespace
/// sees it: the size is exact, and no namespace PID becomes the host PID.
#[test]
fn a_namespace_pid_in_nvmls_list_measures_but_is_no_host_pid() {
    let dir = RegionDir::new();
    let p = dir.process("1g", 8003);
    let fake = Fake {
        procs: nvml_list(&[]),
        ..Fake::on(0)
    };
    let world = FakeWorld::default().with_pids(None, Some(1));
    let (rc, bytes) = create_context(&p, &fake, &world, || {
        // Another container allocated meanwhile: the delta is wrong.
        fake.used.store(900 * M, SeqCst);
        nvml_lists(&fake, &[(1, 300 * M)]);
        CUDA_SUCCESS
    });
    assert_eq!((rc, bytes), (CUDA_SUCCESS, 300 * M));
    assert_eq!(p.att.host_pid(), None);
    let slot = p.att.slot().unwrap();
    assert_eq!(slot.hostpid.load(SeqCst), 0);
}

#[test]
fn our_line_is_found_by_host_pid_else_by_namespace_pid() {
    let after = snap(&[(1, 64 * M), (2, 32 * M)], 0);
    // The host PID (from the daemon) listed: it.
    let host_listed = snap(&[(4711, 64 * M)], 0);
    assert_eq!(own_listed(Some(4711), Some(1), &host_listed), Some(4711));
    // Not listed, the namespace PID is: a namespace-faithful driver.
    assert_eq!(own_listed(Some(4711), Some(1), &after), Some(1));
    // Neither: the host PID (infer falls back to other measures).
    assert_eq!(own_listed(Some(4711), Some(3), &after), Some(4711));
    // No host PID known: nothing (the node lock and the new PID decide).
    assert_eq!(own_listed(None, Some(1), &after), None);
}

fn snap(procs: &[(u32, u64)], used: u64) -> Snapshot {
    Snapshot {
        procs: Some(procs.to_vec()),
        used: Some(used),
    }
}

#[test]
fn context_size_inference() {
    // Our own line is exact, whatever else happened on the device.
    let (b, a) = (
        snap(&[(7, 100 * M)], 100 * M),
        snap(&[(7, 100 * M), (42, 64 * M), (9, 64 * M)], 900 * M),
    );
    assert_eq!(infer(Some(42), &b, &a, None), Measured::Own(64 * M));
    // Host PID unknown: the one new PID is ours.
    let a1 = snap(&[(7, 100 * M), (42, 64 * M)], 300 * M);
    assert_eq!(
        infer(None, &b, &a1, Some(5)),
        Measured::NewPid {
            pid: 42,
            bytes: 64 * M
        }
    );
    // Two new PIDs: the container's shared size, else a plausible delta,
    // else nothing.
    assert_eq!(infer(None, &b, &a, Some(64 * M)), Measured::Shared(64 * M));
    assert_eq!(infer(None, &b, &a, None), Measured::Delta(800 * M));
    let huge = snap(&[], 100 * M + (5 << 30));
    assert_eq!(infer(None, &b, &huge, None), Measured::Unknown);
    assert_eq!(
        infer(None, &b, &snap(&[], 50 * M), None),
        Measured::Unknown,
        "something was freed in the window"
    );
}

#[test]
fn an_exact_size_is_shared_and_then_reserved_before_creation() {
    let dir = RegionDir::new();
    let live_a = Live::new();
    let a = dir.process_of("100m", &live_a);
    let fake = Fake {
        procs: nvml_list(&[(1, 30 * M)]),
        used: (30 * M).into(),
        ..Default::default()
    };
    let world = at_host_pid();
    let (rc, bytes) = create_context(&a, &fake, &world, || {
        nvml_lists(&fake, &[(1, 30 * M), (4242, 60 * M)]);
        fake.used.store(200 * M, SeqCst);
        CUDA_SUCCESS
    });
    assert_eq!((rc, bytes), (CUDA_SUCCESS, 60 * M));
    assert_eq!(*world.shared_ctx.lock().unwrap(), Some(60 * M));
    // Another process of the container reuses it and, as it does not fit
    // (60 + 60 > 100), is refused before the driver creates anything.
    let live = Live::new();
    let b = dir.process_of("100m", &live);
    refused_before_creating(&b, &fake, &world);
}

/// A reservation counts at once; dropped uncommitted (an error path) it
/// takes its bytes back, committed it keeps them until the free.
#[test]
fn a_reservation_is_taken_back_when_dropped_unless_committed() {
    let dir = RegionDir::new();
    let p = dir.process("1g", 8006);
    let r = super::limit::reserve(&p.att, 0, 100 * M, Kind::Data).unwrap();
    assert_eq!(used(&p, 0), 100 * M);
    drop(r);
    assert_eq!(used(&p, 0), 0);
    super::limit::reserve(&p.att, 0, 100 * M, Kind::Data)
        .unwrap()
        .commit();
    assert_eq!(used(&p, 0), 100 * M);
    // Over the limit: nothing counted, nothing to take back.
    assert!(super::limit::reserve(&p.att, 0, 1024 * M, Kind::Data).is_none());
    assert_eq!(used(&p, 0), 100 * M);
    super::limit::release_counted(&p.att, 0, 100 * M, Kind::Data);
    assert_eq!(used(&p, 0), 0);
}

#[test]
fn a_primary_reset_releases_the_device_s_allocations() {
    let dir = RegionDir::new();
    let p = dir.process("1g", 8004);
    context_counted(&p, 10 * M);
    let mut retained = 1;
    for (i, t) in [&p.ptrs, &p.handles, &p.arrays].into_iter().enumerate() {
        let rc = alloc_granted(&p, t, 0, 20 * M, 0x1000 + i as u64);
        assert_eq!(rc, CUDA_SUCCESS);
    }
    // One allocation on another device stays.
    assert_eq!(alloc_granted(&p, &p.ptrs, 1, 5 * M, 0x9000), CUDA_SUCCESS);
    assert_eq!(used(&p, 0), 70 * M);
    released_by_reset(&p, 0, &mut retained);
    assert_eq!(retained, 0);
    assert_eq!(used(&p, 0), 0);
    assert_eq!(used(&p, 1), 5 * M);
    assert_eq!(p.ptrs.len(), 1);
    assert!(p.handles.is_empty() && p.arrays.is_empty());
}

#[test]
fn a_context_destroy_releases_only_that_context_s_allocations() {
    use super::track::Entry;
    let dir = RegionDir::new();
    let p = dir.process("1g", 8005);
    let (a, b) = (0xa000, 0xb000);
    let mut key = 0x100;
    let mut add = |t: &Tracker, ctx: u64, bytes: u64| {
        assert!(super::limit::reserve_committed(
            &p.att,
            0,
            bytes,
            Kind::Data
        ));
        key += 1;
        t.insert(
            key,
            Entry {
                ctx,
                ..Entry::unbound(0, bytes, Kind::Data)
            },
        );
    };
    add(&p.ptrs, a, 10 * M);
    add(&p.ptrs, a, 20 * M);
    add(&p.arrays, a, M);
    add(&p.ptrs, b, 5 * M);
    // Not bound to a context: a VMM handle and pool memory.
    add(&p.handles, a, 7 * M);
    add(&p.ptrs, 0, 3 * M);
    assert_eq!(used(&p, 0), 46 * M);
    released_by_destroy(&p, a);
    assert_eq!(used(&p, 0), 15 * M);
    assert_eq!(p.ptrs.len(), 2);
    assert!(p.arrays.is_empty());
    assert_eq!(p.handles.len(), 1);
    // Unknown context (0): nothing.
    released_by_destroy(&p, 0);
    assert_eq!(used(&p, 0), 15 * M);
}

/// A process whose context on device 0 is counted (10 MiB) and whose
/// NVML line reads `nvml` bytes.
fn with_context(dir: &RegionDir, pid: i32, nvml: u64) -> (Process, Fake) {
    let p = dir.process("1g", pid);
    context_counted(&p, 10 * M);
    let fake = Fake {
        procs: nvml_list(&[(7, 300 * M), (4242, nvml)]),
        ..Default::default()
    };
    (p, fake)
}

#[test]
fn gpu_code_loaded_after_the_context_is_counted_once() {
    use super::modules::{reconcile, released_with_context};
    let dir = RegionDir::new();
    let (p, fake) = with_context(&dir, 8101, 10 * M + 74 * M);
    assert_eq!(reconcile(&p, &fake, &at_host_pid(), 0), 74 * M);
    assert_eq!(used(&p, 0), 84 * M, "the count is NVML's line");
    let slot = p.att.slot().unwrap();
    assert_eq!(
        slot.used[0].module_size.load(SeqCst),
        74 * M,
        "as module memory"
    );
    assert_eq!(
        reconcile(&p, &fake, &at_host_pid(), 0),
        0,
        "nothing new: nothing added"
    );
    // An allocation seen by the hook moves both alike.
    assert_eq!(alloc_granted(&p, &p.ptrs, 0, 100 * M, 0x5000), CUDA_SUCCESS);
    nvml_lists(&fake, &[(4242, 184 * M)]);
    assert_eq!(reconcile(&p, &fake, &at_host_pid(), 0), 0);
    // The context goes, and the code loaded for it with it.
    released_with_context(&p, 0);
    assert_eq!(used(&p, 0), 110 * M);
}

#[test]
fn two_looks_reading_less_lower_only_what_was_counted_for_code() {
    use super::modules::reconcile;
    let dir = RegionDir::new();
    let (p, fake) = with_context(&dir, 8105, 10 * M + 40 * M);
    assert_eq!(reconcile(&p, &fake, &at_host_pid(), 0), 40 * M);
    // The code's memory went away (unloaded): one look lowers nothing...
    nvml_lists(&fake, &[(4242, 20 * M)]);
    assert_eq!(reconcile(&p, &fake, &at_host_pid(), 0), 0);
    assert_eq!(used(&p, 0), 50 * M);
    // ...the second lowers what was counted for code, 30 of its 40 MiB.
    assert_eq!(reconcile(&p, &fake, &at_host_pid(), 0), 0);
    assert_eq!(used(&p, 0), 20 * M);
    // Never below what the entry points counted (the 10 MiB context).
    nvml_lists(&fake, &[(4242, 0)]);
    reconcile(&p, &fake, &at_host_pid(), 0);
    reconcile(&p, &fake, &at_host_pid(), 0);
    assert_eq!(used(&p, 0), 10 * M);
}

#[test]
fn nvml_reading_less_than_the_count_lowers_nothing() {
    // An allocation is counted before the driver makes it: NVML lags.
    let dir = RegionDir::new();
    let (p, fake) = with_context(&dir, 8102, 4 * M);
    assert_eq!(super::modules::reconcile(&p, &fake, &at_host_pid(), 0), 0);
    assert_eq!(used(&p, 0), 10 * M);
    // Within NVML's MiB rounding: nothing either.
    nvml_lists(&fake, &[(4242, 11 * M)]);
    assert_eq!(super::modules::reconcile(&p, &fake, &at_host_pid(), 0), 0);
}

#[test]
fn no_look_before_the_context_is_counted_or_without_our_line() {
    let dir = RegionDir::new();
    let (p, fake) = with_context(&dir, 8103, 90 * M);
    // Not our line: another process's memory is never ours.
    nvml_lists(&fake, &[(7, 900 * M)]);
    let blind = Fake {
        procs: nvml_list(&[(7, 900 * M)]),
        ..Default::default()
    };
    assert_eq!(super::modules::reconcile(&p, &blind, &at_host_pid(), 0), 0);
    // Until the context's size is counted, NVML's extra is that context.
    p.ctx_size[0].store(crate::state::UNKNOWN, SeqCst);
    nvml_lists(&fake, &[(4242, 90 * M)]);
    assert_eq!(super::modules::reconcile(&p, &fake, &at_host_pid(), 0), 0);
    assert_eq!(used(&p, 0), 10 * M);
}

#[test]
fn the_background_look_is_due_at_most_once_a_period() {
    use super::modules::{due, PERIOD_NS};
    let dir = RegionDir::new();
    let (p, _fake) = with_context(&dir, 8104, 30 * M);
    let t0 = 5_000_000_000;
    assert!(due(&p, t0), "the first look is due at once");
    assert!(!due(&p, t0), "not twice at one time");
    assert!(!due(&p, t0 + PERIOD_NS - 1), "not again within the period");
    assert!(due(&p, t0 + PERIOD_NS), "due again after it");
}

#[test]
fn a_refused_allocation_never_reaches_the_driver() {
    let t = LoneProcess::new("100m");
    let p = &t.p;
    let d = Fake::on(0);
    let (rc, ptr) = hooked_alloc(&d, Some(p), 60 * M);
    assert_eq!(rc, CUDA_SUCCESS);
    assert_ne!(ptr, 0);
    assert_eq!((d.allocs(), used(p, 0)), (1, 60 * M));
    let (rc, refused) = hooked_alloc(&d, Some(p), 50 * M);
    assert_eq!(rc, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(
        d.allocs(),
        1,
        "the refused allocation never reached the driver"
    );
    assert_eq!((refused, used(p, 0)), (0, 60 * M));
    // The driver's own failure is returned and releases the reservation.
    d.alloc_rc.store(CUDA_ERROR_OUT_OF_MEMORY, SeqCst);
    assert_eq!(hooked_alloc(&d, Some(p), M).0, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!((d.allocs(), used(p, 0)), (2, 60 * M));
}

#[test]
fn a_free_releases_the_count_and_an_unknown_free_is_forwarded() {
    let t = LoneProcess::new("100m");
    let p = &t.p;
    let d = Fake::on(1);
    let (rc, ptr) = hooked_alloc(&d, Some(p), 70 * M);
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(
        used(p, 1),
        70 * M,
        "counted on the current context's device"
    );
    assert_eq!(mem_free_in(Some(p), || d.mem_free(ptr), ptr), CUDA_SUCCESS);
    assert_eq!((d.frees(), used(p, 1)), (1, 0));
    // The room is back: the same size fits again.
    assert_eq!(hooked_alloc(&d, Some(p), 70 * M).0, CUDA_SUCCESS);
    // A pointer the hook never counted reaches the driver, counts nothing.
    assert_eq!(
        mem_free_in(Some(p), || d.mem_free(0xdead_0000), 0xdead_0000),
        CUDA_SUCCESS
    );
    assert_eq!((d.frees(), used(p, 1)), (2, 70 * M));
}

#[test]
fn without_a_region_or_a_context_calls_are_forwarded_uncounted() {
    let t = LoneProcess::new("100m");
    let p = &t.p;
    // No process state: everything goes to the driver, even past the limit.
    let d = Fake::on(0);
    let (rc, ptr) = hooked_alloc(&d, None, 500 * M);
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(mem_free_in(None, || d.mem_free(ptr), ptr), CUDA_SUCCESS);
    // No current context: forwarded, not counted.
    let no_ctx = Fake::default();
    assert_eq!(hooked_alloc(&no_ctx, Some(p), 500 * M).0, CUDA_SUCCESS);
    assert_eq!((d.allocs(), d.frees(), no_ctx.allocs()), (1, 1, 1));
    assert_eq!(used(p, 0), 0);
}

#[test]
fn memory_info_shows_the_limit_on_the_current_device() {
    const G: u64 = 1 << 30;
    let t = LoneProcess::new("100m");
    let p = &t.p;
    let d = Fake::on(0);
    *d.info.lock().unwrap() = (70 * G, 80 * G);
    assert_eq!(hooked_alloc(&d, Some(p), 60 * M).0, CUDA_SUCCESS);
    assert_eq!(
        hooked_mem_info(&d, Some(p)),
        (CUDA_SUCCESS, 40 * M, 100 * M)
    );
    // Without process state the driver's figures pass unchanged.
    assert_eq!(hooked_mem_info(&d, None), (CUDA_SUCCESS, 70 * G, 80 * G));
}

/// The context an allocation dies with is the one the driver seam names
/// (the fake's here; the real driver is never asked): destroying that
/// context releases the allocation, destroying another does not.
#[test]
fn an_allocation_dies_with_the_context_the_driver_names() {
    use crate::driver::Context;
    let t = LoneProcess::new("100m");
    let p = &t.p;
    let d = Fake::on(1);
    let (rc, ptr) = hooked_alloc(&d, Some(p), 10 * M);
    assert_eq!((rc, used(p, 1)), (CUDA_SUCCESS, 10 * M));
    let ctx = d.context().unwrap() as u64;
    assert!(p.ptrs.any(|e| e.ctx == ctx), "bound to {ctx:#x}");
    released_by_destroy(p, ctx + 1);
    assert_eq!(used(p, 1), 10 * M, "another context's destroy keeps it");
    released_by_destroy(p, ctx);
    assert_eq!(used(p, 1), 0);
    assert!(p.ptrs.is_empty(), "{ptr:#x} is gone with its context");
}
