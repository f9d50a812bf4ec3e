//! Reading function arguments at a uprobe, including those passed on the
//! stack (cuLaunchKernel has 11).

use aya_ebpf::{
    helpers::{bpf_probe_read_kernel, bpf_probe_read_user},
    programs::ProbeContext,
};

/// Argument `n` (from 0) as a 64-bit integer; 0 if it cannot be read.
#[inline(always)]
pub(crate) fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    if let Some(v) = ctx.arg::<u64>(n) {
        return v;
    }
    stack_arg(ctx, n).unwrap_or(0)
}

/// Argument `n` (from 0) when `n` is known only at run time; `None` if it
/// cannot be read. The compiler turns a per-path choice of register into
/// one load from the context at an offset that differs by path, which the
/// verifier refuses; a register is therefore read with a helper here.
#[inline(always)]
pub(crate) fn arg_at(ctx: &ProbeContext, n: usize) -> Option<u64> {
    match reg_addr(ctx, n) {
        // SAFETY: `p` points into this probe hit's pt_regs; the helper checks the read.
        Some(p) => unsafe { bpf_probe_read_kernel(p) }.ok(),
        None => stack_arg(ctx, n),
    }
}

/// The address of register argument `n` in `pt_regs` (x86-64 SysV order).
#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
fn reg_addr(ctx: &ProbeContext, n: usize) -> Option<*const u64> {
    let r = ctx.regs;
    // SAFETY: only field addresses are formed from the kernel-provided
    // pt_regs pointer; nothing is dereferenced.
    unsafe {
        Some(match n {
            0 => core::ptr::addr_of!((*r).rdi),
            1 => core::ptr::addr_of!((*r).rsi),
            2 => core::ptr::addr_of!((*r).rdx),
            3 => core::ptr::addr_of!((*r).rcx),
            4 => core::ptr::addr_of!((*r).r8),
            5 => core::ptr::addr_of!((*r).r9),
            _ => return None,
        })
    }
}

/// The address of register argument `n` in `user_pt_regs` (x0..x7).
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
fn reg_addr(ctx: &ProbeContext, n: usize) -> Option<*const u64> {
    if n >= 8 {
        return None;
    }
    // SAFETY: only a field address is formed from the kernel-provided
    // pt_regs pointer (n < 8 < 31); nothing is dereferenced.
    Some(unsafe { core::ptr::addr_of!((*ctx.regs).regs[n]) })
}

/// Other architectures: no register is decoded.
#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
#[inline(always)]
fn reg_addr(_ctx: &ProbeContext, _n: usize) -> Option<*const u64> {
    None
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
