//! The two programs: thin entry points over `try_` functions.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{uprobe, uretprobe},
    maps::PerCpuHashMap,
    programs::{ProbeContext, RetProbeContext},
};
use vgpu_common::event::{
    AllocKey, CallEvent, Counter, Func, FuncClass, LaunchKey, Pending, PendingKey, ProcCounters,
    DEVICE_UNKNOWN, RESULT_NONE,
};

use crate::{
    args::{arg, arg_at, read_user},
    caller,
    maps::{config, count, ALLOCS, EVENTS, LAUNCHED, LAUNCHES, PENDING, PROCS, PROC_COUNTS},
};

/// Why a program stopped early. Small enough for a register.
#[repr(u8)]
#[derive(Clone, Copy)]
enum Error {
    /// The attach cookie is not a known [`Func`].
    UnknownFunc = 1,
    /// A return with no stashed entry.
    NoPending = 2,
}

const _: () = assert!(core::mem::size_of::<Error>() == 1);

#[uprobe]
pub fn vgpu_call_entry(ctx: ProbeContext) -> u32 {
    match try_entry(&ctx) {
        Ok(()) => 0,
        Err(e) => e as u32,
    }
}

#[uretprobe]
pub fn vgpu_call_return(ctx: RetProbeContext) -> u32 {
    match try_return(&ctx) {
        Ok(()) => 0,
        Err(e) => e as u32,
    }
}

/// Does nothing. `vgpu trace --floor` attaches it alone to the launch entry
/// points, to measure what the trap itself costs: the floor under every
/// other probe.
#[uprobe]
pub fn vgpu_floor(_ctx: ProbeContext) -> u32 {
    0
}

/// Counts a successful launch of the calling process. Attached to the
/// launch entry points of one process at a time, the daemon's kernel-side
/// witness that a container claiming GPU work puts work on the GPU: a call
/// the driver refused (a forged handle) is not counted.
#[uretprobe]
pub fn vgpu_launch_done(ctx: RetProbeContext) -> u32 {
    let rc: u64 = ctx.ret();
    // CUresult is a C enum: the register's upper half is not part of it.
    if rc as u32 != 0 {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !add_one(&LAUNCHED, &tgid) {
        count(Counter::ProcsFull);
    }
    0
}

#[inline(always)]
fn func_of<C: aya_ebpf::EbpfContext>(ctx: &C) -> Result<(u32, Func), Error> {
    // SAFETY: ctx is this program's context; the helper only reads the cookie.
    let id = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    Func::from_id(id).map(|f| (id, f)).ok_or(Error::UnknownFunc)
}

fn try_entry(ctx: &ProbeContext) -> Result<(), Error> {
    let (id, func) = func_of(ctx)?;
    let cfg = config();
    let mut p = Pending {
        event: CallEvent {
            // SAFETY: helper without arguments.
            ts_ns: unsafe { bpf_ktime_get_ns() },
            caller: caller::current(&cfg),
            func: id,
            result: RESULT_NONE,
            ..CallEvent::default()
        },
        out_ptr: 0,
        out_ptr2: 0,
    };
    let ev = &mut p.event;
    let class = func.class();
    match class {
        FuncClass::Launch => {
            if matches!(func, Func::LaunchKernelEx | Func::LaunchKernelExPtsz) {
                // const CUlaunchConfig *config: 7 x u32, then hStream at 32.
                let conf = arg(ctx, 0);
                ev.handle = arg(ctx, 1);
                let dims: [u32; 8] = read_user(conf).unwrap_or_else(|| {
                    count(Counter::UserReadFailed);
                    [0; 8]
                });
                ev.grid = [dims[0], dims[1], dims[2]];
                ev.block = [dims[3], dims[4], dims[5]];
                ev.shmem = dims[6];
                ev.stream = read_user(conf.wrapping_add(32)).unwrap_or(0);
            } else {
                ev.handle = arg(ctx, 0);
                ev.grid = [arg(ctx, 1) as u32, arg(ctx, 2) as u32, arg(ctx, 3) as u32];
                ev.block = [arg(ctx, 4) as u32, arg(ctx, 5) as u32, arg(ctx, 6) as u32];
                ev.shmem = arg(ctx, 7) as u32;
                ev.stream = arg(ctx, 8);
            }
        }
        FuncClass::GraphLaunch => {
            ev.handle = arg(ctx, 0);
            ev.stream = arg(ctx, 1);
        }
        FuncClass::Alloc => {
            p.out_ptr = arg(ctx, 0);
            match func {
                Func::MemAllocPitch => {
                    // (dptr*, pitch*, width, height, elem): size = pitch x height at return.
                    p.out_ptr2 = arg(ctx, 1);
                    p.event.size = arg(ctx, 3);
                }
                Func::MemAllocAsync | Func::MemAllocAsyncPtsz => {
                    p.event.size = arg(ctx, 1);
                    p.event.stream = arg(ctx, 2);
                }
                Func::MemAllocFromPoolAsync | Func::MemAllocFromPoolAsyncPtsz => {
                    p.event.size = arg(ctx, 1);
                    p.event.stream = arg(ctx, 3);
                }
                _ => p.event.size = arg(ctx, 1),
            }
        }
        FuncClass::Free => {
            ev.handle = arg(ctx, 0);
            if matches!(func, Func::MemFreeAsync | Func::MemFreeAsyncPtsz) {
                ev.stream = arg(ctx, 1);
            }
        }
        FuncClass::Context => {
            if let Some(n) = func.device_arg() {
                // A CUdevice is a C int: the register's upper half is not part of it.
                ev.handle = match arg_at(ctx, n) {
                    Some(dev) => u64::from(dev as u32),
                    None => {
                        count(Counter::UserReadFailed);
                        DEVICE_UNKNOWN
                    }
                };
            }
            // Known from its first call on: the daemon fills host pids from PROCS.
            if cfg.aggregate != 0 {
                bump(&p.event, |_| {});
            }
        }
    }

    let launchy = matches!(class, FuncClass::Launch | FuncClass::GraphLaunch);
    if launchy && cfg.aggregate != 0 {
        count_launch(&p.event, class);
    }
    // Launches have a return probe only when per-call events are asked for.
    if !launchy || cfg.emit_events != 0 {
        let key = PendingKey {
            pid_tgid: bpf_get_current_pid_tgid(),
            func: id,
            _pad: 0,
        };
        if PENDING.insert(&key, &p, 0).is_err() {
            count(Counter::PendingFull);
        }
    }
    Ok(())
}

fn try_return(ctx: &RetProbeContext) -> Result<(), Error> {
    let (id, func) = func_of(ctx)?;
    let key = PendingKey {
        pid_tgid: bpf_get_current_pid_tgid(),
        func: id,
        _pad: 0,
    };
    // SAFETY: the entry is copied out at once and then removed; only this
    // thread uses this key.
    let Some(p) = (unsafe { PENDING.get(&key) }).copied() else {
        count(Counter::ReturnWithoutEntry);
        return Err(Error::NoPending);
    };
    // A failed remove leaves a stale slot that the next call overwrites.
    let _ = PENDING.remove(&key);
    let cfg = config();
    let mut ev = p.event;
    let rc: u64 = ctx.ret();
    ev.result = rc as u32;
    // SAFETY: helper without arguments.
    ev.duration_ns = unsafe { bpf_ktime_get_ns() }.wrapping_sub(ev.ts_ns);
    let ok = ev.result == 0;
    let tgid = ev.caller.host_tgid;
    let space = u32::from(func.is_handle_based());
    match func.class() {
        FuncClass::Alloc => {
            if ok {
                ev.handle = read_user::<u64>(p.out_ptr).unwrap_or_else(|| {
                    count(Counter::UserReadFailed);
                    0
                });
                if func == Func::MemAllocPitch {
                    let pitch: u64 = read_user(p.out_ptr2).unwrap_or(0);
                    ev.size = pitch.wrapping_mul(ev.size);
                }
            }
            if cfg.aggregate != 0 {
                if ok {
                    let k = AllocKey {
                        ptr: ev.handle,
                        tgid,
                        space,
                    };
                    if ALLOCS.insert(&k, &ev.size, 0).is_err() {
                        count(Counter::AllocsFull);
                    }
                }
                let size = ev.size;
                bump(&ev, |c| {
                    if ok {
                        c.allocs += 1;
                        c.bytes_allocated += size;
                    } else {
                        c.alloc_failures += 1;
                    }
                });
            }
        }
        FuncClass::Free => {
            let k = AllocKey {
                ptr: ev.handle,
                tgid,
                space,
            };
            // SAFETY: the value is copied out at once.
            if let Some(size) = unsafe { ALLOCS.get(&k) }.copied() {
                ev.size = size;
            }
            if ok && cfg.aggregate != 0 {
                let _ = ALLOCS.remove(&k);
                let size = ev.size;
                bump(&ev, |c| {
                    c.frees += 1;
                    c.bytes_freed += size;
                });
            }
        }
        FuncClass::Context => {
            if ok && cfg.aggregate != 0 && func.device_arg().is_some() && ev.handle < 64 {
                let bit = 1u64 << ev.handle;
                bump(&ev, |c| c.devices |= bit);
            }
        }
        FuncClass::Launch | FuncClass::GraphLaunch => {}
    }
    if cfg.emit_events != 0 {
        emit(&ev);
    }
    Ok(())
}

/// Counts a launch in the per-CPU maps (no ring-buffer record).
#[inline(always)]
fn count_launch(ev: &CallEvent, class: FuncClass) {
    let graph = class == FuncClass::GraphLaunch;
    bump(ev, |c| {
        if graph {
            c.graph_launches += 1;
        } else {
            c.launches += 1;
        }
    });
    let key = LaunchKey {
        handle: ev.handle,
        tgid: ev.caller.host_tgid,
        func: ev.func,
        grid: ev.grid,
        block: ev.block,
    };
    if !add_one(&LAUNCHES, &key) {
        count(Counter::LaunchesFull);
    }
}

/// Adds one to this CPU's count of `key`, creating the entry (a per-CPU
/// insert sets only this CPU's value; the others start at 0). False when
/// the map is full.
#[inline(always)]
fn add_one<K>(map: &PerCpuHashMap<K, u64>, key: &K) -> bool {
    let n = match map.get_ptr_mut(key) {
        Some(n) => Some(n),
        None if map.insert(key, &1, u64::from(BPF_NOEXIST)).is_ok() => return true,
        // Another CPU created the entry meanwhile, or the map is full.
        None => map.get_ptr_mut(key),
    };
    match n {
        // SAFETY: this CPU's slot of an existing entry, valid for this run.
        Some(n) => unsafe { *n += 1 },
        None => return false,
    }
    true
}

/// Applies `f` to this CPU's counters of the calling process, creating the
/// process's entries on first sight.
#[inline(always)]
fn bump(ev: &CallEvent, f: impl FnOnce(&mut ProcCounters)) {
    let tgid = ev.caller.host_tgid;
    let mut p = PROC_COUNTS.get_ptr_mut(&tgid);
    if p.is_none() {
        if PROCS.insert(&tgid, &ev.caller, 0).is_err() {
            count(Counter::ProcsFull);
        }
        let _ = PROC_COUNTS.insert(&tgid, &ProcCounters::default(), u64::from(BPF_NOEXIST));
        p = PROC_COUNTS.get_ptr_mut(&tgid);
    }
    match p {
        // SAFETY: this CPU's slot of the process's entry, valid for this run.
        Some(p) => f(unsafe { &mut *p }),
        None => count(Counter::ProcsFull),
    }
}

#[inline(always)]
fn emit(ev: &CallEvent) {
    match EVENTS.reserve::<CallEvent>(0) {
        Some(mut slot) => {
            slot.write(*ev);
            slot.submit(0);
        }
        None => count(Counter::RingbufFull),
    }
}
