//! Graph memory nodes (`cuGraphAddMemAllocNode`): the node's `bytesize` is
//! reserved when the node is added (so an over-limit graph fails where it is
//! built, with `CUDA_ERROR_OUT_OF_MEMORY`) and released when the graph is
//! destroyed. The device is the node's pool location when that is a device,
//! else the current context's.

use super::limit;
use super::track::Entry;
use crate::driver;
use crate::driver::Context;
use crate::ffi::*;
use crate::region::Kind;
use crate::state::process;

pub fn add_mem_alloc_node(
    forward: impl Fn() -> CUresult,
    _node: *mut CUgraphNode,
    g: CUgraph,
    _deps: *const CUgraphNode,
    _ndeps: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    let (Some(p), Some((bytes, loc))) = (process(), alloc_node_request(params)) else {
        return forward();
    };
    if g.is_null() {
        return forward();
    }
    let dev = if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE && loc.id >= 0 {
        crate::devices::index_of(driver::live(), loc.id)
    } else {
        driver::live().current_device()
    };
    let Some(dev) = dev.filter(|d| *d < vgpu_common::region::MAX_DEVICES) else {
        return forward();
    };
    let bytes = bytes as u64;
    let Some(r) = limit::reserve(&p.att, dev, bytes, Kind::Data) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let rc = forward();
    if rc != CUDA_SUCCESS {
        return rc;
    }
    r.commit();
    p.graphs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(g as usize)
        .or_default()
        .push(Entry::unbound(dev, bytes, Kind::Data));
    rc
}

pub fn graph_destroy(forward: impl FnOnce() -> CUresult, g: CUgraph) -> CUresult {
    let rc = forward();
    if rc != CUDA_SUCCESS {
        return rc;
    }
    if let Some(p) = process() {
        let entries = p
            .graphs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(g as usize));
        for e in entries.into_iter().flatten() {
            limit::release_counted(&p.att, e.dev, e.bytes, e.kind);
        }
    }
    rc
}
