//! `vgpu set-sm-limit` and `vgpu set-mem-limit`: change a region's limits
//! at runtime.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use vgpu_common::limit::{parse_percent, parse_size};

use vgpu_common::region_io::RegionIo;

use crate::daemon::judge::integrity::overrides::{self, Changed};
use crate::regions::admin::{resolve_devices, set_limit, Devices, LimitKind};
use crate::regions::open::{open_region, Access};
use crate::regions::summary::bytes;

/// Which devices (exactly one of --device / --all).
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
pub struct Which {
    /// Only this device: its CUDA index inside the container (0..16, and
    /// below the region's device_num once a process recorded it).
    #[arg(long, value_name = "N")]
    device: Option<usize>,

    /// Every device of the region.
    #[arg(long)]
    all: bool,
}

impl Which {
    fn devices(&self) -> Devices {
        match self.device {
            Some(d) => Devices::One(d),
            None => Devices::All,
        }
    }
}

/// Set the SM (compute) limit of a region's devices, in percent, at runtime.
///
/// Writes sm_limit[] of the region; running hooked processes read it on
/// their launch path. `none` (or 100) removes the limit. Refuses, writing
/// nothing, if PATH is not a v1 region, the device is out of range, or
/// PERCENT is not a whole number from 1 to 100 or `none` (0, HAMi's "no
/// limit", is refused so that a typo never lifts a limit).
///
/// The change is first recorded under --state-dir, so `vgpu daemon` takes
/// it as the container's limit instead of reporting (or undoing) it as
/// tampering.
#[derive(clap::Args, Debug)]
pub struct SmArgs {
    /// The region file.
    path: PathBuf,
    #[command(flatten)]
    which: Which,
    /// New share of the GPU in percent, 1 to 100, or `none` for no limit.
    percent: String,
    /// The daemon's --state-dir, where admin changes are recorded.
    #[arg(long, value_name = "DIR", default_value = "/run/vgpu")]
    state_dir: PathBuf,
}

/// Set the device-memory limit of a region's devices at runtime.
///
/// Writes limit[] of the region; running hooked processes check every
/// allocation against it, so a lower limit refuses further allocations
/// with CUDA_ERROR_OUT_OF_MEMORY (memory already allocated is not taken
/// back). SIZE is bytes or digits with k, m or g (1g, 1024m), or `none` to
/// remove the limit. Refuses, writing nothing, if PATH is not a v1 region,
/// the device is out of range, or SIZE does not parse or is 0 (HAMi's "no
/// limit": removing one takes the explicit word).
///
/// The change is first recorded under --state-dir, so `vgpu daemon` takes
/// it as the container's limit instead of reporting (or undoing) it as
/// tampering.
#[derive(clap::Args, Debug)]
pub struct MemArgs {
    /// The region file.
    path: PathBuf,
    #[command(flatten)]
    which: Which,
    /// New limit (1g, 1024m, 1048576k or bytes), or `none` for no limit.
    size: String,
    /// The daemon's --state-dir, where admin changes are recorded.
    #[arg(long, value_name = "DIR", default_value = "/run/vgpu")]
    state_dir: PathBuf,
}

/// The word that removes a limit. A zero, which the region stores for "no
/// limit", is refused on the command line: `... --all 0` reads like "allow
/// nothing" and would silently allow everything.
const NO_LIMIT: &str = "none";

/// A limit argument that would lift the limit without saying so.
#[derive(Debug, thiserror::Error)]
#[error(
    "{var}=\"{value}\" would remove the limit, not set it to zero; to remove it, say `{NO_LIMIT}`"
)]
pub struct ZeroLimit {
    var: &'static str,
    value: String,
}

/// PERCENT: 1..=100, or `none` (stored as 100, the hook's "unlimited").
fn percent_arg(value: &str) -> anyhow::Result<u64> {
    if value.eq_ignore_ascii_case(NO_LIMIT) {
        return Ok(100);
    }
    if value.parse::<u64>() == Ok(0) {
        return Err(ZeroLimit {
            var: "PERCENT",
            value: value.to_owned(),
        }
        .into());
    }
    Ok(parse_percent("PERCENT", value)?)
}

/// SIZE: a size above 0 (`0m` is 0 too), or `none` (stored as 0).
fn size_arg(value: &str) -> anyhow::Result<u64> {
    if value.eq_ignore_ascii_case(NO_LIMIT) {
        return Ok(0);
    }
    match parse_size("SIZE", value)? {
        0 => Err(ZeroLimit {
            var: "SIZE",
            value: value.to_owned(),
        }
        .into()),
        n => Ok(n),
    }
}

fn open(path: &Path) -> anyhow::Result<RegionIo> {
    Ok(open_region(path, Access::ReadWrite)?)
}

/// Records the change for the daemon before the region is written (the
/// daemon reads the region, then the record: it never sees the new value
/// without the record).
fn record(
    state_dir: &Path,
    file: &RegionIo,
    changed: Changed,
    which: Devices,
    value: u64,
) -> anyhow::Result<()> {
    let snap = file.snapshot()?;
    let devices = resolve_devices(file, &snap, which)?;
    overrides::record(state_dir, file.path(), file.key(), changed, &devices, value)?;
    Ok(())
}

/// Runs `vgpu set-sm-limit`.
pub fn run_sm(args: SmArgs) -> anyhow::Result<ExitCode> {
    let value = percent_arg(&args.percent)?;
    let file = open(&args.path)?;
    record(
        &args.state_dir,
        &file,
        Changed::Sm,
        args.which.devices(),
        value,
    )?;
    let changes = set_limit(&file, LimitKind::Sm, args.which.devices(), value)?;
    let show = |v: u64| {
        if vgpu_common::region::rules::sm_limit(v).is_none() {
            "none".to_owned()
        } else {
            format!("{v}%")
        }
    };
    for c in changes {
        println!(
            "device {}: SM limit {} -> {}",
            c.device,
            show(c.old),
            show(c.new)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `vgpu set-mem-limit`.
pub fn run_mem(args: MemArgs) -> anyhow::Result<ExitCode> {
    let value = size_arg(&args.size)?;
    let file = open(&args.path)?;
    record(
        &args.state_dir,
        &file,
        Changed::Memory,
        args.which.devices(),
        value,
    )?;
    let changes = set_limit(&file, LimitKind::Memory, args.which.devices(), value)?;
    let show = |v: u64| if v == 0 { "none".to_owned() } else { bytes(v) };
    for c in changes {
        print!(
            "device {}: memory limit {} -> {}",
            c.device,
            show(c.old),
            show(c.new)
        );
        if c.new != 0 && c.used_bytes > c.new {
            print!(
                " (the container already uses {}: allocations fail until usage drops below)",
                bytes(c.used_bytes)
            );
        }
        println!();
    }
    Ok(ExitCode::SUCCESS)
}
