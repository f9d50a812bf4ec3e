//! Kernel launches through every entry point. A launch computes the
//! kernel's duration (see `simgpu::model`), blocks only when its stream is
//! already more than `SIMGPU_QUEUE_MS` ahead of now, and queues the kernel
//! on the shared device timeline (`simgpu::timeline::schedule`); a launch
//! into a capturing stream becomes a node of the capture's graph instead
//! (`capture.rs`).

use std::ffi::{c_uint, c_void};

use crate::graph::Node;
use crate::state::{with, Driver};
use crate::stream::Resolved;
use crate::{get, guard, CUresult, CuErr, Handle};

/// Launch geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

impl Geometry {
    fn validate(&self) -> Result<(), CuErr> {
        if self.grid.contains(&0) || self.block.contains(&0) {
            return Err(CuErr::InvalidValue);
        }
        let threads: u64 = self.block.iter().map(|&b| u64::from(b)).product();
        if threads > 1024 || self.block[2] > 64 {
            return Err(CuErr::InvalidValue);
        }
        Ok(())
    }

    fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| u64::from(g)).product()
    }

    fn threads(&self) -> u64 {
        self.block.iter().map(|&b| u64::from(b)).product()
    }
}

impl Driver {
    /// Duration of one launch of `f` with geometry `g`.
    pub(crate) fn kernel_duration(&self, f: Handle, g: &Geometry) -> Result<u64, CuErr> {
        let func = self.funcs.get(&f).ok_or(CuErr::InvalidHandle)?;
        let (sms, wave) = (self.cfg.sms, self.cfg.wave_ns);
        Ok(simgpu::model::kernel_ns(
            func.name_ns,
            crate::control::kernel_ns_override(),
            self.pcfg.kernel_ns,
            || simgpu::model::geometry_ns(g.grid, g.block, sms, wave),
        ))
    }
}

/// Queues work on a stream: `prepare` returns the durations of the kernels
/// to run back to back (it may fail, e.g. a graph's memory does not fit).
/// Blocks first while the stream is more than `SIMGPU_QUEUE_MS` ahead.
/// Returns when the work ends (monotonic ns).
pub(crate) fn submit(
    stream: Handle,
    per_thread: bool,
    mut prepare: impl FnMut(&mut Driver, &Resolved) -> Result<Vec<u64>, CuErr>,
) -> Result<u64, CuErr> {
    loop {
        let wait = with(|d| {
            let r = d.resolve_stream(stream, per_thread)?;
            let last = d.stream_end_of(&r);
            let now = simgpu::clock::mono_ns();
            let queue = d.pcfg.queue_ms.saturating_mul(1_000_000);
            if last > now.saturating_add(queue) {
                return Ok(Err(last - queue));
            }
            let durations = prepare(d, &r)?;
            let s = simgpu::timeline::schedule(d.shm(), d.slot, r.dev, last, &durations)?;
            d.note_end(&r, s.end);
            Ok(Ok(s.end))
        })?;
        match wait {
            Err(t) => simgpu::clock::wait_until(t),
            Ok(end) => return Ok(end),
        }
    }
}

fn launch(
    f: Handle,
    g: Geometry,
    stream: Handle,
    per_thread: bool,
    cooperative: bool,
) -> Result<(), CuErr> {
    if f == 0 {
        return Err(CuErr::InvalidHandle);
    }
    g.validate()?;
    let duration = |d: &Driver| {
        if cooperative {
            let per_wave = u64::from(d.cfg.sms) * simgpu::model::blocks_per_sm(g.threads());
            if g.blocks() > per_wave {
                return Err(CuErr::CooperativeLaunchTooLarge);
            }
        }
        d.kernel_duration(f, &g)
    };
    let node = |d: &Driver| duration(d).map(|_| vec![Node::Kernel { f, g }]);
    if crate::capture::captured(stream, per_thread, node)? {
        return Ok(());
    }
    submit(stream, per_thread, |d, _| Ok(vec![duration(d)?])).map(|_| ())
}

/// `cuLaunchKernel`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared_mem: c_uint,
    stream: Handle,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    let g = Geometry {
        grid: [gx, gy, gz],
        block: [bx, by, bz],
    };
    guard(|| launch(f, g, stream, false, false))
}

/// `cuLaunchKernel_ptsz`: NULL stream = per-thread default stream.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared_mem: c_uint,
    stream: Handle,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    let g = Geometry {
        grid: [gx, gy, gz],
        block: [bx, by, bz],
    };
    guard(|| launch(f, g, stream, true, false))
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem: c_uint,
    stream: Handle,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

fn launch_ex(config: *const LaunchConfig, f: Handle, per_thread: bool) -> Result<(), CuErr> {
    let c = get!(config);
    let g = Geometry {
        grid: c.grid,
        block: c.block,
    };
    launch(f, g, c.stream, per_thread, false)
}

/// `cuLaunchKernelEx` (launch attributes are ignored).
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    f: Handle,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    guard(|| launch_ex(config, f, false))
}

/// `cuLaunchKernelEx_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfig,
    f: Handle,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    guard(|| launch_ex(config, f, true))
}

/// `cuLaunchCooperativeKernel`: all blocks must be resident at once.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared_mem: c_uint,
    stream: Handle,
    _params: *mut *mut c_void,
) -> CUresult {
    let g = Geometry {
        grid: [gx, gy, gz],
        block: [bx, by, bz],
    };
    guard(|| launch(f, g, stream, false, true))
}

/// `cuLaunchCooperativeKernel_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared_mem: c_uint,
    stream: Handle,
    _params: *mut *mut c_void,
) -> CUresult {
    let g = Geometry {
        grid: [gx, gy, gz],
        block: [bx, by, bz],
    };
    guard(|| launch(f, g, stream, true, true))
}
