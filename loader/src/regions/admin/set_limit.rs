//! `vgpu set-mem-limit` / `set-sm-limit`: writes `limit[]` or `sm_limit[]`
//! of some devices.

use std::mem::offset_of;
use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::region::{rules, SharedRegion, MAX_DEVICES};
use vgpu_common::region_io::RegionIo;

use super::AdminError;

/// Which per-device limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// `limit[]`, bytes.
    Memory,
    /// `sm_limit[]`, percent.
    Sm,
}

/// Which devices an operation applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Devices {
    One(usize),
    /// Every device of the region (`device_num`, or all 16 before any
    /// process recorded it).
    All,
}

/// One limit written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LimitChange {
    pub device: usize,
    pub old: u64,
    pub new: u64,
    /// Container-wide usage of the device now (bytes).
    pub used_bytes: u64,
}

fn device_count(r: &SharedRegion) -> u64 {
    r.device_num.load(SeqCst)
}

/// The devices `which` names in the region, or a range error (device must
/// be below 16 and below `device_num` when that is set).
pub fn resolve_devices(
    file: &RegionIo,
    r: &SharedRegion,
    which: Devices,
) -> Result<Vec<usize>, AdminError> {
    let n = device_count(r);
    let usable = if n == 0 {
        MAX_DEVICES
    } else {
        (n as usize).min(MAX_DEVICES)
    };
    match which {
        Devices::All => Ok((0..usable).collect()),
        Devices::One(d) if d < usable => Ok(vec![d]),
        Devices::One(device) => Err(AdminError::DeviceRange {
            path: file.path().to_owned(),
            device,
            count: usable as u64,
        }),
    }
}

/// Writes `value` into `limit[]` or `sm_limit[]` of the devices. Running
/// processes read these on their allocation / launch paths.
pub fn set_limit(
    file: &RegionIo,
    kind: LimitKind,
    which: Devices,
    value: u64,
) -> Result<Vec<LimitChange>, AdminError> {
    let r = file.snapshot()?;
    let devices = resolve_devices(file, &r, which)?;
    let (cells, base) = match kind {
        LimitKind::Memory => (&r.limit, offset_of!(SharedRegion, limit)),
        LimitKind::Sm => (&r.sm_limit, offset_of!(SharedRegion, sm_limit)),
    };
    let mut out = Vec::new();
    for d in devices {
        file.write_u64((base + d * 8) as u64, value)?;
        out.push(LimitChange {
            device: d,
            old: cells[d].load(SeqCst),
            new: value,
            used_bytes: rules::used_by_slots(r.active_slots(), d),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regions::admin::testutil::{fixture, me};
    use std::sync::atomic::Ordering::Relaxed;

    const G: u64 = 1 << 30;

    #[test]
    fn limits_are_written_per_device_with_the_old_value_and_the_usage() {
        let fx = fixture();
        let r = fx.r();
        r.device_num.store(2, Relaxed);
        r.limit[0].store(4 * G, Relaxed);
        fx.slot(0, me().1, 0, G);
        let got = set_limit(&fx.io, LimitKind::Memory, Devices::All, 8 * G).unwrap();
        assert_eq!(
            got,
            vec![
                LimitChange {
                    device: 0,
                    old: 4 * G,
                    new: 8 * G,
                    used_bytes: G
                },
                LimitChange {
                    device: 1,
                    old: 0,
                    new: 8 * G,
                    used_bytes: 0
                },
            ]
        );
        assert_eq!(
            (r.limit[0].load(Relaxed), r.limit[1].load(Relaxed)),
            (8 * G, 8 * G)
        );
        assert_eq!(r.limit[2].load(Relaxed), 0, "past device_num");
        assert!(r.sm_limit.iter().all(|c| c.load(Relaxed) == 0));

        let got = set_limit(&fx.io, LimitKind::Sm, Devices::One(1), 30).unwrap();
        assert_eq!((got.len(), got[0].device, got[0].old), (1, 1, 0));
        assert_eq!(
            (r.sm_limit[0].load(Relaxed), r.sm_limit[1].load(Relaxed)),
            (0, 30)
        );
    }

    #[test]
    fn a_device_out_of_range_is_refused_and_nothing_written() {
        let fx = fixture();
        let r = fx.r();
        r.device_num.store(2, Relaxed);
        let e = set_limit(&fx.io, LimitKind::Memory, Devices::One(2), G).unwrap_err();
        assert!(
            matches!(
                e,
                AdminError::DeviceRange {
                    device: 2,
                    count: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert!(r.limit.iter().all(|c| c.load(Relaxed) == 0));
        // Before any process recorded device_num, every one of the 16 is
        // usable, and no more.
        r.device_num.store(0, Relaxed);
        assert_eq!(
            resolve_devices(&fx.io, r, Devices::All).unwrap(),
            (0..MAX_DEVICES).collect::<Vec<_>>()
        );
        assert!(set_limit(&fx.io, LimitKind::Sm, Devices::One(MAX_DEVICES), 50).is_err());
        assert!(r.sm_limit.iter().all(|c| c.load(Relaxed) == 0));
    }
}
