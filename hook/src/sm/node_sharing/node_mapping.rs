//! The node's table of limited containers on one GPU: a small file in a
//! directory every container of the node shares, mapped `MAP_SHARED` by
//! every limited process that uses that GPU (docs/sm-limit.md, "Time
//! division between containers").
//!
//! The directory is `VGPU_SM_NODE_DIR`, opt-in per container: HAMi's device
//! plugin bind-mounts `/tmp/vgpulock` (mode 0777) read-write into every
//! container it sets up (its Allocate response, in HAMi's
//! `pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go`), so that
//! is the value to use there.
//! The file is `<dir>/vgpu-sm-<GPU UUID>`: per physical GPU,
//! whatever ordinal each container sees it as. It is never created without
//! its directory: without a shared directory each container stays alone.
//!
//! Each member is a container (its sidecar's `container` id) with its limit,
//! the CLOCK_MONOTONIC instant it last launched, and the last instant it
//! was using most of its share (`wants`). Only the members that want their
//! share take turns: a neighbour that uses little of its share is not
//! waited for, and does not wait. The processes read the members to agree
//! on a schedule (`phase`) with no messages and no lock.

#![forbid(unsafe_code)]

use std::path::Path;

pub(crate) use vgpu_common::node::*;
use vgpu_common::shared_file::MapError;

use crate::sigbus_guard::shared as mapfile;

/// Maps (creating if needed) the table at `path`; never unmapped.
pub(crate) fn open(path: &Path) -> Result<&'static NodeFile, MapError> {
    mapfile::open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_is_shared_and_a_foreign_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = path_for(dir.path(), "GPU-12ab/../x");
        assert_eq!(p.file_name().unwrap(), "vgpu-sm-GPU-12ab____x");
        let a = open(&p).unwrap();
        let b = open(&p).unwrap();
        let m = a.join(5, 1).unwrap();
        m.touch(1, 40);
        m.want(1);
        assert_eq!(b.wanting(1, 10), vec![(5, 40)]);
        let q = dir.path().join("other");
        std::fs::write(&q, vec![3u8; SIZE]).unwrap();
        assert!(matches!(open(&q), Err(MapError::Foreign { .. })));
    }
}
