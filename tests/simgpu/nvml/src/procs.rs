//! Per-process queries: running compute processes (memory) and per-process
//! utilization samples, with PIDs as the caller's PID namespace sees them.

use crate::{guard, index, put, with, NvmlDevice, NvmlErr, NvmlReturn};

/// `nvmlProcessInfo_v1_t` (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcessInfoV1 {
    pid: u32,
    used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` of the `_v2` / `_v3` calls (24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcessInfoV2 {
    pid: u32,
    used_gpu_memory: u64,
    gpu_instance_id: u32,
    compute_instance_id: u32,
}

/// `NVML_VALUE_NOT_AVAILABLE` for instance ids (no MIG).
const NOT_AVAILABLE_U32: u32 = u32::MAX;

/// `(pid, used bytes)` of processes holding a context on the device, one
/// entry per PID, as the real driver lists them: host PIDs for a caller in
/// the host's PID namespace; inside a container only the processes of the
/// caller's namespace, with their namespace PIDs.
fn running(dev: NvmlDevice) -> Result<Vec<(u32, u64)>, NvmlErr> {
    let caller_ns = simgpu::pids::pid_ns_inode();
    with(|s| {
        let i = index(s, dev)?;
        let mut out: Vec<(u32, u64)> = Vec::new();
        for p in s.client.shm().processes(i) {
            if p.contexts == 0 {
                continue;
            }
            let Some(pid) = simgpu::pids::visible_pid(caller_ns, p.pid, p.ns_pid, p.pid_ns) else {
                continue;
            };
            match out.iter_mut().find(|(q, _)| *q == pid) {
                Some(e) => e.1 += p.used,
                None => out.push((pid, p.used)),
            }
        }
        Ok(out)
    })
}

/// The span a sampled query covers, ending now: the last `SIMGPU_SAMPLE_MS`
/// for `last_seen == 0`, else everything since `last_seen` (Unix µs), at
/// least one sample period and at most 2 s. Real NVML returns one sample
/// per internal period since `last_seen`; their mean is this span's.
pub(crate) fn sampled_span_ns(sample_ms: u64, last_seen: u64) -> u64 {
    let window = sample_ms * 1_000_000;
    if last_seen == 0 {
        return window;
    }
    let since = simgpu::clock::real_us_to_mono(last_seen);
    simgpu::clock::mono_ns()
        .saturating_sub(since)
        .clamp(window, window.max(2_000_000_000))
}

/// Fills a caller's array in the NVML convention: too small (or NULL with
/// a non-zero need) sets `*count` to the need and is `INSUFFICIENT_SIZE`.
pub(crate) fn fill<T>(count: *mut u32, infos: *mut T, items: Vec<T>) -> Result<(), NvmlErr> {
    if count.is_null() {
        return Err(NvmlErr::InvalidArgument);
    }
    // SAFETY: non-NULL in/out count from the caller (API contract).
    let cap = unsafe { count.read() } as usize;
    let n = items.len();
    put!(count, n as u32);
    if n == 0 {
        return Ok(());
    }
    if infos.is_null() || cap < n {
        return Err(NvmlErr::InsufficientSize);
    }
    for (k, item) in items.into_iter().enumerate() {
        // SAFETY: the caller's array holds `cap` >= n elements.
        unsafe { infos.add(k).write(item) };
    }
    Ok(())
}

fn v1(dev: NvmlDevice, count: *mut u32, infos: *mut ProcessInfoV1) -> Result<(), NvmlErr> {
    let items = running(dev)?
        .into_iter()
        .map(|(pid, used)| ProcessInfoV1 {
            pid,
            used_gpu_memory: used,
        })
        .collect();
    fill(count, infos, items)
}

fn v2(dev: NvmlDevice, count: *mut u32, infos: *mut ProcessInfoV2) -> Result<(), NvmlErr> {
    let items = running(dev)?
        .into_iter()
        .map(|(pid, used)| ProcessInfoV2 {
            pid,
            used_gpu_memory: used,
            gpu_instance_id: NOT_AVAILABLE_U32,
            compute_instance_id: NOT_AVAILABLE_U32,
        })
        .collect();
    fill(count, infos, items)
}

/// `nvmlDeviceGetComputeRunningProcesses` (v1 structs).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    dev: NvmlDevice,
    count: *mut u32,
    infos: *mut ProcessInfoV1,
) -> NvmlReturn {
    guard(|| v1(dev, count, infos))
}

/// `nvmlDeviceGetComputeRunningProcesses_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    dev: NvmlDevice,
    count: *mut u32,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    guard(|| v2(dev, count, infos))
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: NvmlDevice,
    count: *mut u32,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    guard(|| v2(dev, count, infos))
}

fn none<T>(dev: NvmlDevice, count: *mut u32, infos: *mut T) -> Result<(), NvmlErr> {
    with(|s| index(s, dev))?;
    fill(count, infos, Vec::new())
}

/// `nvmlDeviceGetGraphicsRunningProcesses`: always empty.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    dev: NvmlDevice,
    count: *mut u32,
    infos: *mut ProcessInfoV1,
) -> NvmlReturn {
    guard(|| none(dev, count, infos))
}

/// `nvmlDeviceGetGraphicsRunningProcesses_v2`: always empty.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    dev: NvmlDevice,
    count: *mut u32,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    guard(|| none(dev, count, infos))
}

/// `nvmlDeviceGetGraphicsRunningProcesses_v3`: always empty.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    dev: NvmlDevice,
    count: *mut u32,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    guard(|| none(dev, count, infos))
}

/// `nvmlDeviceGetMPSComputeRunningProcesses_v3`: always empty.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    dev: NvmlDevice,
    count: *mut u32,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    guard(|| none(dev, count, infos))
}

/// `nvmlProcessUtilizationSample_t` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcessUtilizationSample {
    pid: u32,
    time_stamp: u64,
    sm_util: u32,
    mem_util: u32,
    enc_util: u32,
    dec_util: u32,
}

/// `nvmlDeviceGetProcessUtilization`: one sample per process that ran
/// kernels after `lastSeenTimeStamp` (µs since the epoch; 0 = all
/// buffered), PIDs as for the process list (driver R580 samples a
/// container's own processes under their namespace PIDs to callers inside
/// it, and leaves out the host's). `smUtil` is the process's share of the last
/// `SIMGPU_SAMPLE_MS`; `timeStamp` is when its latest kernel activity
/// ended. No process: `NVML_ERROR_NOT_FOUND`, as the real library.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    dev: NvmlDevice,
    samples: *mut ProcessUtilizationSample,
    count: *mut u32,
    last_seen: u64,
) -> NvmlReturn {
    let caller_ns = simgpu::pids::pid_ns_inode();
    guard(|| {
        let items: Vec<ProcessUtilizationSample> = with(|s| {
            let i = index(s, dev)?;
            if !s.pcfg.process_util {
                return Err(NvmlErr::NotSupported);
            }
            let window = sampled_span_ns(s.pcfg.sample_ms, last_seen);
            let since = if last_seen == 0 {
                0
            } else {
                simgpu::clock::real_us_to_mono(last_seen)
            };
            let mut by_pid: Vec<ProcessUtilizationSample> = Vec::new();
            let shm = s.client.shm();
            for p in simgpu::timeline::process_busy(shm, i, since, window) {
                let Some(sl) = shm.slot(p.slot) else { continue };
                let ns_pid = sl.ns_pid.load(std::sync::atomic::Ordering::Relaxed);
                let pid_ns = sl.pid_ns.load(std::sync::atomic::Ordering::Relaxed);
                let Some(pid) = simgpu::pids::visible_pid(caller_ns, p.pid, ns_pid, pid_ns) else {
                    continue;
                };
                let util = ((p.busy_ns * 100 + window / 2) / window).min(100) as u32;
                let ts = simgpu::clock::mono_to_real_us(p.last_active);
                match by_pid.iter_mut().find(|x| x.pid == pid) {
                    Some(x) => {
                        x.sm_util = (x.sm_util + util).min(100);
                        x.time_stamp = x.time_stamp.max(ts);
                    }
                    None => by_pid.push(ProcessUtilizationSample {
                        pid,
                        time_stamp: ts,
                        sm_util: util,
                        mem_util: util / 2,
                        enc_util: 0,
                        dec_util: 0,
                    }),
                }
            }
            Ok(by_pid)
        })?;
        if items.is_empty() {
            if !count.is_null() {
                put!(count, 0);
            }
            return Err(NvmlErr::NotFound);
        }
        fill(count, samples, items)
    })
}
