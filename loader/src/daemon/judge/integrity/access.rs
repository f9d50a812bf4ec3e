//! [`RegionAccess`] over the daemon's open regions.

use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::region::MAX_DEVICES;

use super::expected::Limits;
use super::overrides::FileKey;
use super::{enforce, RegionAccess};
use crate::daemon::collect::region_cache::RegionCache;
use crate::daemon::state::findings::LimitMismatch;
use vgpu_common::region::rules::sm_limit_shown;

impl RegionAccess for RegionCache {
    fn limits(&self, key: &FileKey) -> Option<Limits> {
        let r = self.get(key)?.last_snapshot()?;
        if !r.is_initialized() {
            return None;
        }
        let mut l = Limits {
            mem: [0; MAX_DEVICES],
            sm: [0; MAX_DEVICES],
        };
        for d in 0..MAX_DEVICES {
            l.mem[d] = r.limit[d].load(SeqCst);
            l.sm[d] = sm_limit_shown(r.sm_limit[d].load(SeqCst));
        }
        Some(l)
    }

    fn shown(&self, key: &FileKey) -> Option<PathBuf> {
        self.get(key).map(|r| r.shown_path.clone())
    }

    fn restore(&self, key: &FileKey, m: &[LimitMismatch]) -> usize {
        self.get(key).map_or(0, |r| enforce::restore(&r.file, m))
    }
}
