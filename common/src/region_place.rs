//! Where a process's region file lies, from its environment: the rule
//! HAMi-core follows, which the hook creates the region by and the daemon
//! finds it by.

use crate::env::{
    CONTAINER_NAME, CONTAINER_VGPU_MOUNT, PER_CONTAINER_CACHE, POD_UID, SHARED_CACHE,
    SHARED_CACHE_DEFAULT,
};
/// Where a process's region lies, and what named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionPlace {
    /// [`SHARED_CACHE`], as HAMi's and Volcano's device plugins set it.
    Named(std::path::PathBuf),
    /// [`CONTAINER_VGPU_MOUNT`], [`POD_UID`] and [`CONTAINER_NAME`] (KAI's
    /// resource isolator): the file, whose directory the hook makes.
    PerContainer(std::path::PathBuf),
    /// Neither: HAMi's default, inside the container.
    Default,
}

impl RegionPlace {
    /// The file's path.
    pub fn path(&self) -> std::path::PathBuf {
        match self {
            RegionPlace::Named(p) | RegionPlace::PerContainer(p) => p.clone(),
            RegionPlace::Default => SHARED_CACHE_DEFAULT.into(),
        }
    }
}

/// The region an environment names: a non-empty [`SHARED_CACHE`] first,
/// then the per-container layout when all three of its variables are set
/// and usable, else the default. `Err` says why the three were set but
/// not used (a pod UID or container name that is not one path component,
/// a mount that is not absolute); the region is then the default.
pub fn region_place(lookup: impl Fn(&str) -> Option<String>) -> (RegionPlace, Option<String>) {
    if let Some(p) = lookup(SHARED_CACHE).filter(|p| !p.is_empty()) {
        return (RegionPlace::Named(p.into()), None);
    }
    let (Some(mount), Some(uid), Some(ctr)) = (
        lookup(CONTAINER_VGPU_MOUNT).filter(|v| !v.is_empty()),
        lookup(POD_UID).filter(|v| !v.is_empty()),
        lookup(CONTAINER_NAME).filter(|v| !v.is_empty()),
    ) else {
        return (RegionPlace::Default, None);
    };
    // One component each: the directory must stay under `<mount>/containers`.
    let component = |v: &str| v != "." && v != ".." && !v.contains(['/', '\0']);
    let why = if !mount.starts_with('/') {
        Some(format!(
            "{CONTAINER_VGPU_MOUNT}={mount:?} is not an absolute path"
        ))
    } else if !component(&uid) {
        Some(format!("{POD_UID}={uid:?} is not a single path component"))
    } else if !component(&ctr) {
        Some(format!(
            "{CONTAINER_NAME}={ctr:?} is not a single path component"
        ))
    } else {
        None
    };
    if let Some(why) = why {
        return (
            RegionPlace::Default,
            Some(format!("{why}; the region is {SHARED_CACHE_DEFAULT}")),
        );
    }
    let path = std::path::Path::new(&mount)
        .join("containers")
        .join(format!("{uid}_{ctr}"))
        .join(PER_CONTAINER_CACHE);
    (RegionPlace::PerContainer(path), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_named_cache_wins_then_the_per_container_layout_then_the_default() {
        let kai = [
            (CONTAINER_VGPU_MOUNT, "/usr/local/vgpu"),
            (POD_UID, "0b6c2f3e-1111"),
            (CONTAINER_NAME, "main"),
        ];
        assert_eq!(
            region_place(env(&kai)),
            (
                RegionPlace::PerContainer(
                    "/usr/local/vgpu/containers/0b6c2f3e-1111_main/usage.cache".into()
                ),
                None
            )
        );
        let mut named = kai.to_vec();
        named.push((SHARED_CACHE, "/tmp/vgpu/a.cache"));
        assert_eq!(
            region_place(env(&named)).0,
            RegionPlace::Named("/tmp/vgpu/a.cache".into())
        );
        assert_eq!(region_place(env(&kai[..2])), (RegionPlace::Default, None));
        assert_eq!(
            RegionPlace::Default.path(),
            std::path::PathBuf::from(SHARED_CACHE_DEFAULT)
        );
    }

    #[test]
    fn a_name_that_would_leave_the_containers_directory_is_refused() {
        for (name, bad) in [
            (CONTAINER_NAME, ".."),
            (CONTAINER_NAME, "a/../../etc"),
            (POD_UID, "../x"),
            (CONTAINER_VGPU_MOUNT, "relative"),
        ] {
            let mut e = vec![
                (CONTAINER_VGPU_MOUNT, "/usr/local/vgpu"),
                (POD_UID, "u"),
                (CONTAINER_NAME, "c"),
            ];
            e.retain(|(n, _)| *n != name);
            e.push((name, bad));
            let (file, why) = region_place(env(&e));
            assert_eq!(file, RegionPlace::Default, "{name}={bad}");
            assert!(why.is_some_and(|w| w.contains(name)), "{name}={bad}");
        }
    }
}
