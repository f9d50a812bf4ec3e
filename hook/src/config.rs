//! The environment, read once into an immutable [`Config`] (no `getenv`
//! after init). Bad values are reported once, clearly, and the limit they
//! would have set is refused (no limit), never guessed.

use std::path::PathBuf;

use vgpu_common::env as names;
use vgpu_common::limit::{device_limits, parse_percent, parse_size, LimitError};
use vgpu_common::region::rules::SM_UNLIMITED;
use vgpu_common::region::{policy, MAX_DEVICES};
use vgpu_common::region_place::{region_place, RegionPlace};

#[derive(Debug, Clone)]
pub struct Config {
    pub region_path: PathBuf,
    /// The region lies in a per-container directory the hook makes
    /// (`vgpu_common::region_place`).
    pub per_container_region: bool,
    /// `CUDA_TASK_PRIORITY` was set: the container takes part in the
    /// node's priorities (which the daemon plans) even without a limit.
    pub priority_stated: bool,
    /// Bytes per container-visible device; 0 = no limit.
    pub mem_limit: [u64; MAX_DEVICES],
    /// Percent per device (100 = no limit).
    pub sm_limit: [u64; MAX_DEVICES],
    pub priority: i32,
    pub policy: i32,
    /// `NVIDIA_VISIBLE_DEVICES`: the container's devices in index order when
    /// it lists UUIDs (`crate::devices`).
    pub nvidia_visible: Option<String>,
    /// `CUDA_OVERSUBSCRIBE=true`: a plain device allocation that fits the
    /// limit but not the device is served from host memory
    /// (`crate::memory::oversubscribe`).
    pub oversubscribe: bool,
    /// Device bytes an oversubscribed container leaves free
    /// (`VGPU_OVERSUBSCRIBE_RESERVE`).
    pub oversubscribe_reserve: u64,
    /// Problems found while reading the environment, reported once at init.
    pub errors: Vec<LimitError>,
    pub other_errors: Vec<String>,
}

impl Config {
    pub fn from_env() -> Self {
        let mut cfg = Self::from_lookup(|k| std::env::var(k).ok());
        cfg.make_region_dir();
        cfg
    }

    /// Makes the per-container region's directory (a host that names no
    /// cache file leaves it to the library, as HAMi-core does); one that
    /// cannot be made leaves the region at HAMi's default, in the container,
    /// with the reason reported.
    pub fn make_region_dir(&mut self) {
        if !self.per_container_region {
            return;
        }
        let Some(dir) = self.region_path.parent() else {
            return;
        };
        use std::os::unix::fs::DirBuilderExt as _;
        // Every user of the container may attach (the umask still applies).
        match std::fs::DirBuilder::new().mode(0o777).create(dir) {
            Ok(()) => {}
            // Not through a symlink: `containers/` is shared by every pod
            // of the node.
            Err(e)
                if e.kind() == std::io::ErrorKind::AlreadyExists
                    && std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) => {}
            Err(e) => {
                self.other_errors.push(format!(
                    "cannot make {}: {e}; the region is {}",
                    dir.display(),
                    names::SHARED_CACHE_DEFAULT
                ));
                self.region_path = names::SHARED_CACHE_DEFAULT.into();
                self.per_container_region = false;
            }
        }
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let mem = device_limits(names::MEMORY_LIMIT, 0, parse_size, &lookup);
        let sm = device_limits(names::SM_LIMIT, SM_UNLIMITED, parse_percent, &lookup);
        let mut other_errors = Vec::new();
        let priority_stated = lookup(names::TASK_PRIORITY).is_some();
        let priority = match lookup(names::TASK_PRIORITY) {
            None => 1,
            Some(v) => v.trim().parse::<i32>().unwrap_or_else(|_| {
                other_errors.push(format!(
                    "{}={v:?} is not an integer; using priority 1",
                    names::TASK_PRIORITY
                ));
                1
            }),
        };
        let policy = match lookup(names::UTILIZATION_POLICY).as_deref() {
            Some("FORCE") | Some("force") => policy::FORCE,
            Some("DISABLE") | Some("disable") => policy::DISABLE,
            _ => policy::DEFAULT,
        };
        let (region, why) = region_place(&lookup);
        other_errors.extend(why);
        let region_path = region.path();
        let per_container = matches!(region, RegionPlace::PerContainer(_));
        let nvidia_visible = lookup(names::NVIDIA_VISIBLE_DEVICES);
        let oversubscribe = match lookup(names::OVERSUBSCRIBE).as_deref().map(str::trim) {
            None | Some("") => false,
            Some(v) if v.eq_ignore_ascii_case("true") || v == "1" => true,
            Some(v) if v.eq_ignore_ascii_case("false") || v == "0" => false,
            Some(v) => {
                other_errors.push(format!(
                    "{}={v:?} is neither true nor false; no oversubscription",
                    names::OVERSUBSCRIBE
                ));
                false
            }
        };
        let oversubscribe_reserve = match lookup(names::OVERSUBSCRIBE_RESERVE) {
            None => names::OVERSUBSCRIBE_RESERVE_DEFAULT,
            Some(v) => match vgpu_common::limit::parse_size(names::OVERSUBSCRIBE_RESERVE, v.trim())
            {
                Ok(b) => b,
                Err(e) => {
                    other_errors.push(format!(
                        "{e}; {} MiB of the device are left free",
                        names::OVERSUBSCRIBE_RESERVE_DEFAULT >> 20
                    ));
                    names::OVERSUBSCRIBE_RESERVE_DEFAULT
                }
            },
        };
        let mut errors = mem.errors;
        errors.extend(sm.errors);
        Self {
            region_path,
            per_container_region: per_container,
            priority_stated,
            mem_limit: mem.values,
            sm_limit: sm.values,
            priority,
            policy,
            nvidia_visible,
            oversubscribe,
            oversubscribe_reserve,
            errors,
            other_errors,
        }
    }

    /// Logs every problem found in the environment (once, at init).
    pub fn report(&self) {
        for e in &self.errors {
            vlog!(
                crate::log::ERROR,
                "{e}; that limit is refused (treated as unset)"
            );
        }
        for e in &self.other_errors {
            vlog!(crate::log::ERROR, "{e}");
        }
    }
}

static CONFIG: std::sync::OnceLock<Config> = std::sync::OnceLock::new();

/// The configuration, read from the environment once (errors reported then).
pub fn get() -> &'static Config {
    CONFIG.get_or_init(|| {
        let cfg = Config::from_env();
        cfg.report();
        crate::sidecar::set_region_path(&cfg.region_path);
        cfg
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KAI's resource isolator names no cache file: the region goes to the
    /// per-container directory under its mount, made on first use; one
    /// that cannot be made leaves HAMi's default, said once.
    #[test]
    fn the_per_container_region_directory_is_made_or_the_default_kept() {
        let d = tempfile::tempdir().unwrap();
        let mount = d.path().join("vgpu");
        std::fs::create_dir_all(mount.join("containers")).unwrap();
        let m = mount.display().to_string();
        let lookup = |k: &str| match k {
            "CONTAINER_VGPU_MOUNT" => Some(m.clone()),
            "POD_UID" => Some("uid-1".into()),
            "CONTAINER_NAME" => Some("main".into()),
            _ => None,
        };
        let mut cfg = Config::from_lookup(lookup);
        let want = mount.join("containers/uid-1_main/usage.cache");
        assert_eq!(cfg.region_path, want);
        cfg.make_region_dir();
        assert!(want.parent().unwrap().is_dir());
        assert_eq!(cfg.region_path, want, "{:?}", cfg.other_errors);
        cfg.make_region_dir();
        assert!(cfg.other_errors.is_empty(), "{:?}", cfg.other_errors);

        // Another pod's symlink where the directory goes: refused.
        std::fs::remove_dir_all(want.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(d.path(), want.parent().unwrap()).unwrap();
        let mut cfg = Config::from_lookup(lookup);
        cfg.make_region_dir();
        assert_eq!(cfg.region_path, PathBuf::from("/tmp/cudevshr.cache"));

        std::fs::remove_dir_all(mount.join("containers")).unwrap();
        let mut cfg = Config::from_lookup(lookup);
        cfg.make_region_dir();
        assert_eq!(cfg.region_path, PathBuf::from("/tmp/cudevshr.cache"));
        assert_eq!(cfg.other_errors.len(), 1, "{:?}", cfg.other_errors);
    }

    #[test]
    fn bad_limit_is_refused_and_reported() {
        let cfg = Config::from_lookup(|k| match k {
            "CUDA_DEVICE_MEMORY_LIMIT" => Some("1024mb".into()),
            "CUDA_DEVICE_MEMORY_LIMIT_1" => Some("2g".into()),
            _ => None,
        });
        assert_eq!(cfg.mem_limit[0], 0);
        assert_eq!(cfg.mem_limit[1], 2 << 30);
        assert_eq!(cfg.errors.len(), 1);
        assert_eq!(cfg.sm_limit[0], 100);
        assert_eq!(cfg.priority, 1);
        assert_eq!(cfg.region_path, PathBuf::from("/tmp/cudevshr.cache"));
    }

    #[test]
    fn oversubscription_is_off_unless_hami_says_true() {
        let with = |v: Option<&str>| {
            Config::from_lookup(|k| {
                (k == "CUDA_OVERSUBSCRIBE")
                    .then(|| v.map(str::to_owned))
                    .flatten()
            })
        };
        assert!(!with(None).oversubscribe);
        assert!(with(Some("true")).oversubscribe);
        assert!(with(Some("TRUE")).oversubscribe);
        assert!(with(Some("1")).oversubscribe);
        assert!(!with(Some("false")).oversubscribe);
        let bad = with(Some("yes please"));
        assert!(!bad.oversubscribe);
        assert_eq!(bad.other_errors.len(), 1);
    }

    #[test]
    fn a_stated_priority_is_noted() {
        let cfg = |prio: Option<&str>| {
            Config::from_lookup(|k| match k {
                "CUDA_TASK_PRIORITY" => prio.map(str::to_owned),
                _ => None,
            })
        };
        let c = cfg(Some("0"));
        assert!(c.priority_stated && c.priority == 0);
        // No priority stated: HAMi's default, 1.
        let c = cfg(None);
        assert!(!c.priority_stated && c.priority == 1);
    }
}
