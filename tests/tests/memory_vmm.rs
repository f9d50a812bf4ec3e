//! The virtual memory API's lifetime rule under the hook: a `cuMemCreate`
//! handle's memory is the process's until every reference to it is released
//! and every mapping of it unmapped, in whatever order a client does that.
//! At each step of NCCL's cuMem allocator, PyTorch's expandable segments and
//! a release-while-mapped allocator (tests/c/hook_vmm.c), the hook's count in
//! the region equals the simulated driver's per-process usage to the byte,
//! and the limit still refuses. Needs the built artifacts and the simulated
//! GPU (`cargo xtask test`).

use std::io::Write;
use std::sync::atomic::Ordering::SeqCst;

use vgpu_tests::hook::{field, HookEnv, Running};
use vgpu_tests::sim::SimGpu;

const M: u64 = 1 << 20;
/// The simulated context's cost.
const CTX: u64 = 64 * M;
/// One buffer or segment (the simulated VMM granularity).
const SEG: u64 = 2 * M;
/// Buffers per scenario.
const N: u64 = 8;

/// A hooked `hook_vmm <args>` on its own simulated GPU, stepped by the test.
struct Steps {
    gpu: SimGpu,
    env: HookEnv,
    p: Running,
}

impl Steps {
    fn start(name: &str, limit: &str, args: &[&str]) -> Self {
        let gpu = SimGpu::builder().context_bytes("64m").build();
        let env = HookEnv::new(name, limit);
        let exe = env.build("hook_vmm");
        let mut cmd = env.hooked(&exe, args);
        gpu.apply(&mut cmd);
        let p = Running::start(cmd);
        Steps { gpu, env, p }
    }

    /// Waits for step `name`; returns its line.
    fn at(&mut self, name: &str) -> String {
        let l = self.p.wait_for("step ");
        assert!(
            l.starts_with(&format!("step {name}")),
            "expected step {name}, got {l:?}"
        );
        l
    }

    /// Lets the program go on to its next step.
    fn next(&mut self) {
        let stdin = self.p.child.stdin.as_mut().expect("stdin");
        writeln!(stdin).expect("write");
        stdin.flush().expect("flush");
    }

    /// The hook's count of this process on device 0 (its slot's total).
    fn counted(&self) -> u64 {
        let pid = self.p.child.id() as i32;
        let f = self.env.region();
        let slot = f.region().procs.iter().find(|s| s.pid.load(SeqCst) == pid);
        slot.map_or(0, |s| s.used[0].total.load(SeqCst))
    }

    /// The simulated driver's usage of this process on device 0.
    fn driver(&self) -> u64 {
        self.gpu.process(0, self.p.child.id()).map_or(0, |p| p.used)
    }

    /// At step `name`: the driver holds `want` bytes for the process and
    /// the hook counts exactly that.
    fn check(&mut self, name: &str, want: u64) -> String {
        let l = self.at(name);
        let (counted, driver) = (self.counted(), self.driver());
        assert_eq!(
            counted,
            driver,
            "step {name}: the hook counts {} MiB, the driver holds {} MiB",
            counted / M,
            driver / M
        );
        assert_eq!(
            driver,
            want,
            "step {name}: the driver holds {} MiB, the scenario {} MiB",
            driver / M,
            want / M
        );
        self.next();
        l
    }

    fn finish(mut self) {
        drop(self.p.child.stdin.take());
        let st = self.p.child.wait().expect("wait");
        assert!(st.success(), "hook_vmm: {st}");
    }
}

/// NCCL's cuMem allocator: retain/release pairs on live buffers leave the
/// count alone, and its free order (retain, release, unmap, release) gives
/// each buffer back once.
#[test]
fn nccl_cumem_allocations_are_counted_until_freed() {
    let n = N.to_string();
    let mut s = Steps::start("vmm-nccl", "4g", &["nccl", &n]);
    s.check("context", CTX);
    s.check("alloc", CTX + N * SEG);
    s.check("pairs", CTX + N * SEG);
    s.check("half", CTX + N / 2 * SEG);
    s.check("freed", CTX);
    s.finish();
}

/// PyTorch's expandable segments: segments mapped into one reservation,
/// each unmapped then released.
#[test]
fn expandable_segments_are_counted_until_unmapped_and_released() {
    let n = N.to_string();
    let mut s = Steps::start("vmm-expandable", "4g", &["expandable", &n]);
    s.check("context", CTX);
    s.check("grow", CTX + N * SEG);
    s.check("shrink", CTX + N / 2 * SEG);
    s.check("freed", CTX);
    s.finish();
}

/// Handles released while mapped keep their memory until the unmap, here
/// one `cuMemUnmap` over every mapping of the reservation.
#[test]
fn a_handle_released_while_mapped_is_counted_until_unmapped() {
    let n = N.to_string();
    let mut s = Steps::start("vmm-early", "4g", &["early", &n]);
    s.check("context", CTX);
    s.check("released", CTX + N * SEG);
    s.check("unmapped", CTX);
    s.finish();
}

/// Filled to the limit with NCCL's buffers, the container stays full after
/// retain/release pairs (one more `cuMemCreate` is refused) and has room
/// again once they are freed.
#[test]
fn retain_release_pairs_do_not_lift_the_limit() {
    let mut s = Steps::start("vmm-limit", "256m", &["limit"]);
    s.check("context", CTX);
    let l = s.at("full");
    let created = field(&l, "created").expect("created");
    assert_eq!(field(&l, "rc"), Some(2), "filling ends in OOM: {l}");
    // 256 MiB - 64 MiB of context: 96 buffers of 2 MiB.
    assert_eq!(created * SEG, 256 * M - CTX, "{l}");
    assert_eq!(s.counted(), s.driver(), "at the limit");
    s.next();
    let l = s.check("over", CTX + created * SEG);
    assert_eq!(
        field(&l, "rc"),
        Some(2),
        "after retain/release pairs one more buffer must still be refused: {l}"
    );
    // Everything freed, and the new buffer held.
    let l = s.check("after", CTX + SEG);
    assert_eq!(field(&l, "rc"), Some(0), "room again once freed: {l}");
    s.finish();
}
