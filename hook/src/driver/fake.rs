//! A fake driver for unit tests: a current device, device memory handed
//! out at increasing addresses, timing events that complete when the test
//! says, NVML's figures as the test sets them, and a count of every call
//! that reached it (so a test can say that a refused call never did). The
//! SM controller's tests add a GPU that runs in time on the world's test
//! clock (`sm::tests`, `world::fake::TestClock`).

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize};
use std::sync::Mutex;

use super::{Context, CuError, Events, Memory, Nvml, Poll};
use crate::ffi::*;

#[derive(Debug, Default)]
pub(crate) struct FakeDriver {
    /// The current context's device (`None`: no current context).
    pub dev: Option<usize>,
    /// The process's only device, if it sees one.
    pub only: Option<usize>,
    /// What the next `mem_alloc` returns (0: success).
    pub alloc_rc: AtomicI32,
    /// Calls of `mem_alloc` / `mem_free` that reached the driver.
    pub allocs: AtomicUsize,
    pub frees: AtomicUsize,
    /// The last address handed out.
    pub next_ptr: AtomicU64,
    /// `(free, total)` the driver reports for the device.
    pub info: Mutex<(u64, u64)>,
    /// Device-wide used memory per NVML.
    pub used: AtomicU64,
    /// NVML's process list (`None`: no list).
    pub procs: Mutex<Option<Vec<(u32, u64)>>>,
    /// NVML's per-process SM samples `(host pid, sm %)` (`None`: none).
    pub samples: Mutex<Option<Vec<(u32, u32)>>>,
    /// NVML's device utilization and the host pids on the device.
    pub busy: Mutex<Option<(f64, Vec<u32>)>>,
    /// Calls of `proc_util` that reached NVML.
    pub sampled: AtomicUsize,
    /// Live events: recorded, completed, their time (ns).
    pub events: Mutex<HashMap<usize, (bool, bool, u64)>>,
    /// Events created so far (the last one's handle).
    pub created: AtomicUsize,
    /// `record` fails while set.
    pub refuse_record: AtomicBool,
}

impl FakeDriver {
    /// A driver whose current context is on container device `dev`.
    pub(crate) fn on(dev: usize) -> Self {
        Self {
            dev: Some(dev),
            ..Self::default()
        }
    }

    pub(crate) fn allocs(&self) -> usize {
        self.allocs.load(SeqCst)
    }

    pub(crate) fn frees(&self) -> usize {
        self.frees.load(SeqCst)
    }

    /// Completes every recorded event, the ends (even handles, created
    /// second of a pair) `took` ns after the starts.
    pub(crate) fn finish_events(&self, took: u64) {
        for (ev, (rec, done, t)) in self.events.lock().unwrap().iter_mut() {
            if *rec {
                *done = true;
                *t = if ev % 2 == 1 { 0 } else { took };
            }
        }
    }
}

impl Context for FakeDriver {
    fn current_device(&self) -> Option<usize> {
        self.dev
    }

    fn current(&self) -> Option<(usize, usize)> {
        self.dev.map(|d| (0x100 + d, d))
    }

    fn only_device(&self) -> Option<usize> {
        self.only
    }
}

impl Events for FakeDriver {
    fn create_event(&self) -> Option<usize> {
        let ev = self.created.fetch_add(1, SeqCst) + 1;
        self.events.lock().unwrap().insert(ev, (false, false, 0));
        Some(ev)
    }

    fn destroy_event(&self, ev: usize) {
        self.events.lock().unwrap().remove(&ev);
    }

    fn record(&self, ev: usize, _stream: usize) -> bool {
        if self.refuse_record.load(SeqCst) {
            return false;
        }
        self.events.lock().unwrap().insert(ev, (true, false, 0));
        true
    }

    fn query(&self, ev: usize) -> Poll {
        match self.events.lock().unwrap().get(&ev) {
            Some((_, true, _)) => Poll::Ready,
            Some(_) => Poll::NotReady,
            None => Poll::Failed,
        }
    }

    fn elapsed_ns(&self, start: usize, end: usize) -> Option<u64> {
        let e = self.events.lock().unwrap();
        Some(e.get(&end)?.2 - e.get(&start)?.2)
    }
}

/// The calls the exports forward, as the tests pass them to the entry
/// points' logic (`|| fake.mem_alloc(ptr, n)`).
impl FakeDriver {
    /// `cuMemAlloc_v2` reaching the driver.
    pub(crate) fn mem_alloc(&self, dptr: *mut CUdeviceptr, _bytes: usize) -> CUresult {
        self.allocs.fetch_add(1, SeqCst);
        let rc = self.alloc_rc.load(SeqCst);
        if rc == CUDA_SUCCESS {
            let p = self.next_ptr.fetch_add(0x1000, SeqCst) + 0x1000;
            write(dptr, p);
        }
        rc
    }

    /// `cuMemGetInfo_v2` reaching the driver.
    pub(crate) fn mem_get_info(&self, free: *mut usize, total: *mut usize) -> CUresult {
        let (f, t) = *self.info.lock().unwrap();
        write(free, f as usize);
        write(total, t as usize);
        CUDA_SUCCESS
    }
}

impl Memory for FakeDriver {
    fn mem_free(&self, _ptr: CUdeviceptr) -> CUresult {
        self.frees.fetch_add(1, SeqCst);
        CUDA_SUCCESS
    }

    fn ipc_close(&self, _ptr: CUdeviceptr) -> CUresult {
        CUDA_SUCCESS
    }

    fn mem_info(&self) -> Option<(usize, usize)> {
        let (f, t) = *self.info.lock().unwrap();
        Some((f as usize, t as usize))
    }

    fn allocation_size(&self, _ptr: CUdeviceptr) -> Option<u64> {
        None
    }

    /// No host memory: as a process without the driver's symbol.
    fn host_alloc_mapped(&self, _bytes: usize) -> Result<usize, CuError> {
        Err(CuError(CUDA_ERROR_NOT_FOUND))
    }

    fn host_device_pointer(&self, _host: usize) -> Result<CUdeviceptr, CuError> {
        Err(CuError(CUDA_ERROR_NOT_FOUND))
    }

    fn free_host(&self, _host: usize) -> Result<(), CuError> {
        Err(CuError(CUDA_ERROR_NOT_FOUND))
    }
}

impl Nvml for FakeDriver {
    fn device_used(&self, _dev: usize) -> Option<u64> {
        Some(self.used.load(SeqCst))
    }

    fn processes(&self, _dev: usize) -> Option<Vec<(u32, u64)>> {
        self.procs.lock().unwrap().clone()
    }

    fn proc_util(&self, _dev: usize, _since_us: u64) -> Option<Vec<(u32, u32)>> {
        self.sampled.fetch_add(1, SeqCst);
        self.samples.lock().unwrap().clone()
    }

    fn device_busy(&self, _dev: usize, _since_us: u64) -> Option<(f64, Vec<u32>)> {
        self.busy.lock().unwrap().clone()
    }
}
