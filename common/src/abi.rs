//! The ABI snapshot: every layout that crosses a process or the kernel
//! boundary, rendered as text (size, alignment, each field's offset and
//! size) and compared with a file checked into the repository.
//!
//! The compile-time asserts next to each layout pin the fields HAMi's
//! monitor and the eBPF programs depend on; the snapshot catches every
//! other change, including one nobody thought to assert. A change that is
//! meant is blessed with `cargo xtask abi --bless`, which rewrites the file
//! so the diff shows up in review.

use std::fmt::Write as _;
use std::path::Path;

/// Environment variable that makes [`check`] rewrite the snapshot instead of
/// comparing (set by `cargo xtask abi --bless`).
pub const BLESS_ENV: &str = "VGPU_ABI_BLESS";

/// Size of a field, from a projection `|s: &T| &s.field`.
pub fn field_size<T, F>(_project: fn(&T) -> &F) -> usize {
    core::mem::size_of::<F>()
}

/// Appends one layout to a snapshot: `abi_layout!(out, Type { field, ... })`.
#[macro_export]
macro_rules! abi_layout {
    ($out:expr, $ty:ty { $($field:ident),* $(,)? }) => {{
        let out: &mut String = $out;
        $crate::abi::push_type(
            out,
            stringify!($ty),
            core::mem::size_of::<$ty>(),
            core::mem::align_of::<$ty>(),
        );
        $(
            $crate::abi::push_field(
                out,
                stringify!($field),
                core::mem::offset_of!($ty, $field),
                $crate::abi::field_size(|s: &$ty| &s.$field),
            );
        )*
    }};
}

#[doc(hidden)]
pub fn push_type(out: &mut String, name: &str, size: usize, align: usize) {
    let _ = writeln!(out, "{name} size={size} align={align}");
}

#[doc(hidden)]
pub fn push_field(out: &mut String, name: &str, offset: usize, size: usize) {
    let _ = writeln!(out, "  {name} offset={offset} size={size}");
}

/// Why a snapshot does not match.
#[derive(Debug, thiserror::Error)]
pub enum AbiError {
    #[error("cannot read the ABI snapshot {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the ABI snapshot {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "a cross-process layout changed; {path} differs from the code:\n{diff}\n\
         if the change is meant, run `cargo xtask abi --bless` and commit the file"
    )]
    Drift { path: String, diff: String },
}

/// Compares `text` with the snapshot at `path`, or rewrites the file when
/// [`BLESS_ENV`] is set.
pub fn check(path: &Path, text: &str) -> Result<(), AbiError> {
    let shown = path.display().to_string();
    if std::env::var_os(BLESS_ENV).is_some() {
        return std::fs::write(path, text).map_err(|source| AbiError::Write {
            path: shown,
            source,
        });
    }
    let old = std::fs::read_to_string(path).map_err(|source| AbiError::Read {
        path: shown.clone(),
        source,
    })?;
    if old == text {
        return Ok(());
    }
    Err(AbiError::Drift {
        path: shown,
        diff: line_diff(&old, text),
    })
}

/// The lines only in `old` (`-`) and only in `new` (`+`), in order: enough
/// to name the field that moved.
fn line_diff(old: &str, new: &str) -> String {
    let mut out = String::new();
    for l in old.lines().filter(|l| !new.lines().any(|n| n == *l)) {
        let _ = writeln!(out, "- {l}");
    }
    for l in new.lines().filter(|l| !old.lines().any(|o| o == *l)) {
        let _ = writeln!(out, "+ {l}");
    }
    out
}

/// Every layout `common` defines: the shared region, the SM sidecar with
/// the daemon's plans, and the records shared with the eBPF programs.
pub fn render() -> String {
    use crate::event::{
        AllocKey, CallEvent, Caller, Config, KernelOffsets, LaunchKey, Pending, PendingKey,
        ProcCounters,
    };
    use crate::region::{DeviceMemory, DeviceUtil, ProcSlot, SharedRegion};
    use crate::sidecar::{DevBucket, DevPlan, SmShared};

    let mut s = String::from("# cargo xtask abi --bless rewrites this file\n");
    abi_layout!(
        &mut s,
        DeviceMemory {
            context_size,
            module_size,
            data_size,
            offset,
            total,
            launches,
            host_bytes,
            unused
        }
    );
    abi_layout!(
        &mut s,
        DeviceUtil {
            dec_util,
            enc_util,
            sm_util,
            unused
        }
    );
    abi_layout!(
        &mut s,
        ProcSlot {
            pid,
            hostpid,
            used,
            monitorused,
            device_util,
            status,
            _pad,
            seqlock,
            pidns,
            start,
        }
    );
    abi_layout!(
        &mut s,
        SharedRegion {
            initialized_flag,
            major_version,
            minor_version,
            sm_init_flag,
            owner_pid,
            sem,
            device_num,
            uuids,
            limit,
            sm_limit,
            procs,
            proc_num,
            utilization_switch,
            recent_kernel,
            priority,
            last_kernel_time,
            sem_postinit,
        }
    );
    abi_layout!(
        &mut s,
        DevPlan {
            seq,
            planned_until,
            turn,
            hold_until,
            high_inflight_until,
            outranked_until,
            daemon_reserved,
            launched,
            wants,
            inflight_until,
            hook_reserved
        }
    );
    abi_layout!(
        &mut s,
        DevBucket {
            tat,
            charged_ns,
            throttled,
            ctx_bytes,
            gain,
            lease,
            measured_at,
            busy_until,
        }
    );
    abi_layout!(
        &mut s,
        SmShared {
            magic,
            version,
            size,
            container,
            reserved,
            devs,
            plans
        }
    );
    abi_layout!(
        &mut s,
        KernelOffsets {
            task_thread_pid,
            task_group_leader,
            pid_level,
            pid_numbers,
            upid_size,
            upid_nr,
            upid_ns,
            pidns_inum,
        }
    );
    abi_layout!(
        &mut s,
        Config {
            offsets,
            emit_events,
            aggregate
        }
    );
    abi_layout!(
        &mut s,
        Caller {
            cgroup_id,
            host_tgid,
            host_pid,
            ns_tgid,
            ns_pid,
            pidns_inum,
            _pad,
            comm
        }
    );
    abi_layout!(
        &mut s,
        CallEvent {
            ts_ns,
            duration_ns,
            caller,
            func,
            result,
            handle,
            size,
            stream,
            grid,
            block,
            shmem,
            _pad,
        }
    );
    abi_layout!(
        &mut s,
        PendingKey {
            pid_tgid,
            func,
            _pad
        }
    );
    abi_layout!(
        &mut s,
        Pending {
            event,
            out_ptr,
            out_ptr2
        }
    );
    abi_layout!(
        &mut s,
        LaunchKey {
            handle,
            tgid,
            func,
            grid,
            block
        }
    );
    abi_layout!(&mut s, AllocKey { ptr, tgid, space });
    abi_layout!(
        &mut s,
        ProcCounters {
            launches,
            graph_launches,
            allocs,
            alloc_failures,
            frees,
            bytes_allocated,
            bytes_freed,
            devices,
        }
    );
    render_wire_ids(&mut s);
    s
}

/// The wire values the eBPF programs and the loader agree on: every
/// [`Func`](crate::event::Func) id with its symbol, class and device
/// argument, every
/// [`Counter`](crate::event::Counter) index with its name.
fn render_wire_ids(s: &mut String) {
    use crate::event::{Counter, Func};

    let mut funcs: Vec<Func> = Func::ALL.into_iter().chain(Func::CONTEXT).collect();
    funcs.sort_by_key(|f| f.id());
    for f in funcs {
        let back = Func::from_id(f.id()).map_or("none", Func::symbol);
        let device = f
            .device_arg()
            .map_or_else(String::new, |n| format!(" device_arg={n}"));
        let _ = writeln!(
            s,
            "Func::{f:?} = {} symbol={} class={:?} from_id={back}{device}",
            f.id(),
            f.symbol(),
            f.class()
        );
    }
    for c in Counter::ALL {
        let _ = writeln!(s, "Counter::{c:?} = {} name={}", c as u32, c.name());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails when any layout above drifts from `common/abi.snapshot`.
    #[test]
    fn abi_snapshot() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("abi.snapshot");
        if let Err(e) = check(&path, &render()) {
            panic!("{e}");
        }
    }

    #[test]
    fn a_moved_field_is_named() {
        mod old {
            #[repr(C)]
            pub struct S {
                pub x: u32,
                pub y: u64,
            }
        }
        mod new {
            #[repr(C)]
            pub struct S {
                pub x: u64,
                pub y: u64,
            }
        }
        let (mut a, mut b) = (String::new(), String::new());
        {
            use old::S;
            abi_layout!(&mut a, S { x, y });
        }
        {
            use new::S;
            abi_layout!(&mut b, S { x, y });
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        std::fs::write(&p, &a).unwrap();
        assert!(check(&p, &a).is_ok());
        let err = check(&p, &b).unwrap_err().to_string();
        assert!(err.contains("-   x offset=0 size=4"), "{err}");
        assert!(err.contains("+   x offset=0 size=8"), "{err}");
        assert!(!err.contains("y offset=8"), "{err}");
    }
}
