//! What a container's limits should be, from an environment the container
//! cannot change (its OCI spec's `process.env`), parsed exactly as the hook
//! parses its own environment, plus the changes admins made since.

use std::path::PathBuf;

use vgpu_common::env::{MEMORY_LIMIT, SM_LIMIT};
use vgpu_common::limit::{device_limits, parse_percent, parse_size, LimitError};
use vgpu_common::region::rules::{memory_limit, sm_limit_shown, SM_UNLIMITED};
use vgpu_common::region::MAX_DEVICES;
use vgpu_common::region_place::region_place;

/// HAMi's per-container opt-in to having processes over their limit killed
/// (its library reads it and never acts on it).
pub const ACTIVE_OOM_KILLER: &str = "ACTIVE_OOM_KILLER";
pub use vgpu_common::env::{CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES};

/// HAMi's whole-GPU opt-out: its device plugin mounts no
/// `/etc/ld.so.preload` into a container whose spec sets it to a true value
/// (HAMi v2.10.0, `pkg/device-plugin/nvidiadevice/nvinternal/plugin/
/// server.go` `Allocate`), so the container runs without a hook by design.
pub const DISABLE_CONTROL: &str = "CUDA_DISABLE_CONTROL";

/// Does the spec environment `env` opt the container out of the hook?
/// True as HAMi's device plugin decides it: Go's `strconv.ParseBool`. A
/// value HAMi does not take as true (Volcano's plugin skips the preload for
/// any value) is not an opt-out here: such a container is still judged.
pub fn disables_control(env: &[String]) -> bool {
    lookup(env.iter().map(String::as_str), DISABLE_CONTROL)
        .is_some_and(|v| matches!(v.as_str(), "1" | "t" | "T" | "TRUE" | "true" | "True"))
}

/// Per-device limits as the hook stores them in a region: bytes (0 = none)
/// and percent (100 = none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub mem: [u64; MAX_DEVICES],
    pub sm: [u64; MAX_DEVICES],
}

impl Limits {
    /// Limits from `KEY=value` records, as the hook reads its environment
    /// (the first record of a name wins, like `getenv`).
    pub fn from_env<'a>(
        env: impl IntoIterator<Item = &'a str> + Clone,
    ) -> (Limits, Vec<LimitError>) {
        let get = |name: &str| lookup(env.clone(), name);
        let mem = device_limits(MEMORY_LIMIT, 0, parse_size, get);
        let sm = device_limits(SM_LIMIT, SM_UNLIMITED, parse_percent, get);
        let mut errors = mem.errors;
        errors.extend(sm.errors);
        (
            Limits {
                mem: mem.values,
                sm: sm.values.map(sm_limit_shown),
            },
            errors,
        )
    }

    /// Whether any device has a memory or SM limit.
    pub fn any(&self) -> bool {
        self.mem.iter().any(|&m| memory_limit(m).is_some())
            || self.sm.iter().any(|&s| s != SM_UNLIMITED)
    }
}

/// What the device plugin gave one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub limits: Limits,
    /// The region its processes must name (`CUDA_DEVICE_MEMORY_SHARED_CACHE`
    /// or HAMi's default).
    pub region: PathBuf,
    /// `ACTIVE_OOM_KILLER` is `true` or `1`.
    pub oom_killer: bool,
    /// How many GPUs the spec gives it: the fewer of those
    /// `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` list (`None`:
    /// neither names any: unset, `all`, …).
    pub devices: Option<usize>,
    /// The GPUs `NVIDIA_VISIBLE_DEVICES` names, in order (UUIDs or node
    /// indexes; `None`: it names none, every GPU of the node is visible),
    /// and the `CUDA_VISIBLE_DEVICES` entries that reorder them.
    pub visible: Option<Vec<String>>,
    pub cuda_visible: Option<Vec<String>>,
    /// Limit variables of the spec that did not parse (the hook refuses
    /// them too, so the device has no limit).
    pub errors: Vec<LimitError>,
}

impl Expected {
    /// The expectations of a container whose spec environment is `env`;
    /// `None` when it sets no limit (not a container vgpu limits).
    pub fn from_env(env: &[String]) -> Option<Expected> {
        let records = env.iter().map(String::as_str);
        let (limits, errors) = Limits::from_env(records.clone());
        if !limits.any() {
            return None;
        }
        let region = region_place(|name| lookup(records.clone(), name)).0.path();
        let oom_killer = lookup(records.clone(), ACTIVE_OOM_KILLER)
            .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        let devices = [NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES]
            .into_iter()
            .filter_map(|name| lookup(records.clone(), name).and_then(|v| listed(&v)))
            .min();
        let entries = |name| {
            let v = lookup(records.clone(), name)?;
            listed(&v)?;
            Some(
                v.split(',')
                    .map(|d| d.trim().to_owned())
                    .filter(|d| !d.is_empty())
                    .collect(),
            )
        };
        Some(Expected {
            limits,
            region,
            oom_killer,
            devices,
            visible: entries(NVIDIA_VISIBLE_DEVICES),
            cuda_visible: entries(CUDA_VISIBLE_DEVICES),
            errors,
        })
    }

    /// The CUDA ordinal (the `_i` of its limit variables) the node's GPU
    /// `index` / `uuid` has in this container, from its spec: its place in
    /// `NVIDIA_VISIBLE_DEVICES` (the node index when that names none), then
    /// in `CUDA_VISIBLE_DEVICES` when the spec sets that too. `None`: the
    /// spec did not give it this GPU.
    pub fn ordinal(&self, index: u32, uuid: &str) -> Option<usize> {
        let is = |entry: &str, n: usize, uuid: &str| {
            entry == uuid || entry.parse::<usize>().ok() == Some(n)
        };
        let placed = match &self.visible {
            Some(list) => list.iter().position(|e| is(e, index as usize, uuid))?,
            None => index as usize,
        };
        let ordinal = match &self.cuda_visible {
            Some(list) => list.iter().position(|e| is(e, placed, uuid))?,
            None => placed,
        };
        (ordinal < MAX_DEVICES).then_some(ordinal)
    }

    /// The limits once an admin's recorded changes apply.
    pub fn with_overrides(&self, o: &Overrides) -> Limits {
        let mut l = self.limits;
        for (&d, &v) in &o.mem {
            if let Some(cell) = l.mem.get_mut(d) {
                *cell = v;
            }
        }
        for (&d, &v) in &o.sm {
            if let Some(cell) = l.sm.get_mut(d) {
                *cell = sm_limit_shown(v);
            }
        }
        l
    }
}

/// Limits an admin set with `vgpu set-mem-limit` / `set-sm-limit`, by device.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Overrides {
    #[serde(default)]
    pub mem: std::collections::BTreeMap<usize, u64>,
    #[serde(default)]
    pub sm: std::collections::BTreeMap<usize, u64>,
}

/// How many devices a `*_VISIBLE_DEVICES` value names; `None` for a
/// value that names none (`all`, `none`, `void`, empty).
fn listed(v: &str) -> Option<usize> {
    let n = v.split(',').filter(|d| !d.trim().is_empty()).count();
    let named = !matches!(v.trim(), "all" | "none" | "void" | "");
    (named && n > 0).then_some(n.min(MAX_DEVICES))
}

/// The value of the first `name=` record.
pub fn lookup<'a>(env: impl IntoIterator<Item = &'a str>, name: &str) -> Option<String> {
    env.into_iter()
        .find_map(|rec| rec.strip_prefix(name)?.strip_prefix('=').map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn the_whole_gpu_opt_out_is_hamis_parse_bool() {
        let env = |v: &str| vec![format!("{DISABLE_CONTROL}={v}")];
        for v in ["1", "t", "T", "TRUE", "true", "True"] {
            assert!(disables_control(&env(v)), "{v}");
        }
        for v in ["0", "false", "", "yes", "tRUE"] {
            assert!(!disables_control(&env(v)), "{v}");
        }
        assert!(!disables_control(&[]));
    }

    fn env(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn limits_parse_like_the_hook() {
        let e = Expected::from_env(&env(&[
            "PATH=/bin",
            "CUDA_DEVICE_MEMORY_LIMIT=1g",
            "CUDA_DEVICE_MEMORY_LIMIT_1=2g",
            "CUDA_DEVICE_SM_LIMIT=30",
            "CUDA_DEVICE_MEMORY_LIMIT=8g",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/a.cache",
            "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b",
        ]))
        .unwrap();
        assert_eq!(e.limits.mem[0], G, "the first record wins, as getenv");
        assert_eq!(e.limits.mem[1], 2 * G);
        assert_eq!(e.limits.mem[15], G);
        assert_eq!(e.limits.sm[0], 30);
        assert_eq!(e.region, PathBuf::from("/usr/local/vgpu/a.cache"));
        assert_eq!(e.devices, Some(2));
        assert!(!e.oom_killer);
        let narrowed = Expected::from_env(&env(&[
            "CUDA_DEVICE_MEMORY_LIMIT=1g",
            "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b,GPU-c",
            "CUDA_VISIBLE_DEVICES=0",
        ]))
        .unwrap();
        assert_eq!(narrowed.devices, Some(1));
        let all = Expected::from_env(&env(&[
            "CUDA_DEVICE_MEMORY_LIMIT=1g",
            "NVIDIA_VISIBLE_DEVICES=all",
            "CUDA_VISIBLE_DEVICES=0,1",
        ]))
        .unwrap();
        assert_eq!(all.devices, Some(2));
        assert!(e.errors.is_empty());
    }

    #[test]
    fn a_node_gpu_is_placed_as_the_spec_lists_it() {
        let spec = |v: &[&str]| {
            let mut v = v.to_vec();
            v.push("CUDA_DEVICE_MEMORY_LIMIT=1g");
            Expected::from_env(&env(&v)).unwrap()
        };
        // Nothing named: the node's index.
        let all = spec(&["NVIDIA_VISIBLE_DEVICES=all"]);
        assert_eq!(all.ordinal(3, "GPU-d"), Some(3));
        // By UUID or index, in the spec's order; a GPU it was not given has none.
        let two = spec(&["NVIDIA_VISIBLE_DEVICES=GPU-c,1"]);
        assert_eq!(two.ordinal(2, "GPU-c"), Some(0));
        assert_eq!(two.ordinal(1, "GPU-b"), Some(1));
        assert_eq!(two.ordinal(0, "GPU-a"), None);
        // CUDA_VISIBLE_DEVICES reorders what NVIDIA_VISIBLE_DEVICES gives.
        let re = spec(&[
            "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b",
            "CUDA_VISIBLE_DEVICES=1,0",
        ]);
        assert_eq!(re.ordinal(0, "GPU-a"), Some(1));
        assert_eq!(re.ordinal(1, "GPU-b"), Some(0));
        assert_eq!(re.ordinal(7, "GPU-h"), None);
    }

    #[test]
    fn no_limit_is_no_expectation() {
        assert_eq!(Expected::from_env(&env(&["PATH=/bin"])), None);
        assert_eq!(
            Expected::from_env(&env(&[
                "CUDA_DEVICE_SM_LIMIT=0",
                "CUDA_DEVICE_MEMORY_LIMIT=0"
            ])),
            None
        );
        // A malformed value gives no limit (as in the hook), and says why.
        assert_eq!(
            Expected::from_env(&env(&["CUDA_DEVICE_MEMORY_LIMIT=1024mb"])),
            None
        );
        let e = Expected::from_env(&env(&[
            "CUDA_DEVICE_MEMORY_LIMIT_0=1g",
            "CUDA_DEVICE_MEMORY_LIMIT_1=1.5g",
        ]))
        .unwrap();
        assert_eq!((e.limits.mem[0], e.limits.mem[1]), (G, 0));
        assert_eq!(e.errors.len(), 1);
        assert_eq!(
            e.region,
            PathBuf::from(vgpu_common::env::SHARED_CACHE_DEFAULT)
        );
        assert_eq!(e.devices, None);
    }

    #[test]
    fn oom_killer_is_an_explicit_opt_in() {
        for (v, want) in [
            ("true", true),
            ("TRUE", true),
            ("1", true),
            ("false", false),
            ("0", false),
            ("yes", false),
        ] {
            let e = Expected::from_env(&env(&[
                "CUDA_DEVICE_MEMORY_LIMIT=1g",
                &format!("ACTIVE_OOM_KILLER={v}"),
            ]))
            .unwrap();
            assert_eq!(e.oom_killer, want, "{v}");
        }
    }

    #[test]
    fn overrides_replace_single_devices() {
        let e = Expected::from_env(&env(&["CUDA_DEVICE_MEMORY_LIMIT=1g"])).unwrap();
        let o = Overrides {
            mem: [(0, 4 * G), (99, 1)].into_iter().collect(),
            sm: [(1, 0)].into_iter().collect(),
        };
        let l = e.with_overrides(&o);
        assert_eq!((l.mem[0], l.mem[1]), (4 * G, G));
        assert_eq!(l.sm[1], SM_UNLIMITED);
    }
}
