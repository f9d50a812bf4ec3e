//! Reading function arguments at a uprobe, including those passed on the
//! stack (cuLaunchKernel has 11).

use aya_ebpf::{helpers::bpf_probe_read_user, programs::ProbeContext};

/// Argument `n` (from 0) as a 64-bit integer; 0 if it cannot be read.
#[inline(always)]
pub(crate) fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    if let Some(v) = ctx.arg::<u64>(n) {
        return v;
    }
    stack_arg(ctx, n).unwrap_or(0)
}

/// x86-64 SysV: six register arguments, then the stack; at the first
/// instruction `[rsp]` is the return address, so argument 6 is at `rsp + 8`.
#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
fn stack_arg(ctx: &ProbeContext, n: usize) -> Option<u64> {
    if n < 6 {
        return None;
    }
    // SAFETY: ctx.regs is the kernel-provided pt_regs of this probe hit.
    let sp = unsafe { (*ctx.regs).rsp };
    let addr = sp.wrapping_add(8 * (n as u64 - 5));
    // SAFETY: bpf_probe_read_user checks the address; a bad one is an error.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// AArch64 AAPCS64: eight register arguments, then the stack at `sp`.
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
fn stack_arg(ctx: &ProbeContext, n: usize) -> Option<u64> {
    if n < 8 {
        return None;
    }
    // SAFETY: ctx.regs is the kernel-provided pt_regs of this probe hit.
    let sp = unsafe { (*ctx.regs).sp };
    let addr = sp.wrapping_add(8 * (n as u64 - 8));
    // SAFETY: bpf_probe_read_user checks the address; a bad one is an error.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// Other architectures: stack arguments are not decoded (read as 0).
#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
#[inline(always)]
fn stack_arg(_ctx: &ProbeContext, _n: usize) -> Option<u64> {
    None
}

/// Reads a `T` from the traced process's memory.
#[inline(always)]
pub(crate) fn read_user<T>(addr: u64) -> Option<T> {
    if addr == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_user validates the address and fails cleanly.
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}
