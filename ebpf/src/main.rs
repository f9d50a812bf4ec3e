//! vgpu's uprobe programs on libcuda (see docs/trace.md).
//!
//! Two programs cover every probed entry point; the attach cookie says which
//! entry point fired ([`vgpu_common::event::Func`]):
//! - `vgpu_call_entry` (uprobe): records who called and the arguments; counts
//!   launches in per-CPU maps; stashes calls whose result matters.
//! - `vgpu_call_return` (uretprobe): pairs with the stash, reads the result and
//!   out-params, updates allocation accounting, emits the per-call event.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(
    target_arch = "bpf",
    expect(
        clippy::needless_borrows_for_generic_args,
        reason = "map keys and values go by reference: no extra copies on the 512-byte BPF stack"
    )
)]

#[cfg(target_arch = "bpf")]
mod args;
#[cfg(target_arch = "bpf")]
mod caller;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod probes;

/// Host builds (`cargo build --workspace`) get an empty binary.
#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // The verifier rejects programs that could reach this; it is never linked in.
    loop {}
}

/// `bpf_probe_read_user` is GPL-only in the kernel.
#[cfg(target_arch = "bpf")]
#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
