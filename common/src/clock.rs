//! Kernel clocks as nanoseconds. The node table's instants are
//! CLOCK_MONOTONIC ns (shared by every container of a host), stamped by the
//! hook and read back by `vgpu turns`, so both read the clock here.

/// `clock_gettime(id)` in ns (0 if the clock does not exist).
#[inline]
pub fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; clock_gettime goes through the
    // vDSO for the monotonic and realtime clocks (no syscall).
    unsafe { libc::clock_gettime(id, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// CLOCK_MONOTONIC now, ns.
#[inline]
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Sleeps until CLOCK_MONOTONIC reads `t` ns (or a little past it);
/// signals interrupt it at most 16 times.
pub fn sleep_until_monotonic(t: u64) {
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    };
    for _ in 0..16 {
        // SAFETY: `ts` is a valid absolute time; no remainder pointer is
        // needed with TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                core::ptr::null_mut(),
            )
        };
        if rc != libc::EINTR {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_advances() {
        let a = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = monotonic_ns();
        assert!(a > 0 && b >= a + 2_000_000, "{a} then {b}");
    }

    #[test]
    fn a_sleep_ends_at_its_deadline() {
        let t = monotonic_ns() + 3_000_000;
        sleep_until_monotonic(t);
        assert!(monotonic_ns() >= t);
    }
}
