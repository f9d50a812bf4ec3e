//! The driver's lifetime rule for the VMM handles the hook counts
//! (`cuMemCreate` on a device): their memory stays the process's until
//! every reference to the handle is released *and* every mapping of it is
//! unmapped. `cuMemCreate` holds one reference,
//! `cuMemRetainAllocationHandle` adds one (it returns the same handle
//! value), `cuMemRelease` drops one; `cuMemMap` adds a mapping and
//! `cuMemUnmap` removes every mapping that starts in its range. Uncounting
//! only when both reach zero keeps the count equal to the driver's whatever
//! order a client uses: NCCL retains and releases a live buffer's handle to
//! read its properties and frees with retain, release, unmap, release;
//! PyTorch's expandable segments unmap then release; other allocators
//! release right after mapping and unmap later.
//!
//! Handles the hook did not count have no row and are only forwarded:
//! imported ones (`cuMemImportFromShareableHandle`: the memory is the
//! exporter's, and the driver charges it there) and host locations. A row
//! records the generation it was created in and a mapping the generation
//! of its handle, so a mapping left over from a handle value the driver
//! has since handed out again (after a primary-context reset freed it) is
//! ignored.
//!
//! One mutex holds the table (an unmap needs the mappings in address
//! order); these calls are far rarer than launches, and an uncontended
//! mutex makes no syscall. What a release or unmap takes away is taken
//! before the driver call and put back if the call fails, as
//! [`uncounted`](super::uncounted) does, so a handle value the driver
//! reuses right after freeing it never meets the old row. What a retain or
//! map adds is added after the driver's success.

use super::track::Entry;
use super::uncounted;
use crate::ffi::{CUresult, CUDA_SUCCESS};
use crate::state::Process;

/// `cuMemRetainAllocationHandle`: `call` returns the driver's result and
/// the handle it wrote; a counted handle gains a reference.
pub fn retain(p: &Process, call: impl FnOnce() -> (CUresult, u64)) -> CUresult {
    let (rc, handle) = call();
    if rc == CUDA_SUCCESS {
        p.vmm.retained(handle);
    }
    rc
}

/// `cuMemMap` of `handle` at `ptr`: a counted handle gains a mapping.
pub fn map(p: &Process, ptr: u64, handle: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let rc = call();
    if rc == CUDA_SUCCESS {
        p.vmm.mapped(ptr, handle);
    }
    rc
}

/// `cuMemRelease`: a counted handle loses a reference; its memory is
/// uncounted when that was the last one and it is mapped nowhere.
pub fn release(p: &Process, handle: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some((gen, dead)) = p.vmm.release(handle) else {
        return call();
    };
    let rc = if dead {
        uncounted(p, &p.handles, handle, call)
    } else {
        call()
    };
    if rc != CUDA_SUCCESS {
        p.vmm.unrelease(handle, gen);
    }
    rc
}

/// `cuMemUnmap(ptr, size)`: every counted handle mapped at a start in the
/// range loses that mapping; the memory of those left with neither
/// references nor mappings is uncounted.
pub fn unmap(p: &Process, ptr: u64, size: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let u = p.vmm.unmap(ptr, size);
    if u.maps.is_empty() {
        return call();
    }
    let freed: Vec<(u64, Entry)> = u
        .dead
        .iter()
        .filter_map(|&(h, _)| Some((h, p.handles.remove(h)?)))
        .collect();
    let rc = call();
    if rc == CUDA_SUCCESS {
        for (_, e) in &freed {
            super::limit::release_counted(&p.att, e.dev, e.bytes, e.kind);
        }
    } else {
        for (h, e) in freed {
            p.handles.insert(h, e);
        }
        p.vmm.unmap_failed(u);
    }
    rc
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::config::Config;
    use crate::ffi::CUDA_ERROR_OUT_OF_MEMORY;
    use crate::memory::counted;
    use crate::region::{usage, Kind};

    const M: u64 = 1 << 20;
    const SEG: u64 = 2 * M;
    /// `CUDA_ERROR_INVALID_VALUE`.
    const CUDA_ERROR_INVALID_VALUE: CUresult = 1;

    fn process(dir: &std::path::Path, limit: &str) -> Process {
        let path = dir.join("r.cache").display().to_string();
        let limit = limit.to_owned();
        let cfg = Config::from_lookup(move |k| match k {
            "CUDA_DEVICE_MEMORY_SHARED_CACHE" => Some(path.clone()),
            "CUDA_DEVICE_MEMORY_LIMIT" => Some(limit.clone()),
            _ => None,
        });
        Process::new(&cfg, std::process::id() as i32, 0).unwrap()
    }

    fn used(p: &Process) -> u64 {
        usage::container_used(p.att.region(), 0)
    }

    /// `cuMemCreate` of `SEG` bytes returning `h`, as `vmm::mem_create`
    /// counts it.
    fn create(p: &Process, h: u64) -> CUresult {
        let no_driver = crate::driver::fake::FakeDriver::default();
        let rc = counted(&no_driver, p, &p.handles, 0, SEG, Kind::Data, || {
            (CUDA_SUCCESS, h)
        });
        if rc == CUDA_SUCCESS {
            p.vmm.created(h);
        }
        rc
    }

    fn ok() -> CUresult {
        CUDA_SUCCESS
    }

    /// A retain/release pair, as NCCL makes on a live buffer.
    fn pair(p: &Process, h: u64) {
        assert_eq!(retain(p, || (CUDA_SUCCESS, h)), CUDA_SUCCESS);
        assert_eq!(release(p, h, ok), CUDA_SUCCESS);
    }

    #[test]
    fn a_retain_release_pair_on_a_live_allocation_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = process(dir.path(), "1g");
        assert_eq!(create(&p, 7), CUDA_SUCCESS);
        assert_eq!(map(&p, 0x1000_0000, 7, ok), CUDA_SUCCESS);
        for _ in 0..3 {
            pair(&p, 7);
        }
        assert_eq!(used(&p), SEG);
        assert_eq!(p.vmm.row(7), Some((1, 1)));
        // Unmapped, the pair still leaves the creation's reference.
        assert_eq!(unmap(&p, 0x1000_0000, SEG, ok), CUDA_SUCCESS);
        pair(&p, 7);
        assert_eq!(used(&p), SEG);
        assert_eq!(release(&p, 7, ok), CUDA_SUCCESS);
        assert_eq!(used(&p), 0);
        assert_eq!(p.vmm.row(7), None);
        assert!(p.handles.is_empty());
    }

    #[test]
    fn nccls_free_order_uncounts_at_the_last_release() {
        let dir = tempfile::tempdir().unwrap();
        let p = process(dir.path(), "1g");
        let base = 0x2000_0000;
        for (i, h) in (1..=4u64).enumerate() {
            assert_eq!(create(&p, h), CUDA_SUCCESS);
            assert_eq!(map(&p, base + i as u64 * SEG, h, ok), CUDA_SUCCESS);
        }
        assert_eq!(used(&p), 4 * SEG);
        // retain, release, unmap, release
        let ptr = base + SEG;
        assert_eq!(retain(&p, || (CUDA_SUCCESS, 2)), CUDA_SUCCESS);
        assert_eq!(release(&p, 2, ok), CUDA_SUCCESS);
        assert_eq!(used(&p), 4 * SEG);
        assert_eq!(unmap(&p, ptr, SEG, ok), CUDA_SUCCESS);
        assert_eq!(used(&p), 4 * SEG, "still referenced after the unmap");
        assert_eq!(release(&p, 2, ok), CUDA_SUCCESS);
        assert_eq!(used(&p), 3 * SEG);
        assert_eq!(p.vmm.row(2), None);
        // The others are untouched.
        assert_eq!(p.vmm.row(1), Some((1, 1)));
        assert_eq!(p.vmm.row(3), Some((1, 1)));
    }

    #[test]
    fn a_handle_released_while_mapped_is_counted_until_its_last_unmap() {
        let dir = tempfile::tempdir().unwrap();
        let p = process(dir.path(), "1g");
        let base = 0x3000_0000;
        assert_eq!(create(&p, 9), CUDA_SUCCESS);
        // Mapped twice (two views of one allocation), one other handle beside.
        assert_eq!(map(&p, base, 9, ok), CUDA_SUCCESS);
        assert_eq!(map(&p, base + SEG, 9, ok), CUDA_SUCCESS);
        assert_eq!(create(&p, 10), CUDA_SUCCESS);
        assert_eq!(map(&p, base + 2 * SEG, 10, ok), CUDA_SUCCESS);
        assert_eq!(release(&p, 9, ok), CUDA_SUCCESS);
        assert_eq!(release(&p, 10, ok), CUDA_SUCCESS);
        assert_eq!(used(&p), 2 * SEG, "released but mapped");
        assert_eq!(unmap(&p, base, SEG, ok), CUDA_SUCCESS);
        assert_eq!(used(&p), 2 * SEG, "one mapping of 9 left");
        // One unmap over the rest of the range takes both.
        assert_eq!(unmap(&p, base + SEG, 2 * SEG, ok), CUDA_SUCCESS);
        assert_eq!(used(&p), 0);
        assert!(p.handles.is_empty());
        // A second release of a dead handle is the driver's error, and
        // counts nothing.
        assert_eq!(
            release(&p, 9, || CUDA_ERROR_INVALID_VALUE),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(used(&p), 0);
    }

    #[test]
    fn handles_the_hook_did_not_count_are_only_forwarded() {
        let dir = tempfile::tempdir().unwrap();
        let p = process(dir.path(), "1g");
        assert_eq!(create(&p, 1), CUDA_SUCCESS);
        assert_eq!(map(&p, 0x4000_0000, 1, ok), CUDA_SUCCESS);
        // 0x99: imported (cuMemImportFromShareableHandle) or host-located,
        // never counted. Every call on it reaches the driver, none counts.
        let calls = Cell::new(0);
        let fwd = || {
            calls.set(calls.get() + 1);
            CUDA_SUCCESS
        };
        assert_eq!(map(&p, 0x5000_0000, 0x99, fwd), CUDA_SUCCESS);
        assert_eq!(retain(&p, || (fwd(), 0x99)), CUDA_SUCCESS);
        assert_eq!(release(&p, 0x99, fwd), CUDA_SUCCESS);
        assert_eq!(release(&p, 0x99, fwd), CUDA_SUCCESS);
        assert_eq!(used(&p), SEG);
        assert_eq!(unmap(&p, 0x5000_0000, SEG, fwd), CUDA_SUCCESS);
        assert_eq!(calls.get(), 5);
        assert_eq!(p.vmm.row(0x99), None);
        assert_eq!(used(&p), SEG);
        assert_eq!(p.vmm.row(1), Some((1, 1)));
    }

    #[test]
    fn a_refused_release_or_unmap_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = process(dir.path(), "1g");
        let base = 0x6000_0000;
        assert_eq!(create(&p, 3), CUDA_SUCCESS);
        let bad = || CUDA_ERROR_INVALID_VALUE;
        assert_eq!(release(&p, 3, bad), CUDA_ERROR_INVALID_VALUE);
        assert_eq!((used(&p), p.vmm.row(3)), (SEG, Some((1, 0))));
        assert_eq!(map(&p, base, 3, bad), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(p.vmm.row(3), Some((1, 0)));
        assert_eq!(map(&p, base, 3, ok), CUDA_SUCCESS);
        assert_eq!(release(&p, 3, ok), CUDA_SUCCESS);
        assert_eq!(unmap(&p, base, SEG, bad), CUDA_ERROR_INVALID_VALUE);
        assert_eq!((used(&p), p.vmm.row(3)), (SEG, Some((0, 1))));
        assert_eq!(unmap(&p, base, SEG, ok), CUDA_SUCCESS);
        assert_eq!((used(&p), p.vmm.row(3)), (0, None));
    }

    #[test]
    fn a_mapping_of_a_reused_handle_value_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let p = process(dir.path(), "1g");
        assert_eq!(create(&p, 5), CUDA_SUCCESS);
        assert_eq!(map(&p, 0x7000_0000, 5, ok), CUDA_SUCCESS);
        // A primary-context reset frees everything and drops the count;
        // the driver then hands the value 5 out again.
        for e in p.handles.drain_where(|_| true) {
            crate::memory::limit::release_counted(&p.att, e.dev, e.bytes, e.kind);
        }
        assert_eq!(create(&p, 5), CUDA_SUCCESS);
        assert_eq!(unmap(&p, 0x7000_0000, SEG, ok), CUDA_SUCCESS);
        assert_eq!(
            p.vmm.row(5),
            Some((1, 0)),
            "the old mapping is not the new handle's"
        );
        assert_eq!(used(&p), SEG);
        assert_eq!(release(&p, 5, ok), CUDA_SUCCESS);
        assert_eq!(used(&p), 0);
    }

    #[test]
    fn the_limit_holds_through_retain_release_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let p = process(dir.path(), "8m");
        for h in 1..=4u64 {
            assert_eq!(create(&p, h), CUDA_SUCCESS);
            assert_eq!(map(&p, h << 32, h, ok), CUDA_SUCCESS);
        }
        for h in 1..=4u64 {
            pair(&p, h);
        }
        assert_eq!(create(&p, 5), CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(used(&p), 8 * M);
    }
}
