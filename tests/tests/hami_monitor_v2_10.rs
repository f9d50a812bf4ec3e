//! HAMi v2.10's vGPU monitor reads vgpu's region the same as HAMi-core's.
//!
//! The reader below is written here from the facts of HAMi v2.10.0's
//! `pkg/monitor/nvidia/cudevshr.go` and `v1/spec.go` (the newest 2.10 tag),
//! not from vgpu's own region types, so a field vgpu moved or narrowed would
//! read wrong through it:
//! - a file is read as v1 when its first `int32` is the magic 19920718, its
//!   major version is 1 and it is at least as long as the whole v1 struct
//!   (a shorter one of at least v0's size would be read as v0);
//! - `ownerPid` is a 64-bit field at byte 16 (HAMi ≤ 2.9 typed it 32-bit and
//!   relied on Go's padding; every later field lies where it did);
//! - the device count is `min(num, 16)`; limits and SM limits are `uint64`
//!   per device;
//! - the slots shown are `procs[0..procnum]` with `procnum` clamped to
//!   `0..=1024`, skipping every slot whose `status` is 0; memory per device
//!   is the sum of those slots' `total` (and context, module, buffer,
//!   offset likewise).
//!
//! Offsets (C's 64-bit layout, which the Go struct mirrors): the header is
//! `int32` ×4, `ownerPid` u64, a 32-byte semaphore, `num` u64, 16 UUIDs of
//! 96 bytes, then `limit[16]`, `smLimit[16]`, `procs[1024]` of 1960 bytes
//! each (`pid`, `hostpid`, 16 × 64-byte memory records, 16 × u64
//! `monitorused`, 16 × 48-byte utilisation records, `status`), then
//! `procnum`, `utilizationSwitch`, `recentKernel`, `priority` (`int32`
//! each), `lastKernelTime` (`int64`) and four spare `u64`.
//!
//! The process is a real one under vgpu's hook over the simulated GPU
//! (`/work/shared/reference/hami-core-spec.md` §2 has the same layout).

use std::io::Write as _;

use vgpu_tests::hook::{HookEnv, Running};

const MAGIC: i32 = 19_920_718;
const DEVICES: usize = 16;
const SLOTS: usize = 1024;
const OWNER_PID: usize = 16;
const NUM: usize = 56;
const UUIDS: usize = 64;
const UUID_LEN: usize = 96;
const LIMIT: usize = UUIDS + DEVICES * UUID_LEN;
const SM_LIMIT: usize = LIMIT + DEVICES * 8;
const PROCS: usize = SM_LIMIT + DEVICES * 8;
const MEM_RECORD: usize = 64;
const UTIL_RECORD: usize = 48;
const SLOT_USED: usize = 8;
const SLOT_UTIL: usize = SLOT_USED + DEVICES * MEM_RECORD + DEVICES * 8;
const SLOT_STATUS: usize = SLOT_UTIL + DEVICES * UTIL_RECORD;
/// `status` (4 bytes, padded to 8) and three spare `u64`.
const SLOT_LEN: usize = SLOT_STATUS + 8 + 3 * 8;
const PROCNUM: usize = PROCS + SLOTS * SLOT_LEN;
const PRIORITY: usize = PROCNUM + 12;
/// `lastKernelTime` and four spare `u64` end the struct.
const V1_MIN_SIZE: usize = PROCNUM + 16 + 8 + 4 * 8;

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// One slot as the monitor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    pid: i32,
    hostpid: i32,
    /// Context, module, buffer, offset, total: per device.
    memory: Vec<[u64; 5]>,
}

/// What HAMi v2.10's monitor makes of a region file.
#[derive(Debug)]
struct MonitorView {
    owner_pid: u64,
    devices: usize,
    uuids: Vec<String>,
    limits: Vec<u64>,
    sm_limits: Vec<u64>,
    slots: Vec<Slot>,
    priority: i32,
}

impl MonitorView {
    fn read(b: &[u8]) -> Result<MonitorView, String> {
        if b.len() < 12 {
            return Err(format!("{} bytes: too small for the header", b.len()));
        }
        if i32_at(b, 0) != MAGIC {
            return Err("no magic: not initialised".into());
        }
        if i32_at(b, 4) != 1 || b.len() < V1_MIN_SIZE {
            return Err(format!(
                "not v1: version {}.{}, {} bytes (v1 needs {V1_MIN_SIZE})",
                i32_at(b, 4),
                i32_at(b, 8),
                b.len()
            ));
        }
        let devices = u64_at(b, NUM).min(DEVICES as u64) as usize;
        let procnum = i32_at(b, PROCNUM).clamp(0, SLOTS as i32) as usize;
        let slots = (0..procnum)
            .map(|i| PROCS + i * SLOT_LEN)
            .filter(|&at| i32_at(b, at + SLOT_STATUS) != 0)
            .map(|at| Slot {
                pid: i32_at(b, at),
                hostpid: i32_at(b, at + 4),
                memory: (0..DEVICES)
                    .map(|d| {
                        let m = at + SLOT_USED + d * MEM_RECORD;
                        [0, 8, 16, 24, 32].map(|f| u64_at(b, m + f))
                    })
                    .collect(),
            })
            .collect();
        Ok(MonitorView {
            owner_pid: u64_at(b, OWNER_PID),
            devices,
            uuids: (0..devices)
                .map(|d| {
                    let u = &b[UUIDS + d * UUID_LEN..UUIDS + (d + 1) * UUID_LEN];
                    let end = u.iter().position(|&c| c == 0).unwrap_or(UUID_LEN);
                    String::from_utf8_lossy(&u[..end]).into_owned()
                })
                .collect(),
            limits: (0..DEVICES).map(|d| u64_at(b, LIMIT + d * 8)).collect(),
            sm_limits: (0..DEVICES).map(|d| u64_at(b, SM_LIMIT + d * 8)).collect(),
            slots,
            priority: i32_at(b, PRIORITY),
        })
    }

    /// `DeviceMemoryTotal(dev)`: the shown slots' `total`, summed.
    fn total(&self, dev: usize) -> u64 {
        self.slots.iter().map(|s| s.memory[dev][4]).sum()
    }
}

const MIB: u64 = 1 << 20;

/// Two processes under vgpu's hook hold 64 and 96 MiB on one simulated GPU;
/// HAMi v2.10's reading of their region shows both slots with their PIDs,
/// their memory (summed per device as the monitor does, and equal to what
/// vgpu's own view counts), the limits the environment set and the
/// priority; `ownerPid` read as 64 bits holds no stray high half.
#[test]
fn a_region_written_by_vgpu_reads_the_same_through_hami_2_10s_monitor() {
    let env = HookEnv::new("hami-2-10-monitor", "4g")
        .env("CUDA_DEVICE_SM_LIMIT", "40")
        .env("CUDA_TASK_PRIORITY", "0");
    let exe = env.build("hook_mem");
    let mut held = Vec::new();
    for mib in [64, 96] {
        let mut r = Running::start(env.hooked(&exe, &["hold", &(mib * MIB).to_string()]));
        assert_eq!(r.wait_for("held"), "held rc 0", "{mib} MiB");
        held.push((r, mib));
    }
    let bytes = std::fs::read(env.region_path()).unwrap();
    let view = MonitorView::read(&bytes).unwrap_or_else(|e| panic!("HAMi 2.10 refuses it: {e}"));

    assert!(view.devices >= 1, "{view:?}");
    assert!(
        view.uuids[0].starts_with("GPU-"),
        "device 0's UUID: {:?}",
        view.uuids
    );
    assert_eq!(view.limits[0], 4 << 30, "the memory limit");
    assert_eq!(view.sm_limits[0], 40, "the SM limit");
    assert_eq!(view.priority, 0, "the priority");
    assert_eq!(
        view.owner_pid >> 32,
        0,
        "ownerPid read as 64 bits: {:#x}",
        view.owner_pid
    );

    let mut pids: Vec<i32> = view.slots.iter().map(|s| s.pid).collect();
    pids.sort();
    let mut want: Vec<i32> = held.iter().map(|(r, _)| r.child.id() as i32).collect();
    want.sort();
    assert_eq!(
        pids, want,
        "the slots HAMi's monitor shows: {:?}",
        view.slots
    );
    for s in &view.slots {
        assert!(
            s.hostpid == 0 || s.hostpid == s.pid,
            "hostpid is unset or, with no PID namespace, the PID: {s:?}"
        );
        let (_, mib) = held
            .iter()
            .find(|(r, _)| r.child.id() as i32 == s.pid)
            .unwrap();
        let [context, _module, buffer, _offset, total] = s.memory[0];
        assert!(
            buffer >= mib * MIB && total >= buffer + context,
            "{mib} MiB held: {s:?}"
        );
    }

    // vgpu's own count, per device, is what the monitor sums.
    let region = env.region();
    let r = region.region();
    use std::sync::atomic::Ordering::SeqCst;
    for dev in 0..view.devices {
        let ours: u64 = r
            .procs
            .iter()
            .take(r.proc_num.load(SeqCst).clamp(0, SLOTS as i32) as usize)
            .filter(|p| p.status.load(SeqCst) != 0)
            .map(|p| p.used[dev].total.load(SeqCst))
            .sum();
        assert_eq!(view.total(dev), ours, "device {dev}");
    }
    assert!(view.total(0) >= 160 * MIB, "{}", view.total(0));

    for (mut r, _) in held {
        let _ = writeln!(r.child.stdin.as_mut().unwrap());
        drop(r.child.stdin.take());
        let _ = r.child.wait();
    }
}

/// The reader's two guards, as v2.10 has them: a `procnum` past the slot
/// array is clamped (and a negative one shows nothing), and a slot whose
/// status is 0 is skipped even inside `procnum`.
#[test]
fn procnum_is_clamped_and_free_slots_are_skipped() {
    let mut b = vec![0u8; V1_MIN_SIZE];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&1i32.to_le_bytes());
    b[NUM..NUM + 8].copy_from_slice(&1u64.to_le_bytes());
    for (i, (pid, status)) in [(11i32, 1i32), (12, 0), (13, 2)].into_iter().enumerate() {
        let at = PROCS + i * SLOT_LEN;
        b[at..at + 4].copy_from_slice(&pid.to_le_bytes());
        b[at + SLOT_STATUS..at + SLOT_STATUS + 4].copy_from_slice(&status.to_le_bytes());
    }
    let pids = |procnum: i32, b: &mut Vec<u8>| {
        b[PROCNUM..PROCNUM + 4].copy_from_slice(&procnum.to_le_bytes());
        MonitorView::read(b)
            .unwrap()
            .slots
            .iter()
            .map(|s| s.pid)
            .collect::<Vec<_>>()
    };
    assert_eq!(pids(3, &mut b), [11, 13]);
    assert_eq!(pids(i32::MAX, &mut b), [11, 13]);
    assert_eq!(pids(-3, &mut b), Vec::<i32>::new());
    assert!(
        MonitorView::read(&b[..V1_MIN_SIZE - 1]).is_err(),
        "short: not v1"
    );
}
