//! Waiting for a condition, one way for every test: `eventually` polls
//! until the condition holds and panics, naming what it awaited and for how
//! long, when it does not within the time given.

use std::time::{Duration, Instant};

/// What a poll returns: `bool` (`true` once the condition holds) or
/// `Option<T>` (`Some` once it holds, with what the test goes on with).
pub trait Outcome {
    type Value;
    fn done(self) -> Option<Self::Value>;
}

impl Outcome for bool {
    type Value = ();
    fn done(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn done(self) -> Option<T> {
        self
    }
}

/// The first outcome of `poll` that holds, polled until `within` passes;
/// `None` if none held by then (for a test that asserts more than a wait).
/// Polls every 5 ms at first, then every 20 ms: a quick condition is seen
/// quickly, and a test that times what it awaited (a process's death, a
/// finding) reads at most 20 ms late.
pub fn poll_until<O: Outcome>(within: Duration, mut poll: impl FnMut() -> O) -> Option<O::Value> {
    let t = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = poll().done() {
            return Some(v);
        }
        if t.elapsed() > within {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// The first outcome of `poll` that holds; panics ("waited `within` for
/// `what`, in vain") if none does before `within` passes.
#[track_caller]
pub fn eventually<O: Outcome>(within: Duration, what: &str, poll: impl FnMut() -> O) -> O::Value {
    match poll_until(within, poll) {
        Some(v) => v,
        None => panic!("waited {within:?} for {what}, in vain"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventually_gives_what_the_poll_found() {
        let mut n = 0;
        let v = eventually(Duration::from_secs(1), "the third poll", || {
            n += 1;
            (n == 3).then_some(n * 10)
        });
        assert_eq!(v, 30);
        eventually(Duration::from_secs(1), "true", || true);
    }

    #[test]
    #[should_panic(expected = "waited 50ms for nothing, in vain")]
    fn eventually_names_what_it_awaited_and_how_long() {
        eventually(Duration::from_millis(50), "nothing", || false);
    }

    #[test]
    fn poll_until_gives_none_after_its_time() {
        let t = Instant::now();
        assert_eq!(poll_until(Duration::from_millis(50), || None::<u8>), None);
        assert!(t.elapsed() >= Duration::from_millis(50));
    }
}
