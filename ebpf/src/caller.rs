//! Who is calling: host ids from helpers, namespace ids from the task's
//! `struct pid` using offsets the loader read from the kernel's BTF.

use aya_ebpf::helpers::{
    bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
    bpf_get_current_task, bpf_probe_read_kernel,
};
use vgpu_common::event::{Caller, Config, Counter, KernelOffsets};

use crate::maps::count;

/// The calling thread's identity.
#[inline(always)]
pub(crate) fn current(cfg: &Config) -> Caller {
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: helper without arguments, available to kprobe-type programs.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let comm = bpf_get_current_comm().unwrap_or([0; 16]);
    let ns = match ns_ids(&cfg.offsets) {
        Some(ns) => ns,
        None => {
            count(Counter::TaskReadFailed);
            NsIds::default()
        }
    };
    Caller {
        cgroup_id,
        host_tgid: (pid_tgid >> 32) as u32,
        host_pid: pid_tgid as u32,
        ns_tgid: ns.tgid,
        ns_pid: ns.pid,
        pidns_inum: ns.inum,
        _pad: 0,
        comm,
    }
}

#[derive(Default)]
struct NsIds {
    tgid: u32,
    pid: u32,
    inum: u32,
}

#[inline(always)]
fn kread<T>(addr: u64) -> Option<T> {
    if addr == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel validates the address and fails cleanly.
    unsafe { bpf_probe_read_kernel(addr as *const T) }.ok()
}

/// `task->thread_pid->numbers[level]` gives the id in the task's own pid
/// namespace (`level` is that namespace's depth) and the namespace itself;
/// the group leader's gives the process id.
#[inline(always)]
fn ns_ids(o: &KernelOffsets) -> Option<NsIds> {
    if o.upid_size == 0 {
        return None;
    }
    // SAFETY: helper without arguments; returns the current task_struct address.
    let task = unsafe { bpf_get_current_task() };
    let pid: u64 = kread(task.wrapping_add(u64::from(o.task_thread_pid)))?;
    let level: u32 = kread(pid.wrapping_add(u64::from(o.pid_level)))?;
    // Nesting is at most 32 levels (MAX_PID_NS_LEVEL); bound it for the verifier.
    let level = u64::from(level & 63);
    let slot = u64::from(o.pid_numbers) + level * u64::from(o.upid_size);
    let upid = pid.wrapping_add(slot);
    let nr: u32 = kread(upid.wrapping_add(u64::from(o.upid_nr)))?;
    let ns: u64 = kread(upid.wrapping_add(u64::from(o.upid_ns)))?;
    let inum: u32 = kread(ns.wrapping_add(u64::from(o.pidns_inum)))?;
    let leader: u64 = kread(task.wrapping_add(u64::from(o.task_group_leader)))?;
    let lpid: u64 = kread(leader.wrapping_add(u64::from(o.task_thread_pid)))?;
    let tgid: u32 = kread(lpid.wrapping_add(slot + u64::from(o.upid_nr)))?;
    Some(NsIds {
        tgid,
        pid: nr,
        inum,
    })
}
