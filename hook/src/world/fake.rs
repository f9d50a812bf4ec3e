//! The one fake world of the hook's unit tests: [`TestClock`], the one
//! test clock (time moves only when a test or a sleep moves it; a fake
//! driver that runs work in time shares it), and [`FakeWorld`]: a region
//! file in a temp dir of its own (or another world's, for a second process
//! of the container), private buckets, this process's PIDs and
//! configuration as the test sets them, and a background thread that
//! exists only when the test says so.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex, OnceLock};

use vgpu_common::region::{policy, SharedRegion};
use vgpu_common::sidecar::SmShared;
use vgpu_common::view::RegionFile;

use super::nodelock::NodeLock;
use super::{Background, Clock, Identity, Job, NodeFiles};

/// `TestClock::unix_us` at test time 0.
pub(crate) const UNIX_BASE_US: u64 = 1_700_000_000_000_000;

/// The test clock: CLOCK_MONOTONIC is an atomic the test moves; a sleep
/// moves it to its deadline plus the clock's lateness.
#[derive(Debug, Default)]
pub(crate) struct TestClock {
    now: AtomicU64,
    /// Every sleep ends this much past its deadline (a timer's slack, a
    /// loaded host).
    late_ns: AtomicU64,
    /// Sleeps so far.
    sleeps: AtomicU32,
}

impl TestClock {
    /// A clock that reads `ns`.
    pub(crate) fn at(ns: u64) -> Arc<Self> {
        Arc::new(Self {
            now: AtomicU64::new(ns),
            ..Self::default()
        })
    }

    pub(crate) fn now(&self) -> u64 {
        self.now.load(Relaxed)
    }

    pub(crate) fn set(&self, ns: u64) {
        self.now.store(ns, Relaxed);
    }

    pub(crate) fn advance(&self, ns: u64) {
        self.now.fetch_add(ns, Relaxed);
    }

    /// Every sleep from now on ends `ns` past its deadline.
    pub(crate) fn set_late(&self, ns: u64) {
        self.late_ns.store(ns, Relaxed);
    }

    /// How many sleeps were taken.
    pub(crate) fn sleeps(&self) -> u32 {
        self.sleeps.load(Relaxed)
    }

    /// Sleeps until `t` (plus the lateness); returns the sleep's number.
    fn sleep_until(&self, t: u64) -> u32 {
        self.now
            .fetch_max(t.saturating_add(self.late_ns.load(Relaxed)), Relaxed);
        self.sleeps.fetch_add(1, Relaxed) + 1
    }

    /// CLOCK_REALTIME, µs: [`UNIX_BASE_US`] at 0.
    pub(crate) fn unix_us(&self) -> u64 {
        UNIX_BASE_US + self.now() / 1_000
    }
}

/// What runs whenever the process reads the coarse clock or wakes from a
/// sleep (a stand-in for the daemon that writes the plan).
type OnTick = Box<dyn Fn(&FakeWorld, u64) + Send + Sync>;

/// The fake world.
pub(crate) struct FakeWorld {
    pub clock: Arc<TestClock>,
    /// The region (slot 0 is this process's), shared by every world of
    /// the container; `_dir` holds it.
    pub file: Arc<RegionFile>,
    _dir: Arc<tempfile::TempDir>,
    pub buckets: &'static SmShared,
    /// The buckets are this process's own, not the container's.
    pub private_buckets: AtomicBool,
    /// This process's pid as it sees it (0: the test process's own).
    pub pid: AtomicU32,
    /// Our host PID, when known without a guess.
    pub own_host: Option<u32>,
    /// Our PID in a (non-initial) PID namespace.
    pub own_ns: Option<u32>,
    /// `GPU_CORE_UTILIZATION_POLICY`.
    pub policy: AtomicI32,
    /// The process states a priority.
    pub ranked: AtomicBool,
    /// The context size another process of the container measured.
    pub shared_ctx: Mutex<Option<u64>>,
    /// The monitor lets the container go at this sleep (0: never).
    pub unblock_after: AtomicU32,
    /// A background thread runs offloaded work (the test runs it).
    pub offload: AtomicBool,
    /// Starting the background thread failed.
    pub no_thread: AtomicBool,
    on_tick: OnceLock<OnTick>,
}

impl std::fmt::Debug for FakeWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeWorld")
            .field("clock", &self.clock)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl Default for FakeWorld {
    /// A world at 1 s on its own clock, over a fresh region.
    fn default() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = RegionFile::create_or_open(&dir.path().join("r.cache")).unwrap();
        Self::over(
            TestClock::at(1_000_000_000),
            Arc::new(file),
            Arc::new(dir),
            crate::sidecar::private(),
        )
    }
}

impl FakeWorld {
    fn over(
        clock: Arc<TestClock>,
        file: Arc<RegionFile>,
        dir: Arc<tempfile::TempDir>,
        buckets: &'static SmShared,
    ) -> Self {
        Self {
            clock,
            file,
            _dir: dir,
            buckets,
            private_buckets: AtomicBool::new(false),
            pid: AtomicU32::new(0),
            own_host: None,
            own_ns: None,
            policy: AtomicI32::new(policy::DEFAULT),
            ranked: AtomicBool::new(false),
            shared_ctx: Mutex::new(None),
            unblock_after: AtomicU32::new(0),
            offload: AtomicBool::new(false),
            no_thread: AtomicBool::new(false),
            on_tick: OnceLock::new(),
        }
    }

    /// A world whose clock reads `ns`.
    pub(crate) fn at(ns: u64) -> Self {
        let w = Self::default();
        w.clock.set(ns);
        w
    }

    /// This world, where this process's host PID (the initial PID
    /// namespace) or its namespace PID is known.
    pub(crate) fn with_pids(mut self, host: Option<u32>, ns: Option<u32>) -> Self {
        self.own_host = host;
        self.own_ns = ns;
        self
    }

    /// Another process of this world's container, under pid `pid`: the
    /// same region and buckets, a clock of its own at the same time.
    pub(crate) fn sibling(&self, pid: u32) -> Self {
        let w = Self::over(
            TestClock::at(self.clock.now()),
            Arc::clone(&self.file),
            Arc::clone(&self._dir),
            self.buckets,
        );
        w.pid.store(pid, Relaxed);
        w
    }

    /// The region.
    pub(crate) fn shm(&self) -> &SharedRegion {
        self.file.region()
    }

    /// Runs `f` at every coarse clock read and after every sleep (the
    /// first call wins).
    pub(crate) fn on_tick(&self, f: impl Fn(&FakeWorld, u64) + Send + Sync + 'static) {
        let _ = self.on_tick.set(Box::new(f));
    }

    fn tick(&self, now: u64) {
        if let Some(f) = self.on_tick.get() {
            f(self, now);
        }
    }
}

impl Clock for FakeWorld {
    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn coarse(&self) -> u64 {
        let now = self.clock.now();
        self.tick(now);
        now
    }

    fn unix_secs(&self) -> u64 {
        self.clock.unix_us() / 1_000_000
    }

    fn sleep_until(&self, t: u64) {
        let n = self.clock.sleep_until(t);
        if n == self.unblock_after.load(Relaxed) {
            self.shm().recent_kernel.store(0, Relaxed);
        }
        self.tick(self.clock.now());
    }

    fn unix_us(&self) -> u64 {
        self.clock.unix_us()
    }
}

impl Identity for FakeWorld {
    fn pid(&self) -> u32 {
        match self.pid.load(Relaxed) {
            0 => std::process::id(),
            p => p,
        }
    }

    fn own_host_pid(&self) -> Option<u32> {
        self.own_host
    }

    fn own_ns_pid(&self) -> Option<u32> {
        self.own_ns
    }

    fn policy(&self) -> i32 {
        self.policy.load(Relaxed)
    }

    fn priority_stated(&self) -> bool {
        self.ranked.load(Relaxed)
    }
}

impl NodeFiles for FakeWorld {
    fn region(&self) -> Option<(&SharedRegion, usize)> {
        Some((self.shm(), 0))
    }

    fn buckets(&self) -> &'static SmShared {
        self.buckets
    }

    fn buckets_shared(&self) -> bool {
        !self.private_buckets.load(Relaxed)
    }

    fn follow_files(&self, _now: u64) {}

    fn note_host_pid(&self) {}

    fn shared_ctx_size(&self, _dev: usize) -> Option<u64> {
        *self.shared_ctx.lock().unwrap()
    }

    fn set_shared_ctx_size(&self, _dev: usize, bytes: u64) {
        *self.shared_ctx.lock().unwrap() = Some(bytes);
    }

    /// No node lock: as a node whose lock file cannot be opened.
    fn node_lock(&self) -> Option<NodeLock> {
        None
    }
}

impl Background for FakeWorld {
    fn offload(&self, _job: Job, _run: fn()) -> bool {
        self.offload.load(Relaxed)
    }

    fn offload_failed(&self) -> bool {
        self.no_thread.load(Relaxed)
    }
}
