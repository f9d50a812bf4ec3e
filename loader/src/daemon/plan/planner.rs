//! The planner's thread: reads each container's statement of its activity,
//! decides every plan (`vgpu_common::node::decide`) and writes each one into
//! its container's own sidecar (`daemon::apply::plan`).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vgpu_common::clock::clock_ns;
use vgpu_common::node::{self, decide, Seat, HOLD_NS, PLAN_TTL_NS};
use vgpu_common::sidecar::{plan_at, OwnWords, PlanWords, OWN_WORDS_AT};

use super::roster::{Roster, Tenant};
use super::{GpuReport, Report, SeatReport, TURNS_FILE};
use crate::daemon::apply;

/// How often plans are made while no hold is on: a fifth of the hooks'
/// re-plan period.
const TICK: Duration = Duration::from_millis(2);
/// How often while a hold is on: a higher container's work in flight
/// reaches the lower ones within this (their queue is `LOW_QUEUE` long).
const RELAY_TICK: Duration = Duration::from_micros(100);
/// NVML's view supports a container's statement for this long after a
/// sample saw it use the GPU (samples come every scan, NVML's own every
/// ~170 ms).
const CONFIRMED_FOR: Duration = Duration::from_millis(2_500);
/// A statement the kernel's view has not confirmed yet (a container that
/// just started launching) counts for this long, once: then only the
/// kernel's word does, until the container has been quiet for `REARM`. One
/// grace at a time per GPU and `REARM`: however many containers claim, an
/// unconfirmed statement holds a neighbour back at most `GRACE` per `REARM`.
const GRACE: Duration = Duration::from_millis(1_000);
const REARM: Duration = Duration::from_secs(10);
/// `turns.json` is rewritten this often.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// Where the scan leaves each roster for the planner.
#[derive(Debug, Clone, Default)]
pub struct Handle(Arc<Mutex<Arc<Roster>>>);

impl Handle {
    pub fn publish(&self, r: Roster) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(r);
    }

    fn get(&self) -> Arc<Roster> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// What the kernel's view supports of one container on one GPU.
#[derive(Debug, Default, Clone, Copy)]
struct Support {
    /// The last NVML sample that saw it use the GPU.
    confirmed: Option<Instant>,
    /// When it started stating activity NVML had not confirmed.
    claimed: Option<Instant>,
    /// When it last stated no activity.
    quiet: Option<Instant>,
}

impl Support {
    /// Whether its statement (`active`: it says it launched lately) counts.
    /// `gpu_grace`: when a grace last started on this GPU, updated when
    /// this one starts.
    fn counts(&mut self, now: Instant, active: bool, gpu_grace: &mut Option<Instant>) -> bool {
        if self
            .confirmed
            .is_some_and(|c| now.duration_since(c) <= CONFIRMED_FOR)
        {
            self.claimed = None;
            return true;
        }
        if !active {
            self.quiet.get_or_insert(now);
            if self.quiet.is_some_and(|q| now.duration_since(q) >= REARM) {
                self.claimed = None;
            }
            return false;
        }
        self.quiet = None;
        let since = match self.claimed {
            Some(since) => since,
            None if gpu_grace.is_some_and(|g| now.duration_since(g) < REARM) => return false,
            None => {
                *gpu_grace = Some(now);
                *self.claimed.insert(now)
            }
        };
        now.duration_since(since) <= GRACE
    }
}

/// The planner's state.
pub struct Planner {
    handle: Handle,
    state_dir: PathBuf,
    support: HashMap<(u64, String), Support>,
    /// When a grace last started on each GPU.
    graces: HashMap<String, Instant>,
    /// Each seat's last written plan.
    written: HashMap<(u64, usize), PlanWords>,
    last_sample: Option<Instant>,
    reported: Option<Instant>,
}

impl Planner {
    pub fn new(handle: Handle, state_dir: PathBuf) -> Self {
        Self {
            handle,
            state_dir,
            support: HashMap::new(),
            graces: HashMap::new(),
            written: HashMap::new(),
            last_sample: None,
            reported: None,
        }
    }

    /// Plans for ever (the daemon's thread).
    pub fn run(mut self) {
        loop {
            let held = self.step();
            std::thread::sleep(if held { RELAY_TICK } else { TICK });
        }
    }

    /// One round: every GPU's seats decided and the changed plans written.
    /// Returns whether a hold is on somewhere.
    pub fn step(&mut self) -> bool {
        let roster = self.handle.get();
        let now = clock_ns(libc::CLOCK_MONOTONIC);
        let wall = Instant::now();
        let fresh_sample = roster.sampled != self.last_sample;
        self.last_sample = roster.sampled;
        let mut gpus: HashMap<&str, Vec<(&Tenant, usize)>> = HashMap::new();
        for t in &roster.tenants {
            for (ordinal, uuid) in &t.gpus {
                gpus.entry(uuid.as_str()).or_default().push((t, *ordinal));
            }
        }
        let report_due = self
            .reported
            .is_none_or(|r| wall.duration_since(r) >= REPORT_EVERY);
        let mut report = Vec::new();
        let mut held = false;
        for (uuid, seats_of) in gpus {
            let mut seats = Vec::with_capacity(seats_of.len());
            for &(t, ordinal) in &seats_of {
                let own = read_own(&t.sidecar, ordinal);
                let sup = self.support.entry((t.key, uuid.to_owned())).or_default();
                if fresh_sample {
                    let used = roster.used.get(uuid);
                    if used.is_some_and(|b| t.pids.iter().any(|p| b.contains(p))) {
                        sup.confirmed = roster.sampled;
                    }
                }
                let active = own.launched != 0 && now.saturating_sub(own.launched) <= HOLD_NS;
                let mut grace = self.graces.get(uuid).copied();
                let confirmed = sup.counts(wall, active, &mut grace);
                if let Some(g) = grace {
                    self.graces.insert(uuid.to_owned(), g);
                }
                seats.push(Seat {
                    key: t.key,
                    limit: t.limits[ordinal],
                    rank: Some(t.rank),
                    own,
                    confirmed,
                });
            }
            let plans = decide(&seats, now);
            let mut gpu = GpuReport {
                uuid: uuid.to_owned(),
                seats: Vec::new(),
            };
            for ((&(t, ordinal), seat), words) in seats_of.iter().zip(&seats).zip(plans) {
                held |= words.hold_until > now;
                self.write(t, ordinal, words, now);
                if report_due {
                    gpu.seats.push(SeatReport {
                        container: t.id.chars().take(12).collect(),
                        ordinal,
                        sm_limit: seat.limit.map(|l| l.percent()),
                        priority: t.rank.saturating_sub(1),
                        confirmed: seat.confirmed,
                        launching: seat.own.launched != 0
                            && now.saturating_sub(seat.own.launched) <= HOLD_NS,
                        turn_ms: node::decode_turn(words.turn)
                            .map(|p| [p.start as f64 / 1e6, (p.start + p.len) as f64 / 1e6]),
                        held: words.hold_until > now,
                    });
                }
            }
            report.push(gpu);
        }
        let live: std::collections::HashSet<u64> = roster.tenants.iter().map(|t| t.key).collect();
        self.written.retain(|(k, _), _| live.contains(k));
        self.support.retain(|(k, _), _| live.contains(k));
        if report_due {
            self.reported = Some(wall);
            report.sort_by(|a, b| a.uuid.cmp(&b.uuid));
            self.report(report);
        }
        held
    }

    /// Writes `words` as `t`'s plan of `ordinal` when it changed, or when
    /// the written one is half-way to its end (so it never lapses while
    /// the daemon lives).
    fn write(&mut self, t: &Tenant, ordinal: usize, mut words: PlanWords, now: u64) {
        let k = (t.key, ordinal);
        if let Some(&was) = self.written.get(&k) {
            // A block by HAMi's monitor may be about a higher container that
            // has just gone: what was planned for it stands to its end.
            if was.outranked_until > now {
                words.outranked_until = words.outranked_until.max(was.outranked_until);
            }
            let same = PlanWords {
                planned_until: words.planned_until,
                ..was
            } == words;
            if same && was.planned_until > now.saturating_add(PLAN_TTL_NS / 2) {
                return;
            }
        }
        let outcome = apply::plan(&t.sidecar, ordinal, words);
        if !outcome.written() && !self.written.contains_key(&k) {
            tracing::debug!("container {}: plan of device {ordinal}: {outcome:?}", t.id);
        }
        // A failed write is not retried before the plan would need renewing.
        self.written.insert(k, words);
    }

    fn report(&self, gpus: Vec<GpuReport>) {
        let r = Report {
            at_unix_ms: crate::daemon::state::findings::now_ms(),
            frame_ms: node::FRAME_NS / 1_000_000,
            gpus,
        };
        let Ok(body) = serde_json::to_vec_pretty(&r) else {
            return;
        };
        let path = self.state_dir.join(TURNS_FILE);
        let tmp = self.state_dir.join(format!(".{TURNS_FILE}.tmp"));
        if let Err(e) = std::fs::write(&tmp, body).and_then(|()| std::fs::rename(&tmp, &path)) {
            tracing::debug!("{}: {e}", path.display());
        }
    }
}

/// The container's statement of its activity on `ordinal` (zeroes when it
/// cannot be read: no statement).
fn read_own(f: &File, ordinal: usize) -> OwnWords {
    let mut b = [0u8; 24];
    match f.read_exact_at(&mut b, plan_at(ordinal) + OWN_WORDS_AT as u64) {
        Ok(()) => OwnWords::from_bytes(&b),
        Err(_) => OwnWords::default(),
    }
}

/// Starts the planner's thread.
pub fn spawn(handle: Handle, state_dir: PathBuf) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("vgpu-planner".into())
        .spawn(move || Planner::new(handle, state_dir).run())
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_unconfirmed_grace_per_gpu_however_many_claim() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut gpu = None;
        let (mut a, mut b) = (Support::default(), Support::default());
        assert!(
            a.counts(at(0), true, &mut gpu),
            "the first claim gets its grace"
        );
        assert!(!b.counts(at(10), true, &mut gpu), "a second claimant waits");
        assert!(a.counts(at(900), true, &mut gpu));
        assert!(!a.counts(at(1_100), true, &mut gpu), "the grace ends");
        assert!(!b.counts(at(5_000), true, &mut gpu), "still within REARM");
        // After REARM another claimant may start one, and only one.
        assert!(b.counts(at(10_100), true, &mut gpu));
        let mut c = Support::default();
        assert!(!c.counts(at(10_200), true, &mut gpu));
        // Confirmed by the kernel's view, a statement counts whatever the
        // graces.
        c.confirmed = Some(at(10_300));
        assert!(c.counts(at(10_400), true, &mut gpu));
    }
}
