//! The kernel-duration model.
//!
//! In order of precedence, a kernel lasts:
//! 1. exactly `N` µs / ns when its function is named `busy_<N>us` /
//!    `busy_<N>ns` (see [`duration_from_name`]);
//! 2. the per-process override set by `simgpu_set_kernel_ns(n)` (n > 0);
//! 3. `SIMGPU_KERNEL_NS` when set;
//! 4. `waves * SIMGPU_WAVE_NS` from the launch geometry ([`waves`]).

/// Resident blocks per SM for a block size (at most 2048 threads per SM).
pub fn blocks_per_sm(threads_per_block: u64) -> u64 {
    (2048 / threads_per_block.max(1)).max(1)
}

/// Waves needed for `blocks` blocks of `threads_per_block` on `sms` SMs:
/// `ceil(blocks / (sms * max(1, 2048 / threads_per_block)))`, at least 1.
pub fn waves(blocks: u64, threads_per_block: u64, sms: u32) -> u64 {
    let per_wave = u64::from(sms.max(1)).saturating_mul(blocks_per_sm(threads_per_block));
    blocks.max(1).div_ceil(per_wave).max(1)
}

/// Kernel duration from the launch geometry.
pub fn geometry_ns(grid: [u32; 3], block: [u32; 3], sms: u32, wave_ns: u64) -> u64 {
    let blocks = grid.iter().map(|&g| u64::from(g.max(1))).product::<u64>();
    let threads = block.iter().map(|&b| u64::from(b.max(1))).product::<u64>();
    waves(blocks, threads, sms).saturating_mul(wave_ns)
}

/// `busy_<N>us` → N µs, `busy_<N>ns` → N ns, `busy_<N>ms` → N ms; anything
/// else → None.
pub fn duration_from_name(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("busy_")?;
    let (digits, mult) = if let Some(d) = rest.strip_suffix("us") {
        (d, 1_000)
    } else if let Some(d) = rest.strip_suffix("ns") {
        (d, 1)
    } else if let Some(d) = rest.strip_suffix("ms") {
        (d, 1_000_000)
    } else {
        return None;
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

/// Picks a kernel's duration by the precedence above.
pub fn kernel_ns(
    name_ns: Option<u64>,
    process_override: u64,
    env_ns: Option<u64>,
    geometry: impl FnOnce() -> u64,
) -> u64 {
    name_ns
        .or((process_override > 0).then_some(process_override))
        .or(env_ns)
        .unwrap_or_else(geometry)
}

/// Name every simulated device reports (CUDA and NVML).
pub const DEVICE_NAME: &str = "NVIDIA SimGPU";

/// The 16 UUID bytes of device `dev` (stable per index; CUDA's `CUuuid`).
pub fn device_uuid(dev: u32) -> [u8; 16] {
    let mut b = [
        0x51, 0x6d, 0x67, 0x70, 0x75, 0x00, 0x40, 0x00, 0x80, 0x00, 0, 0, 0, 0, 0, 0,
    ];
    b[12..16].copy_from_slice(&dev.to_be_bytes());
    b
}

/// NVML's UUID string of device `dev`: `GPU-` and the bytes of
/// [`device_uuid`] as 8-4-4-4-12 hex.
pub fn device_uuid_string(dev: u32) -> String {
    let b = device_uuid(dev);
    let hex =
        |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// PCI bus id of device `dev`: `00000000:XX:00.0` (NVML form; CUDA prints
/// the 4-digit domain form).
pub fn pci_bus_id(dev: u32) -> String {
    format!("0000:{:02x}:00.0", 0x18 + dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid() {
        assert_eq!(
            device_uuid_string(0),
            "GPU-516d6770-7500-4000-8000-000000000000"
        );
        assert_eq!(
            device_uuid_string(3),
            "GPU-516d6770-7500-4000-8000-000000000003"
        );
    }

    #[test]
    fn names() {
        assert_eq!(duration_from_name("busy_100us"), Some(100_000));
        assert_eq!(duration_from_name("busy_7ns"), Some(7));
        assert_eq!(duration_from_name("busy_2ms"), Some(2_000_000));
        assert_eq!(duration_from_name("busy_us"), None);
        assert_eq!(duration_from_name("busy_1xus"), None);
        assert_eq!(duration_from_name("matmul"), None);
    }

    #[test]
    fn geometry() {
        // 132 SMs, 256 threads/block -> 8 blocks/SM -> 1056 blocks per wave.
        assert_eq!(waves(1056, 256, 132), 1);
        assert_eq!(waves(1057, 256, 132), 2);
        assert_eq!(waves(1, 1024, 132), 1);
        assert_eq!(waves(0, 0, 132), 1);
        assert_eq!(geometry_ns([2112, 1, 1], [256, 1, 1], 132, 5000), 10_000);
        assert_eq!(kernel_ns(None, 0, None, || 42), 42);
        assert_eq!(kernel_ns(None, 0, Some(7), || 42), 7);
        assert_eq!(kernel_ns(None, 9, Some(7), || 42), 9);
        assert_eq!(kernel_ns(Some(1), 9, Some(7), || 42), 1);
    }
}
