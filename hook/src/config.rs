//! The environment, read once into an immutable [`Config`] (no `getenv`
//! after init). Bad values are reported once, clearly, and the limit they
//! would have set is refused (no limit), never guessed.

use std::path::PathBuf;

use vgpu_common::env as names;
use vgpu_common::limit::{device_limits, parse_percent, parse_size, LimitError};
use vgpu_common::region::rules::SM_UNLIMITED;
use vgpu_common::region::{policy, MAX_DEVICES};

#[derive(Debug, Clone)]
pub struct Config {
    pub region_path: PathBuf,
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
        Self::from_lookup(|k| std::env::var(k).ok())
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
        let region_path = lookup(names::SHARED_CACHE)
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| names::SHARED_CACHE_DEFAULT.to_owned())
            .into();
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
