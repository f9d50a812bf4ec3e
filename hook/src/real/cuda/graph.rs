//! Graphs: memory-allocation nodes and destruction.

use super::{sym, CuError};
use crate::ffi::*;

/// `cuGraphAddMemAllocNode`, forwarded with the application's pointers.
#[doc(alias = "cuGraphAddMemAllocNode")]
pub fn add_mem_alloc_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    let Ok(f) = sym(|t| t.cuGraphAddMemAllocNode) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `node`, `deps` (with `ndeps`) and `params` are the
    // application's pointers of this very call, passed unchanged.
    unsafe { f(node, graph, deps, ndeps, params) }
}

/// `cuGraphDestroy`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuGraphDestroy")]
pub fn destroy(graph: CUgraph) -> Result<(), CuError> {
    let f = sym(|t| t.cuGraphDestroy)?;
    // SAFETY: the application's graph handle by value; the driver
    // validates it.
    CuError::result(unsafe { f(graph) })
}
