//! The test machine's own timekeeping. The simulated GPU runs in wall time
//! and a limiter sleeps to a schedule, so a timing test measures the host
//! as much as vgpu; on the shared 2-core VMs this project runs on, the
//! hypervisor now and then wakes sleepers late, by milliseconds, for
//! seconds at a time, and a limiter's share then reads low whatever its
//! code. A check that failed while the host was late says nothing.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Mean overshoot of 1 ms sleeps above which the host is not keeping time.
pub const LATE: Duration = Duration::from_micros(500);

/// A thread that sleeps 1 ms at a time and measures how late it wakes.
pub struct Latency {
    stop: Arc<AtomicBool>,
    probe: JoinHandle<(Duration, u32)>,
}

impl Latency {
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let probe = std::thread::spawn(move || {
            let (mut late, mut n) = (Duration::ZERO, 0u32);
            while !flag.load(Relaxed) {
                let t = Instant::now();
                std::thread::sleep(Duration::from_millis(1));
                late += t.elapsed().saturating_sub(Duration::from_millis(1));
                n += 1;
            }
            (late, n)
        });
        Latency { stop, probe }
    }

    /// The mean overshoot since `start`.
    pub fn stop(self) -> Duration {
        self.stop.store(true, Relaxed);
        match self.probe.join() {
            Ok((late, n)) if n > 0 => late / n,
            _ => Duration::ZERO,
        }
    }
}
