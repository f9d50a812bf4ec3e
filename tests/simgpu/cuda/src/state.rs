//! The process-wide driver state: one mutex-protected [`Driver`] created by
//! `cuInit`, plus each thread's context stack.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, Once};

use simgpu::client::Client;
use simgpu::config::{DeviceConfig, ProcessConfig};
use simgpu::proto::Kind;
use simgpu::shm::Shm;

use crate::{CuErr, Handle};

/// Granularity of VMM and pool reservations (2 MiB).
pub(crate) const GRANULARITY: u64 = 2 << 20;

/// What a device address range is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllocKind {
    /// `cuMemAlloc_v2` / `cuMemAllocPitch_v2`.
    Device,
    /// `cuMemAllocManaged` (real host memory behind it).
    Managed,
    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`, from this pool.
    Pool(Handle),
    /// `cuIpcOpenMemHandle_v2` import (costs nothing).
    Ipc,
}

/// A live device allocation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Alloc {
    pub size: u64,
    pub dev: u32,
    /// Device bytes charged to this process for it (released on free).
    pub charged: u64,
    pub kind: AllocKind,
    /// Context it was made in (freed with the context), 0 for pools.
    pub ctx: Handle,
}

/// A context.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub dev: u32,
    pub primary: bool,
    pub flags: u32,
    /// End of the last kernel launched in this context.
    pub last_end: u64,
}

/// A device's primary context.
#[derive(Debug, Clone, Default)]
pub(crate) struct Primary {
    pub ctx: Option<Handle>,
    pub refs: u32,
    pub flags: u32,
}

/// Which stream a launch goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum StreamKey {
    /// A created stream.
    Created(Handle),
    /// The legacy NULL stream of a context.
    Legacy(Handle),
    /// The per-thread default stream of a context and thread.
    PerThread(Handle, u64),
}

/// The whole driver state of this process.
pub(crate) struct Driver {
    pub client: Client,
    pub slot: u32,
    pub cfg: DeviceConfig,
    pub pcfg: ProcessConfig,
    /// The physical device of each CUDA ordinal (`CUDA_VISIBLE_DEVICES`).
    pub visible: Vec<u32>,
    next_handle: usize,
    next_addr: u64,
    pub ctxs: HashMap<Handle, Ctx>,
    pub primary: Vec<Primary>,
    pub allocs: BTreeMap<u64, Alloc>,
    /// Live host blocks we mmapped: address → length.
    pub host_blocks: HashMap<usize, usize>,
    /// `cuMemHostRegister`ed ranges: address → length.
    pub registered: BTreeMap<usize, usize>,
    pub vmm: crate::vmm::Vmm,
    pub pools: crate::pool::Pools,
    pub arrays: HashMap<Handle, (u32, u64)>,
    pub streams: HashMap<Handle, crate::stream::Stream>,
    /// End of the last kernel queued on each stream.
    pub stream_end: HashMap<StreamKey, u64>,
    pub events: HashMap<Handle, crate::event::Event>,
    pub modules: HashMap<Handle, Vec<Handle>>,
    /// Device memory each loaded module holds (`SIMGPU_MODULE_BYTES`):
    /// module → (context, device, bytes).
    pub module_mem: HashMap<Handle, (Handle, u32, u64)>,
    pub funcs: HashMap<Handle, crate::module::Func>,
    pub libraries: HashMap<Handle, Handle>,
    pub graphs: crate::graph::Graphs,
    /// Streams being captured into a graph.
    pub captures: HashMap<StreamKey, crate::capture::Capture>,
}

static DRIVER: Mutex<Option<Driver>> = Mutex::new(None);
static ATFORK: Once = Once::new();

thread_local! {
    static CTX_STACK: RefCell<Vec<Handle>> = const { RefCell::new(Vec::new()) };
    static THREAD_KEY: Cell<u64> = const { Cell::new(0) };
    static FORK_HELD: RefCell<Option<MutexGuard<'static, Option<Driver>>>> = const { RefCell::new(None) };
}

fn lock() -> MutexGuard<'static, Option<Driver>> {
    DRIVER.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` on the initialised driver; `CUDA_ERROR_NOT_INITIALIZED` before
/// `cuInit`.
pub(crate) fn with<T>(f: impl FnOnce(&mut Driver) -> Result<T, CuErr>) -> Result<T, CuErr> {
    let mut g = lock();
    match g.as_mut() {
        Some(d) => f(d),
        None => Err(CuErr::NotInitialized),
    }
}

/// `cuInit`: registers with the server (starting it if needed) once.
pub(crate) fn init() -> Result<(), CuErr> {
    ATFORK.call_once(|| {
        // SAFETY: registering plain extern "C" handlers with no arguments.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    });
    // Serialize initialisation without holding DRIVER: connecting may fork
    // (to start the server), and the fork handlers take DRIVER.
    static INIT: Mutex<()> = Mutex::new(());
    let _init = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if lock().is_some() {
        return Ok(());
    }
    let pcfg = ProcessConfig::from_env();
    let client = Client::connect(Kind::Cuda, &pcfg).map_err(|e| {
        eprintln!("simgpu: cuInit: {e}");
        CuErr::NoDevice
    })?;
    let Some(slot) = client.slot() else {
        eprintln!("simgpu: cuInit: the server's process table is full");
        return Err(CuErr::NoDevice);
    };
    let cfg = client.shm().config();
    if pcfg.log {
        eprintln!(
            "simgpu: pid {} registered as host pid {} slot {slot}: {cfg:?}",
            std::process::id(),
            client.host_pid()
        );
    }
    let mut g = lock();
    *g = Some(Driver {
        client,
        slot,
        cfg,
        primary: vec![Primary::default(); cfg.devices as usize],
        visible: visible_devices(
            std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
            cfg.devices,
        ),
        pcfg,
        next_handle: 0,
        next_addr: 0x3000_0000_0000,
        ctxs: HashMap::new(),
        allocs: BTreeMap::new(),
        host_blocks: HashMap::new(),
        registered: BTreeMap::new(),
        vmm: Default::default(),
        pools: Default::default(),
        arrays: HashMap::new(),
        streams: HashMap::new(),
        stream_end: HashMap::new(),
        events: HashMap::new(),
        modules: HashMap::new(),
        module_mem: HashMap::new(),
        funcs: HashMap::new(),
        libraries: HashMap::new(),
        graphs: Default::default(),
        captures: HashMap::new(),
    });
    Ok(())
}

/// The physical devices `CUDA_VISIBLE_DEVICES` names, in its order, as the
/// driver reads it: ordinals or UUID prefixes, up to the first entry that
/// names no device; all devices when unset.
fn visible_devices(var: Option<&str>, devices: u32) -> Vec<u32> {
    let Some(var) = var else {
        return (0..devices).collect();
    };
    let mut out = Vec::new();
    for item in var.split(',').map(str::trim) {
        let found = match item.parse::<u32>() {
            Ok(i) => (i < devices).then_some(i),
            Err(_) if item.starts_with("GPU-") => {
                (0..devices).find(|&d| simgpu::model::device_uuid_string(d).starts_with(item))
            }
            Err(_) => None,
        };
        match found {
            Some(d) if !out.contains(&d) => out.push(d),
            _ => break,
        }
    }
    out
}

extern "C" fn fork_prepare() {
    let g = lock();
    FORK_HELD.with(|h| *h.borrow_mut() = Some(g));
}

extern "C" fn fork_parent() {
    FORK_HELD.with(|h| drop(h.borrow_mut().take()));
}

/// In a forked child the parent's registration is not ours: forget it
/// (closing our copy of the connection) so the child registers afresh on
/// its own `cuInit`.
extern "C" fn fork_child() {
    FORK_HELD.with(|h| {
        if let Some(mut g) = h.borrow_mut().take() {
            *g = None;
        }
    });
    CTX_STACK.with(|s| s.borrow_mut().clear());
}

/// This thread's key for per-thread default streams.
pub(crate) fn thread_key() -> u64 {
    THREAD_KEY.with(|k| {
        if k.get() == 0 {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            k.set(tid as u64 + 1);
        }
        k.get()
    })
}

/// The calling thread's current context handle (0 when none).
pub(crate) fn current() -> Handle {
    CTX_STACK.with(|s| s.borrow().last().copied().unwrap_or(0))
}

/// Replaces the top of the context stack (or pushes onto an empty one);
/// 0 pops.
pub(crate) fn set_current(ctx: Handle) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        if ctx == 0 {
            s.pop();
        } else if let Some(top) = s.last_mut() {
            *top = ctx;
        } else {
            s.push(ctx);
        }
    });
}

/// Pushes a context.
pub(crate) fn push_current(ctx: Handle) {
    CTX_STACK.with(|s| s.borrow_mut().push(ctx));
}

/// Pops the current context.
pub(crate) fn pop_current() -> Option<Handle> {
    CTX_STACK.with(|s| s.borrow_mut().pop())
}

impl Driver {
    /// The shared state.
    pub fn shm(&self) -> &Shm {
        self.client.shm()
    }

    /// A fresh opaque handle (looks like an aligned pointer, never 0).
    pub fn new_handle(&mut self) -> Handle {
        self.next_handle += 1;
        0x5ee0_0000_0000 + self.next_handle * 0x40
    }

    /// A fresh fake device address range of `size` bytes (512-byte aligned,
    /// 2 MiB aligned from 2 MiB up), never reused in this process.
    pub fn new_addr(&mut self, size: u64) -> u64 {
        let align = if size >= GRANULARITY {
            GRANULARITY
        } else {
            512
        };
        let base = self.next_addr.div_ceil(align) * align;
        self.next_addr = base + size.max(1).div_ceil(512) * 512;
        base
    }

    /// The physical device of a CUDA ordinal.
    pub fn dev(&self, dev: i32) -> Result<u32, CuErr> {
        usize::try_from(dev)
            .ok()
            .and_then(|i| self.visible.get(i).copied())
            .ok_or(CuErr::InvalidDevice)
    }

    /// The CUDA ordinal of a physical device this process sees.
    pub fn ordinal(&self, phys: u32) -> Result<i32, CuErr> {
        self.visible
            .iter()
            .position(|&p| p == phys)
            .map(|i| i as i32)
            .ok_or(CuErr::InvalidDevice)
    }

    /// The current context of the calling thread and its device.
    pub fn current_ctx(&self) -> Result<(Handle, u32), CuErr> {
        let h = current();
        match self.ctxs.get(&h) {
            Some(c) => Ok((h, c.dev)),
            None => Err(CuErr::InvalidContext),
        }
    }

    /// Reserves device memory for this process.
    pub fn charge(&self, dev: u32, bytes: u64) -> Result<(), CuErr> {
        if bytes == 0 {
            return Ok(());
        }
        simgpu::memory::reserve(self.shm(), self.slot, dev, bytes).map_err(CuErr::from)
    }

    /// Returns device memory.
    pub fn uncharge(&self, dev: u32, bytes: u64) {
        if bytes > 0 {
            simgpu::memory::release(self.shm(), self.slot, dev, bytes);
        }
    }

    /// Records a new device allocation at a fresh address.
    pub fn add_alloc(&mut self, a: Alloc) -> u64 {
        let p = self.new_addr(a.size);
        self.allocs.insert(p, a);
        p
    }

    /// Frees the allocation starting at `p`, returning its memory. Unknown
    /// pointers are `CUDA_ERROR_INVALID_VALUE`.
    pub fn free_alloc(&mut self, p: u64) -> Result<Alloc, CuErr> {
        let a = *self.allocs.get(&p).ok_or(CuErr::InvalidValue)?;
        match a.kind {
            AllocKind::Ipc => return Err(CuErr::InvalidValue),
            AllocKind::Pool(pool) => self.pool_free(pool, a.size),
            AllocKind::Managed => unmap_host(p as usize, a.size as usize),
            AllocKind::Device => {}
        }
        self.allocs.remove(&p);
        self.uncharge(a.dev, a.charged);
        Ok(a)
    }

    /// The allocation containing `p`, if any: `(base, alloc)`.
    pub fn alloc_containing(&self, p: u64) -> Option<(u64, Alloc)> {
        let (&base, a) = self.allocs.range(..=p).next_back()?;
        (p < base + a.size.max(1)).then_some((base, *a))
    }
}

/// Maps `len` bytes of zeroed anonymous memory (lazily backed).
pub(crate) fn map_host(len: usize) -> Result<usize, CuErr> {
    // SAFETY: anonymous private mapping at an address of the kernel's
    // choosing; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(CuErr::OutOfMemory)
    } else {
        Ok(p as usize)
    }
}

/// Unmaps memory from [`map_host`].
pub(crate) fn unmap_host(p: usize, len: usize) {
    // SAFETY: `p`/`len` describe a mapping made by map_host that the
    // caller has just removed from its tables, so nothing refers to it.
    unsafe { libc::munmap(p as *mut libc::c_void, len.max(1)) };
}

#[cfg(test)]
mod tests {
    use super::visible_devices;

    #[test]
    fn visible_devices_reads_ordinals_and_uuids_up_to_the_first_bad_entry() {
        assert_eq!(visible_devices(None, 3), vec![0, 1, 2]);
        assert_eq!(visible_devices(Some("2,0"), 3), vec![2, 0]);
        let u1 = simgpu::model::device_uuid_string(1);
        assert_eq!(visible_devices(Some(&format!("{u1},0")), 3), vec![1, 0]);
        assert_eq!(visible_devices(Some("1,7,0"), 3), vec![1]);
        assert_eq!(visible_devices(Some(""), 3), Vec::<u32>::new());
    }
}
