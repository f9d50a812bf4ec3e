//! Time: `CLOCK_MONOTONIC` nanoseconds are shared by every process on the
//! machine, so they are the unit of the device timeline.

use std::time::Duration;

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn mono_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_REALTIME` now, in nanoseconds since the Unix epoch.
pub fn real_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

/// Converts a monotonic timestamp to microseconds since the epoch (the unit
/// of NVML sample timestamps).
pub fn mono_to_real_us(mono: u64) -> u64 {
    let (m, r) = (mono_ns(), real_ns());
    let real = if mono >= m {
        r.saturating_add(mono - m)
    } else {
        r.saturating_sub(m - mono)
    };
    real / 1_000
}

/// Converts microseconds since the epoch to a monotonic timestamp (0 when it
/// lies before the monotonic clock's origin).
pub fn real_us_to_mono(us: u64) -> u64 {
    let (m, r) = (mono_ns(), real_ns());
    let real = us.saturating_mul(1_000);
    if real >= r {
        m.saturating_add(real - r)
    } else {
        m.saturating_sub(r - real)
    }
}

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock ids are constants.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Waits until `CLOCK_MONOTONIC` reaches `deadline` (ns). Long waits sleep;
/// the last stretch spins with `sched_yield`, as a real driver's default
/// synchronization spins, so short kernels keep their exact duration.
pub fn wait_until(deadline: u64) {
    const SPIN_NS: u64 = 150_000;
    loop {
        let now = mono_ns();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SPIN_NS {
            sleep_until(deadline - SPIN_NS / 2);
        } else {
            std::thread::yield_now();
        }
    }
}

fn sleep_until(deadline: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `ts` is a valid timespec; a NULL remainder is allowed with
    // TIMER_ABSTIME. EINTR just returns early and the caller loops.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    };
}

/// Sleeps for a duration (convenience for the server and tests).
pub fn sleep(d: Duration) {
    std::thread::sleep(d);
}
