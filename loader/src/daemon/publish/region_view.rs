//! What the metrics show of each open region (one container): its labels,
//! its per-device sums and launches, its utilization, and its dead slots.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use vgpu_common::region::{rules, status, ProcSlot, SharedRegion, MAX_DEVICES};

use crate::daemon::apply::{Expect, Field, Target, Write};
use crate::daemon::collect::container_identity::{ContainerIdentities, ContainerIdentity};
use crate::daemon::collect::pods::{PodName, PodNames};
use crate::daemon::collect::region_cache::{RegionCache, RegionKey};
use crate::daemon::collect::region_owner::{region_owner, RegionOwner};
use crate::daemon::judge::launches::Ledger;
use crate::daemon::judge::utilization::{daemon_publishes, Measured, Utilization};
use crate::daemon::publish::snapshot::{Labels, RegionDevice, RegionView};
use crate::regions::liveness::{AliveBy, Mappers};

/// The longest value of any label: what a tenant names (a region path may
/// be 4 KB) repeats on every series of its region. Every value HAMi and
/// Kubernetes make stays within it, so a value cut to it means a tenant
/// did something unusual: a region path under HAMi's layout
/// (`/usr/local/vgpu/containers/<pod-uid>_<container>/<uuid>.cache`, with a
/// 63-byte container name) is 180 bytes, a systemd cgroup path of a
/// Kubernetes container about 200, a pod name at most 253.
pub const LABEL_BYTES: usize = 256;

/// `v` unchanged when it has at most `max` bytes; else `…`, its tail (a
/// path's most telling part) and `#` with a hash of the whole value, `max`
/// bytes in all, so two long values stay two series. A tenant can make its
/// own values collide, which only merges its own series. The second value
/// says whether `v` was shortened.
pub fn bounded_label(v: String, max: usize) -> (String, bool) {
    use std::hash::{Hash, Hasher};
    if v.len() <= max {
        return (v, false);
    }
    let mut h = std::hash::DefaultHasher::new();
    v.hash(&mut h);
    let suffix = format!("#{:08x}", h.finish() as u32);
    let keep = max.saturating_sub(suffix.len() + '…'.len_utf8());
    let mut from = v.len() - keep.min(v.len());
    while !v.is_char_boundary(from) {
        from += 1;
    }
    (format!("…{}{suffix}", &v[from..]), true)
}

/// The DRA claim whose directory holds `region` (`…/claims/<claim UID>/<file>`,
/// where vgpu's and HAMi's DRA drivers put a claim's regions).
fn claim_of(region: &Path) -> Option<String> {
    let mut parts = region.iter().rev();
    let _file = parts.next()?;
    let uid = parts.next()?.to_str()?;
    (parts.next()? == "claims" && !uid.is_empty()).then(|| uid.to_owned())
}

/// A region's labels: HAMi's monitor's first (namespace, pod, container;
/// the device's `vdevice_index` and `device_uuid` follow per device), then
/// vgpu's, and `claim_uid` for a DRA claim's region. `name` is the pod's,
/// `owner` says whose the region is ([`region_owner`]), `id` is the cgroup
/// identity of a process using it.
pub fn labels(
    name: Option<&PodName>,
    owner: RegionOwner,
    id: &ContainerIdentity,
    region: &Path,
) -> Labels {
    let mut l = vec![
        (
            "namespace".to_owned(),
            name.map(|n| n.namespace.clone()).unwrap_or_default(),
        ),
        (
            "pod".to_owned(),
            name.map(|n| n.pod.clone()).unwrap_or_default(),
        ),
        ("container".to_owned(), owner.container),
        ("pod_uid".to_owned(), owner.pod_uid),
        (
            "container_id".to_owned(),
            id.container_id.clone().unwrap_or_default(),
        ),
        ("cgroup".to_owned(), id.cgroup.clone()),
        ("region".to_owned(), region.display().to_string()),
    ];
    if let Some(uid) = claim_of(region) {
        l.push(("claim_uid".to_owned(), uid));
    }
    l
}

/// `labels` with every value within its bound; whether one was shortened.
fn bound_labels(labels: Labels) -> (Labels, bool) {
    let mut cut = false;
    let labels = labels
        .into_iter()
        .map(|(k, v)| {
            let (v, c) = bounded_label(v, LABEL_BYTES);
            cut |= c;
            (k, v)
        })
        .collect();
    (labels, cut)
}

/// What [`views`] makes of the cache.
#[derive(Debug, Default)]
pub struct Views {
    pub regions: Vec<RegionView>,
    pub measured: Vec<Measured>,
    /// Containers with a label value shortened to its bound.
    pub labels_shortened: usize,
    /// The slots' measured `sm_util` to write, for HAMi's monitor, where
    /// the region does not SM-limit the device (`daemon::apply` makes
    /// them: each lands only while the slot's `hostpid` is still the
    /// process measured; a slot taken over since keeps its value).
    pub sm_util: Vec<Write>,
}

/// One view per open, initialised region of `cache`, and each container's
/// measured utilization: labels (`ids`, `pods`, each value within its
/// bound), per-device sums, launches (`launches` keeps them monotonic) and
/// the utilization `util` gives, with the per-slot values to write into
/// the slots of devices the region does not SM-limit (written by
/// `daemon::apply`, not here: the regions are only read).
pub fn views(
    cache: &RegionCache,
    ids: &mut ContainerIdentities,
    pods: &PodNames,
    launches: &mut Ledger,
    dead: &mut DeadSlots,
    util: &Utilization<'_>,
) -> Views {
    let mut views = Vec::new();
    let mut measured = Vec::new();
    let mut shortened = std::collections::HashSet::new();
    let mut sm_util = Vec::new();
    launches.begin_scan();
    dead.begin_scan();
    // In file order, so the views come out the same at every scan without
    // sorting thousands of label sets.
    let mut open: Vec<_> = cache.iter().collect();
    open.sort_unstable_by_key(|(k, _)| **k);
    for (key, r) in open {
        let Some(region) = r.last_snapshot() else {
            continue;
        };
        if !region.is_initialized() {
            continue;
        }
        let id = r.cgroup_id.map(|c| ids.of(c)).unwrap_or_default();
        let owner = region_owner(r.owner.as_ref(), &id);
        let name = pods.get(&owner.pod_uid);
        let (labels, cut) = bound_labels(labels(name, owner, &id, &r.shown_path));
        if cut {
            shortened.insert(r.tenant());
        }
        let mut devices = devices(region);
        let counted = launches.observe(*key, region);
        let mut m = Measured {
            dev: key.0,
            ino: key.1,
            region: r.shown_path.display().to_string(),
            devices: Vec::new(),
        };
        for d in &mut devices {
            d.launches = counted.get(d.index).copied().unwrap_or(0);
            if let Some(u) = util.container(key, &d.uuid, d.index) {
                d.sm_util = u;
                m.devices.push((d.index, u));
            }
            if daemon_publishes(d.sm_limit) {
                for (slot, host_pid, percent) in util.per_slot(key, &d.uuid, d.index) {
                    // A host PID past i32 is in no slot.
                    let Ok(host_pid) = i32::try_from(host_pid) else {
                        continue;
                    };
                    sm_util.push(Write {
                        target: Target::Region(*key),
                        field: Field::SlotSmUtil {
                            slot,
                            device: d.index,
                        },
                        value: percent,
                        expect: Expect::SlotHostPid(host_pid),
                    });
                }
            }
        }
        if !m.devices.is_empty() {
            measured.push(m);
        }
        views.push(RegionView {
            labels,
            devices,
            dead_slots: dead.count(*key, region),
            last_kernel_time: region.last_kernel_time.load(SeqCst),
        });
    }
    launches.end_scan();
    dead.end_scan();
    measured.sort_by(|a, b| a.region.cmp(&b.region));
    Views {
        regions: views,
        measured,
        labels_shortened: shortened.len(),
        sm_util,
    }
}

/// Per-device sums over slots with status != 0, as HAMi's monitor makes them,
/// for the devices the region has (`i < device_num`, as HAMi's monitor) and
/// any other with usage on it. A limit alone shows a device only while
/// `device_num` is unset: a container-wide limit is written for all 16
/// indexes, and 16 devices' series for a one-GPU container would make
/// `/metrics` grow with what a region claims, not with its devices.
pub fn devices(region: &SharedRegion) -> Vec<RegionDevice> {
    let device_num = region.device_num.load(SeqCst).min(MAX_DEVICES as u64) as usize;
    let mut devs: Vec<RegionDevice> = (0..MAX_DEVICES)
        .map(|d| RegionDevice {
            index: d,
            limit: region.limit[d].load(SeqCst),
            sm_limit: region.sm_limit[d].load(SeqCst),
            ..RegionDevice::default()
        })
        .collect();
    for s in region.active_slots() {
        if s.status.load(SeqCst) == status::EXITED {
            continue;
        }
        for (d, dev) in devs.iter_mut().enumerate() {
            let m = &s.used[d];
            dev.total = dev.total.saturating_add(m.total.load(SeqCst));
            dev.context = dev.context.saturating_add(m.context_size.load(SeqCst));
            dev.module = dev.module.saturating_add(m.module_size.load(SeqCst));
            dev.data = dev.data.saturating_add(m.data_size.load(SeqCst));
            dev.offset = dev.offset.saturating_add(m.offset.load(SeqCst));
            dev.host = dev.host.saturating_add(m.host_bytes.load(SeqCst));
            dev.sm_util = dev
                .sm_util
                .saturating_add(s.device_util[d].sm_util.load(SeqCst));
        }
    }
    devs.retain(|d| {
        d.index < device_num
            || d.total != 0
            || (device_num == 0 && rules::memory_limit(d.limit).is_some())
    });
    // Only for the devices shown: a scan of thousands of regions makes
    // no string for the other 15.
    for d in &mut devs {
        let (uuid, len) = region.uuid(d.index);
        d.uuid = String::from_utf8_lossy(&uuid[..len])
            .chars()
            .take(40)
            .collect();
    }
    devs
}

/// Slots in use (pid set, not exited), with their index.
fn in_use(region: &SharedRegion) -> impl Iterator<Item = (usize, &ProcSlot)> {
    region
        .active_slots()
        .iter()
        .enumerate()
        .filter(|(_, s)| s.pid.load(SeqCst) != 0 && s.status.load(SeqCst) != status::EXITED)
}

/// A live slot's process is looked at again this long after it was last
/// found alive: judging one costs a few `/proc` reads, and a node has
/// thousands of slots in use while a scan runs every half second.
pub const RECHECK_ALIVE: Duration = Duration::from_secs(10);

/// A slot as judged: region, index, and what it records (pid, host PID,
/// PID namespace, start time). Another process in the slot is another key.
type SlotKey = (RegionKey, usize, i32, i32, u64, u64);

/// Slots in use whose process is certainly gone, judged by host PID alone
/// (the region's `hostpid` is the tenant's to write: a wrong one only
/// miscounts its own container), remembered across scans: a slot found
/// dead stays dead (its record names a process that is gone, and the record
/// is the key), one found alive is judged again after [`RECHECK_ALIVE`]. A
/// process that exits is then counted dead within that long.
#[derive(Debug, Default)]
pub struct DeadSlots {
    seen: HashMap<SlotKey, Judged>,
    scan: u64,
}

/// What [`DeadSlots`] last found of a slot.
#[derive(Debug, Clone, Copy)]
struct Judged {
    dead: bool,
    /// `/proc/<hostpid>` is the process the slot records.
    alive_at_hostpid: bool,
    at: Instant,
    /// The last scan that saw the slot in use.
    scan: u64,
}

fn slot_key(key: RegionKey, i: usize, s: &ProcSlot) -> SlotKey {
    (
        key,
        i,
        s.pid.load(SeqCst),
        s.hostpid.load(SeqCst),
        s.pidns.load(SeqCst),
        s.start.load(SeqCst),
    )
}

impl DeadSlots {
    fn count(&mut self, key: RegionKey, region: &SharedRegion) -> u64 {
        let none = Mappers::none();
        let scan = self.scan;
        in_use(region)
            .filter(|(i, s)| {
                let v = self.seen.entry(slot_key(key, *i, s)).or_insert(Judged {
                    dead: false,
                    alive_at_hostpid: false,
                    at: Instant::now(),
                    scan: 0,
                });
                let fresh = v.scan != 0 && (v.dead || v.at.elapsed() < RECHECK_ALIVE);
                if !fresh {
                    let a = none.slot_liveness(s);
                    v.dead = a.is_certainly_dead();
                    v.alive_at_hostpid = a.alive && a.by == AliveBy::Hostpid;
                    v.at = Instant::now();
                }
                v.scan = scan;
                v.dead
            })
            .count() as u64
    }

    /// Whether slot `i` of region `key`, still recording what `s` records,
    /// was found alive at its host PID less than [`RECHECK_ALIVE`] ago:
    /// judging it again now would find what it found then (the reclaimer
    /// skips it; it is judged again within that long).
    pub fn alive_lately(&self, key: RegionKey, i: usize, s: &ProcSlot) -> bool {
        self.seen
            .get(&slot_key(key, i, s))
            .is_some_and(|v| v.alive_at_hostpid && v.at.elapsed() < RECHECK_ALIVE)
    }

    fn begin_scan(&mut self) {
        self.scan = self.scan.wrapping_add(1).max(1);
    }

    /// Forgets slots this scan did not see (freed, retaken, region closed).
    fn end_scan(&mut self) {
        let scan = self.scan;
        self.seen.retain(|_, v| v.scan == scan);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_region_names_its_claim() {
        let p = |s: &str| claim_of(Path::new(s));
        assert_eq!(
            p("/usr/local/vgpu/claims/7c0ffee1-2b3c/3f2a.cache").as_deref(),
            Some("7c0ffee1-2b3c")
        );
        assert_eq!(p("/usr/local/vgpu/containers/p_c/usage.cache"), None);
        assert_eq!(p("/claims/x"), None);
        assert_eq!(p("r.cache"), None);
    }
    use std::sync::atomic::Ordering::Relaxed;
    use vgpu_common::region_io::RegionSnapshot;

    /// A long value keeps its tail and a hash within the bound; two long
    /// values that share the tail stay apart; a short one is unchanged.
    #[test]
    fn long_label_values_are_bounded_and_stay_distinct() {
        let long = |c: char| format!("/{}/x{}.cache", "d".repeat(3800), c);
        let (a, cut) = bounded_label(long('a'), LABEL_BYTES);
        assert!(cut && a.len() <= LABEL_BYTES, "{a}");
        assert!(a.starts_with('…') && a.contains("xa.cache#"), "{a}");
        let (b, _) = bounded_label(format!("/e{}", long('a')), LABEL_BYTES);
        assert_ne!(a, b);
        let multibyte = "é".repeat(100);
        let (m, _) = bounded_label(multibyte, 64);
        assert!(m.len() <= 64, "{m}");
        assert_eq!(
            bounded_label("/tmp/r.cache".into(), LABEL_BYTES),
            ("/tmp/r.cache".into(), false)
        );
    }

    /// The values HAMi's own layout and Kubernetes give a container are
    /// never cut: a region under HAMi's directory with the longest
    /// container name, a systemd cgroup path, a full container id.
    #[test]
    fn hami_shaped_labels_are_within_their_bounds() {
        let owner = RegionOwner {
            pod_uid: "0f1e2d3c-4b5a-4968-8776-655443322110".to_owned(),
            container: "c".repeat(63),
        };
        let region = Path::new("/usr/local/vgpu/containers")
            .join(format!("{}_{}", owner.pod_uid, owner.container))
            .join("6f9619ff-8b86-4d01-b42d-00c04fc964ff.cache");
        let id = ContainerIdentity::from_cgroup_path(&format!(
            "/kubepods.slice/kubepods-besteffort.slice/\
             kubepods-besteffort-pod{}.slice/cri-containerd-{}.scope",
            owner.pod_uid.replace('-', "_"),
            "a".repeat(64)
        ));
        assert_eq!(id.container_id.as_deref(), Some("a".repeat(64).as_str()));
        let name = PodName {
            namespace: "n".repeat(63),
            pod: "p".repeat(253),
        };
        let (labels, cut) = bound_labels(labels(Some(&name), owner, &id, &region));
        assert!(!cut, "{labels:?}");
        let shown = labels.iter().find(|(k, _)| k == "region").map(|(_, v)| v);
        assert_eq!(shown, Some(&region.display().to_string()));
    }

    /// Sums count slots that are not exited, as HAMi's monitor does; a
    /// device shows when the region has it or usage on it, or a limit
    /// while `device_num` is unset. A slot whose host PID is gone is a dead
    /// slot.
    #[test]
    fn devices_sum_live_slots_and_dead_slots_are_counted() {
        let r = RegionSnapshot::zeroed();
        r.device_num.store(1, Relaxed);
        r.set_uuid(0, b"GPU-0");
        r.limit[2].store(1 << 30, Relaxed);
        r.proc_num.store(3, Relaxed);
        let me = std::process::id() as i32;
        let gone = {
            let mut c = std::process::Command::new("true").spawn().unwrap();
            let pid = c.id() as i32;
            c.wait().unwrap();
            pid
        };
        for (i, (st, host)) in [
            (status::RUNNING, me),
            (status::EXITED, me),
            (status::RUNNING, gone),
        ]
        .into_iter()
        .enumerate()
        {
            let s = &r.procs[i];
            s.pid.store(i as i32 + 1, Relaxed);
            s.hostpid.store(host, Relaxed);
            s.status.store(st, Relaxed);
            s.used[0].data_size.store(100, Relaxed);
            s.used[0].context_size.store(10, Relaxed);
            s.used[0].total.store(110, Relaxed);
            s.used[0].host_bytes.store(30, Relaxed);
            s.device_util[0].sm_util.store(20, Relaxed);
        }
        r.procs[0].used[3].total.store(7, Relaxed);
        let devs = devices(&r);
        assert_eq!(devs.iter().map(|d| d.index).collect::<Vec<_>>(), vec![0, 3]);
        let d0 = &devs[0];
        assert_eq!(d0.uuid, "GPU-0");
        assert_eq!(
            (d0.total, d0.data, d0.context, d0.sm_util, d0.host),
            (220, 200, 20, 40, 60)
        );
        assert_eq!((devs[1].limit, devs[1].total), (0, 7));
        let mut dead = DeadSlots::default();
        dead.begin_scan();
        assert_eq!(dead.count((0, 0), &r), 1);
        // Remembered: the next scan reads no `/proc` for it, and a slot
        // that leaves use is forgotten.
        dead.end_scan();
        dead.begin_scan();
        assert_eq!(dead.count((0, 0), &r), 1);
        dead.end_scan();
        r.procs[2].status.store(status::EXITED, Relaxed);
        dead.begin_scan();
        assert_eq!(dead.count((0, 0), &r), 0);
        dead.end_scan();
        assert_eq!(dead.seen.len(), 1, "the live slot only");
        r.device_num.store(0, Relaxed);
        let limited: Vec<usize> = devices(&r).iter().map(|d| d.index).collect();
        assert_eq!(limited, vec![0, 2, 3], "before device_num is set");
    }
}
