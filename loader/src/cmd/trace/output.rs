//! `--events` lines and `--json` lines, one per call.

use std::io::{BufWriter, Stdout, Write as _};

use serde_json::{json, Value};
use vgpu_common::event::{CallEvent, Func, FuncClass, RESULT_NONE};

use super::devices::{DeviceNames, Label};
use crate::cgroup::{CgroupIndex, ContainerInfo};
use crate::printable::escape_controls;

/// Writes per-call records to stdout.
pub struct EventWriter {
    json: bool,
    out: BufWriter<Stdout>,
    devices: DeviceNames,
}

impl EventWriter {
    /// Text lines, or JSON lines when `json`.
    pub fn new(json: bool) -> EventWriter {
        EventWriter {
            json,
            out: BufWriter::new(std::io::stdout()),
            devices: DeviceNames::new(),
        }
    }

    /// Writes one record; false when stdout is gone.
    pub fn write(&mut self, ev: &CallEvent, cgroups: &mut CgroupIndex) -> bool {
        let label = device_ordinal(ev).map(|o| self.devices.label(ev.caller.host_tgid, o));
        let line = if self.json {
            to_json(ev, label.as_ref(), cgroups).to_string()
        } else {
            to_text(ev, label.as_ref())
        };
        writeln!(self.out, "{line}").is_ok()
    }

    /// Flushes buffered lines.
    pub fn flush(&mut self) {
        let _ = self.out.flush();
    }
}

/// `0x…` for pointers and handles.
fn hex(v: u64) -> String {
    format!("{v:#x}")
}

fn func_name(ev: &CallEvent) -> String {
    ev.func()
        .map_or_else(|| format!("func#{}", ev.func), |f| f.symbol().to_owned())
}

/// The CUDA ordinal a context call names, if it takes a device and the
/// probe could read it.
pub fn device_ordinal(ev: &CallEvent) -> Option<i32> {
    ev.func()?.device_arg()?;
    // The probe keeps the low 32 bits, a C int (DEVICE_UNKNOWN is above them).
    u32::try_from(ev.handle).ok().map(|d| d as i32)
}

/// The call's arguments and outputs as a JSON object (see docs/trace.md);
/// `device` names the device of a context call.
pub fn args_json(ev: &CallEvent, device: Option<&Label>) -> Value {
    let Some(f) = ev.func() else {
        return json!({});
    };
    match f.class() {
        FuncClass::Launch => json!({
            "function": hex(ev.handle),
            "grid": ev.grid,
            "block": ev.block,
            "shared_mem_bytes": ev.shmem,
            "stream": hex(ev.stream),
        }),
        FuncClass::GraphLaunch => json!({
            "graph_exec": hex(ev.handle),
            "stream": hex(ev.stream),
        }),
        FuncClass::Alloc if f == Func::MemCreate => json!({
            "size": ev.size,
            "handle": hex(ev.handle),
        }),
        FuncClass::Alloc => {
            let mut v = json!({ "bytesize": ev.size, "dptr": hex(ev.handle) });
            if matches!(
                f,
                Func::MemAllocAsync
                    | Func::MemAllocAsyncPtsz
                    | Func::MemAllocFromPoolAsync
                    | Func::MemAllocFromPoolAsyncPtsz
            ) {
                v["stream"] = json!(hex(ev.stream));
            }
            v
        }
        FuncClass::Free if f == Func::MemRelease => json!({
            "handle": hex(ev.handle),
            "size": ev.size,
        }),
        FuncClass::Context => {
            let mut v = json!({});
            if let Some(l) = device {
                v["device"] = json!(l.ordinal);
                if let Some(d) = &l.device {
                    v["device_uuid"] = json!(d.uuid);
                    v["device_index"] = json!(d.index);
                }
            }
            v
        }
        FuncClass::Free => {
            let mut v = json!({ "dptr": hex(ev.handle), "bytes": ev.size });
            if matches!(f, Func::MemFreeAsync | Func::MemFreeAsyncPtsz) {
                v["stream"] = json!(hex(ev.stream));
            }
            v
        }
    }
}

/// One JSON object with every field of the record.
pub fn to_json(ev: &CallEvent, device: Option<&Label>, cgroups: &mut CgroupIndex) -> Value {
    let c = &ev.caller;
    let path = cgroups.path(c.cgroup_id).map(str::to_owned);
    let info = path
        .as_deref()
        .map(ContainerInfo::from_path)
        .unwrap_or_default();
    json!({
        "ts_ns": ev.ts_ns,
        "host_tgid": c.host_tgid,
        "host_pid": c.host_pid,
        "ns_tgid": c.ns_tgid,
        "ns_pid": c.ns_pid,
        "pidns_inum": c.pidns_inum,
        "cgroup_id": c.cgroup_id,
        "cgroup": path,
        "pod_uid": info.pod_uid,
        "container_id": info.container_id,
        "comm": c.comm_str(),
        "func": func_name(ev),
        "args": args_json(ev, device),
        "result": (ev.result != RESULT_NONE).then_some(ev.result),
        "result_name": (ev.result != RESULT_NONE).then(|| cu_result_name(ev.result)),
        "duration_ns": ev.duration_ns,
    })
}

/// One human-readable line.
pub fn to_text(ev: &CallEvent, device: Option<&Label>) -> String {
    let c = &ev.caller;
    let args = match args_json(ev, device) {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| format!("{k}={}", v.to_string().trim_matches('"')))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    let result = if ev.result == RESULT_NONE {
        String::new()
    } else {
        format!(" -> {} ({})", ev.result, cu_result_name(ev.result))
    };
    format!(
        "{:>12.6} {:<28} pid {}/{} ns {}/{} pidns {} cgroup {} comm {:<15} {args}{result}",
        ev.ts_ns as f64 / 1e9,
        func_name(ev),
        c.host_tgid,
        c.host_pid,
        c.ns_tgid,
        c.ns_pid,
        c.pidns_inum,
        c.cgroup_id,
        // A process names itself: no newline or escape reaches the terminal.
        escape_controls(&c.comm_str()),
    )
}

/// The name of a `CUresult` (the common ones; others as `CUDA_ERROR_<n>`).
pub fn cu_result_name(r: u32) -> String {
    let s = match r {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        500 => "CUDA_ERROR_NOT_FOUND",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        701 => "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => return format!("CUDA_ERROR_{r}"),
    };
    s.to_owned()
}

#[cfg(test)]
mod tests {
    use vgpu_common::{devices::OrdinalDevice, event::DEVICE_UNKNOWN};

    use super::*;

    fn context(func: Func, handle: u64) -> CallEvent {
        CallEvent {
            func: func.id(),
            handle,
            ..CallEvent::default()
        }
    }

    #[test]
    fn a_context_call_names_its_device_as_far_as_known() {
        let ev = context(Func::CtxCreateV4, 0xffff_ffff);
        assert_eq!(device_ordinal(&ev), Some(-1));
        let ev = context(Func::CtxCreate, 1);
        assert_eq!(device_ordinal(&ev), Some(1));
        let known = Label {
            ordinal: 1,
            device: Some(OrdinalDevice {
                uuid: "GPU-b".into(),
                index: 0,
            }),
        };
        assert_eq!(
            args_json(&ev, Some(&known)),
            json!({"device": 1, "device_uuid": "GPU-b", "device_index": 0})
        );
        let line = to_text(&ev, Some(&known));
        assert!(
            line.contains(" device=1 device_index=0 device_uuid=GPU-b -> 0 (CUDA_SUCCESS)"),
            "{line}"
        );
        let ordinal_only = Label {
            ordinal: 1,
            device: None,
        };
        assert_eq!(args_json(&ev, Some(&ordinal_only)), json!({"device": 1}));
        // Unread by the probe; no device argument at all.
        assert_eq!(
            device_ordinal(&context(Func::CtxCreate, DEVICE_UNKNOWN)),
            None
        );
        assert_eq!(device_ordinal(&context(Func::Init, 0)), None);
        assert_eq!(args_json(&context(Func::Init, 0), None), json!({}));
    }

    /// A process named with a newline and an escape sequence stays on its
    /// line and drives no terminal.
    #[test]
    fn a_process_name_is_escaped() {
        let mut ev = context(Func::Init, 0);
        let name = b"x\nFAKE\x1b[2J";
        ev.caller.comm[..name.len()].copy_from_slice(name);
        let line = to_text(&ev, None);
        assert!(line.contains(r"comm x\nFAKE\x1b[2J"), "{line:?}");
    }
}
