//! CUDA graphs. Kernel nodes of a launched graph run back to back, in the
//! order they were added (dependencies are accepted but not reordered).
//! Memory-allocation nodes cost nothing until the first launch of an
//! instantiated graph, which charges all of them (or fails with
//! `CUDA_ERROR_OUT_OF_MEMORY`); the memory stays charged until
//! `cuGraphExecDestroy`, or `cuDeviceGraphMemTrim` while the graph is idle
//! (the next launch charges it again).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};

use crate::launch::{submit, Geometry};
use crate::pool::{PropsHead, LOCATION_DEVICE};
use crate::state::with;
use crate::{get, guard, put, CUdevice, CUdeviceptr, CUresult, CuErr, Handle};

/// A graph node.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Node {
    Kernel { f: Handle, g: Geometry },
    MemAlloc { dev: u32, bytes: u64 },
    Other,
}

/// An instantiated graph.
#[derive(Debug, Clone, Default)]
pub(crate) struct Exec {
    kernels: Vec<(Handle, Geometry)>,
    allocs: Vec<(u32, u64)>,
    allocated: bool,
    last_end: u64,
}

/// Graph state of the process.
#[derive(Debug, Default)]
pub(crate) struct Graphs {
    graphs: HashMap<Handle, Vec<Node>>,
    execs: HashMap<Handle, Exec>,
    /// Per device: graph memory charged now, and its high-water mark.
    used: HashMap<u32, u64>,
    high: HashMap<u32, u64>,
}

impl Graphs {
    /// Adds a graph made of `nodes` (a stream capture's).
    pub(crate) fn add(&mut self, h: Handle, nodes: Vec<Node>) {
        self.graphs.insert(h, nodes);
    }

    /// The kernel nodes of an instantiated graph (launched into a capture).
    pub(crate) fn kernel_nodes(&self, exec: Handle) -> Result<Vec<Node>, CuErr> {
        let e = self.execs.get(&exec).ok_or(CuErr::InvalidValue)?;
        Ok(e.kernels
            .iter()
            .map(|&(f, g)| Node::Kernel { f, g })
            .collect())
    }

    fn note(&mut self, dev: u32, delta: i64) {
        let u = self.used.entry(dev).or_insert(0);
        *u = u.saturating_add_signed(delta);
        let now = *u;
        let h = self.high.entry(dev).or_insert(0);
        *h = (*h).max(now);
    }
}

fn add_node(
    ph: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    node: Node,
) -> Result<(), CuErr> {
    if ph.is_null() || (ndeps > 0 && deps.is_null()) {
        return Err(CuErr::InvalidValue);
    }
    let h = with(|d| {
        let nodes = d.graphs.graphs.get_mut(&graph).ok_or(CuErr::InvalidValue)?;
        nodes.push(node);
        Ok(d.new_handle())
    })?;
    put!(ph, h);
    Ok(())
}

/// `cuGraphCreate`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut Handle, _flags: u32) -> CUresult {
    guard(|| {
        if graph.is_null() {
            return Err(CuErr::InvalidValue);
        }
        let h = with(|d| {
            let h = d.new_handle();
            d.graphs.graphs.insert(h, Vec::new());
            Ok(h)
        })?;
        put!(graph, h);
        Ok(())
    })
}

/// `cuGraphDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            d.graphs
                .graphs
                .remove(&graph)
                .map(|_| ())
                .ok_or(CuErr::InvalidValue)
        })
    })
}

/// `CUDA_KERNEL_NODE_PARAMS` (v1 layout; v2 appends `kern` and `ctx`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelNodeParams {
    func: Handle,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelNodeParamsV2 {
    base: KernelNodeParams,
    kern: Handle,
    ctx: Handle,
}

fn kernel_node(p: KernelNodeParams, kern: Handle) -> Result<Node, CuErr> {
    let f = if p.func != 0 { p.func } else { kern };
    with(|d| d.funcs.get(&f).map(|_| ()).ok_or(CuErr::InvalidValue))?;
    Ok(Node::Kernel {
        f,
        g: Geometry {
            grid: p.grid,
            block: p.block,
        },
    })
}

/// `cuGraphAddKernelNode_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    ph: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    params: *const KernelNodeParamsV2,
) -> CUresult {
    guard(|| {
        let p = get!(params);
        add_node(ph, graph, deps, ndeps, kernel_node(p.base, p.kern)?)
    })
}

/// `cuGraphAddKernelNode` (v1 parameters).
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    ph: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    params: *const KernelNodeParams,
) -> CUresult {
    guard(|| {
        let p = get!(params);
        add_node(ph, graph, deps, ndeps, kernel_node(p, 0)?)
    })
}

/// `cuGraphAddEmptyNode`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    ph: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
) -> CUresult {
    guard(|| add_node(ph, graph, deps, ndeps, Node::Other))
}

/// `cuGraphAddMemsetNode` (no time, no cost).
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemsetNode(
    ph: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    params: *const c_void,
    _ctx: Handle,
) -> CUresult {
    guard(|| {
        if params.is_null() {
            return Err(CuErr::InvalidValue);
        }
        add_node(ph, graph, deps, ndeps, Node::Other)
    })
}

/// `cuGraphAddMemcpyNode` (no time, no cost).
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemcpyNode(
    ph: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    params: *const c_void,
    _ctx: Handle,
) -> CUresult {
    guard(|| {
        if params.is_null() {
            return Err(CuErr::InvalidValue);
        }
        add_node(ph, graph, deps, ndeps, Node::Other)
    })
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`poolProps` is 88 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAllocNodeParams {
    props: PropsHead,
    _props_rest: [u8; 72],
    access_descs: *const c_void,
    access_desc_count: usize,
    bytesize: usize,
    dptr: CUdeviceptr,
}

/// `cuGraphAddMemAllocNode`: fills in `dptr`; memory is charged at the
/// first launch of an instantiation.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    ph: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    guard(|| {
        let p = get!(params as *const MemAllocNodeParams);
        if p.bytesize == 0 {
            return Err(CuErr::InvalidValue);
        }
        let (dev, addr) = with(|d| {
            let dev = if p.props.location_type == LOCATION_DEVICE {
                d.dev(p.props.location_id)?
            } else {
                d.current_ctx()?.1
            };
            Ok((dev, d.new_addr(p.bytesize as u64)))
        })?;
        add_node(
            ph,
            graph,
            deps,
            ndeps,
            Node::MemAlloc {
                dev,
                bytes: p.bytesize as u64,
            },
        )?;
        // SAFETY: `params` was read above, so it is a valid, non-NULL
        // pointer to the caller's struct; `dptr` is its out-field.
        unsafe { (*params).dptr = addr };
        Ok(())
    })
}

/// `cuGraphAddMemFreeNode`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    ph: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        if dptr == 0 {
            return Err(CuErr::InvalidValue);
        }
        add_node(ph, graph, deps, ndeps, Node::Other)
    })
}

fn instantiate(out: *mut Handle, graph: Handle) -> Result<(), CuErr> {
    if out.is_null() {
        return Err(CuErr::InvalidValue);
    }
    let h = with(|d| {
        let nodes = d.graphs.graphs.get(&graph).ok_or(CuErr::InvalidValue)?;
        let mut e = Exec::default();
        for n in nodes {
            match *n {
                Node::Kernel { f, g } => e.kernels.push((f, g)),
                Node::MemAlloc { dev, bytes } => e.allocs.push((dev, bytes)),
                Node::Other => {}
            }
        }
        let h = d.new_handle();
        d.graphs.execs.insert(h, e);
        Ok(h)
    })?;
    put!(out, h);
    Ok(())
}

/// `cuGraphInstantiateWithFlags`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut Handle,
    graph: Handle,
    _flags: u64,
) -> CUresult {
    guard(|| instantiate(exec, graph))
}

/// `cuGraphInstantiate_v2` (the CUDA 11 five-argument form).
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut Handle,
    graph: Handle,
    _error_node: *mut Handle,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    guard(|| instantiate(exec, graph))
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct InstantiateParams {
    flags: u64,
    upload_stream: Handle,
    error_node_out: Handle,
    result_out: c_int,
}

/// `cuGraphInstantiateWithParams`: `result_out` is set to success.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut Handle,
    graph: Handle,
    params: *mut InstantiateParams,
) -> CUresult {
    guard(|| {
        let mut p = get!(params as *const InstantiateParams);
        instantiate(exec, graph)?;
        p.result_out = 0;
        p.error_node_out = 0;
        put!(params, p);
        Ok(())
    })
}

/// `cuGraphExecDestroy`: releases the graph's memory.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            let e = d.graphs.execs.remove(&exec).ok_or(CuErr::InvalidValue)?;
            if e.allocated {
                for &(dev, bytes) in &e.allocs {
                    d.uncharge(dev, bytes);
                    d.graphs.note(dev, -(bytes as i64));
                }
            }
            Ok(())
        })
    })
}

fn launch_graph(exec: Handle, stream: Handle, per_thread: bool) -> Result<(), CuErr> {
    if crate::capture::captured(stream, per_thread, |d| d.graphs.kernel_nodes(exec))? {
        return Ok(());
    }
    let end = submit(stream, per_thread, |d, _| {
        let e = d
            .graphs
            .execs
            .get(&exec)
            .cloned()
            .ok_or(CuErr::InvalidValue)?;
        let durations = e
            .kernels
            .iter()
            .map(|(f, g)| d.kernel_duration(*f, g))
            .collect::<Result<Vec<_>, _>>()?;
        if !e.allocated {
            for (i, &(dev, bytes)) in e.allocs.iter().enumerate() {
                if let Err(err) = d.charge(dev, bytes) {
                    for &(dv, b) in &e.allocs[..i] {
                        d.uncharge(dv, b);
                    }
                    return Err(err);
                }
            }
            for &(dev, bytes) in &e.allocs {
                d.graphs.note(dev, bytes as i64);
            }
            if let Some(x) = d.graphs.execs.get_mut(&exec) {
                x.allocated = true;
            }
        }
        Ok(durations)
    })?;
    with(|d| {
        if let Some(x) = d.graphs.execs.get_mut(&exec) {
            x.last_end = x.last_end.max(end);
        }
        Ok(())
    })
}

/// `cuGraphLaunch`: kernel nodes run back to back on the stream (into a
/// capturing stream: they are added to the capture).
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: Handle, stream: Handle) -> CUresult {
    guard(|| launch_graph(exec, stream, false))
}

/// `cuGraphLaunch_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: Handle, stream: Handle) -> CUresult {
    guard(|| launch_graph(exec, stream, true))
}

/// `cuGraphUpload`: nothing to do.
#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: Handle, stream: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            d.resolve_stream(stream, false)?;
            d.graphs
                .execs
                .get(&exec)
                .map(|_| ())
                .ok_or(CuErr::InvalidValue)
        })
    })
}

/// `cuDeviceGraphMemTrim`: idle graphs give their memory back.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    guard(|| {
        with(|d| {
            let dv = d.dev(dev)?;
            let now = simgpu::clock::mono_ns();
            let mut release = Vec::new();
            for e in d.graphs.execs.values_mut() {
                if e.allocated && e.last_end <= now && e.allocs.iter().any(|&(x, _)| x == dv) {
                    e.allocated = false;
                    release.extend(e.allocs.iter().copied());
                }
            }
            for (x, bytes) in release {
                d.uncharge(x, bytes);
                d.graphs.note(x, -(bytes as i64));
            }
            Ok(())
        })
    })
}

/// `cuDeviceGetGraphMemAttribute`: USED/RESERVED_MEM_CURRENT (0/2) and
/// their HIGH marks (1/3).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: CUdevice,
    attr: c_int,
    value: *mut u64,
) -> CUresult {
    guard(|| {
        let v = with(|d| {
            let dv = d.dev(dev)?;
            Ok(match attr {
                0 | 2 => d.graphs.used.get(&dv).copied().unwrap_or(0),
                1 | 3 => d.graphs.high.get(&dv).copied().unwrap_or(0),
                _ => return Err(CuErr::InvalidValue),
            })
        })?;
        put!(value, v);
        Ok(())
    })
}

/// `cuDeviceSetGraphMemAttribute`: resets the HIGH marks (value must be 0).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    dev: CUdevice,
    attr: c_int,
    value: *mut u64,
) -> CUresult {
    guard(|| {
        let v = get!(value as *const u64);
        with(|d| {
            let dv = d.dev(dev)?;
            if v != 0 || !(attr == 1 || attr == 3) {
                return Err(CuErr::InvalidValue);
            }
            let cur = d.graphs.used.get(&dv).copied().unwrap_or(0);
            d.graphs.high.insert(dv, cur);
            Ok(())
        })
    })
}
