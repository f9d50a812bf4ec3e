//! The `SIMGPU_*` environment variables (all documented in `docs/simgpu.md`).
//!
//! Two kinds: the *device* configuration ([`DeviceConfig`]) is fixed by
//! whoever starts the server and stored in the shared state file, so every
//! process sees the same devices; the *process* settings ([`ProcessConfig`])
//! are read by each client from its own environment.

use std::path::PathBuf;

use crate::SimError;

/// Most devices the state file has room for.
pub const MAX_DEVICES: u32 = 16;

/// Device configuration, fixed by the server at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// `SIMGPU_DEVICES` (default 1, at most 16).
    pub devices: u32,
    /// `SIMGPU_MEMORY`: bytes of device memory per device (default `80g`).
    pub memory: u64,
    /// `SIMGPU_SMS`: streaming multiprocessors per device (default 132).
    pub sms: u32,
    /// `SIMGPU_CONTEXT_BYTES`: device memory a context costs (default `500m`).
    pub context_bytes: u64,
    /// `SIMGPU_WAVE_NS`: duration of one wave of blocks (default 5000 ns).
    pub wave_ns: u64,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            devices: 1,
            memory: 80 << 30,
            sms: 132,
            context_bytes: 500 << 20,
            wave_ns: 5_000,
        }
    }
}

impl DeviceConfig {
    /// Reads the device configuration from the environment.
    pub fn from_env() -> Result<Self, SimError> {
        DeviceConfig::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads the device configuration through `get` (variable → value).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, SimError> {
        let env_u64 = |var: &'static str, default: u64, parse: fn(&str) -> Result<u64, String>| {
            var_u64(get(var), var, default, parse)
        };
        let d = DeviceConfig::default();
        let devices = env_u64("SIMGPU_DEVICES", u64::from(d.devices), parse_u64)?;
        if devices == 0 || devices > u64::from(MAX_DEVICES) {
            return Err(SimError::Config {
                var: "SIMGPU_DEVICES",
                value: devices.to_string(),
                reason: format!("must be 1..={MAX_DEVICES}"),
            });
        }
        let sms = env_u64("SIMGPU_SMS", u64::from(d.sms), parse_u64)?;
        if sms == 0 || sms > 100_000 {
            return Err(SimError::Config {
                var: "SIMGPU_SMS",
                value: sms.to_string(),
                reason: "must be 1..=100000".into(),
            });
        }
        Ok(DeviceConfig {
            devices: devices as u32,
            memory: env_u64("SIMGPU_MEMORY", d.memory, parse_size)?,
            sms: sms as u32,
            context_bytes: env_u64("SIMGPU_CONTEXT_BYTES", d.context_bytes, parse_size)?,
            wave_ns: env_u64("SIMGPU_WAVE_NS", d.wave_ns, parse_u64)?,
        })
    }
}

/// Settings each process reads from its own environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessConfig {
    /// `SIMGPU_DIR` (default `/tmp/simgpu`): state file, socket, logs.
    pub dir: PathBuf,
    /// `SIMGPU_SERVER`: the server binary (default: `simgpu-server` next to
    /// the loaded library).
    pub server: Option<PathBuf>,
    /// `SIMGPU_KERNEL_NS`: when set, every kernel lasts exactly this long
    /// (unless its name says otherwise, see `model`).
    pub kernel_ns: Option<u64>,
    /// `SIMGPU_QUEUE_MS` (default 50): how far ahead of now a stream may be
    /// queued before a launch blocks.
    pub queue_ms: u64,
    /// `SIMGPU_SAMPLE_MS` (default 200): NVML utilization window.
    pub sample_ms: u64,
    /// `SIMGPU_PROCESS_UTIL` (default 1): 0 makes per-process utilization
    /// `NOT_SUPPORTED`, as some GPUs and vGPU profiles answer.
    pub process_util: bool,
    /// `SIMGPU_IDLE_EXIT_MS` (default 30000): the server exits after this long
    /// without clients.
    pub idle_exit_ms: u64,
    /// `SIMGPU_LOG` (default 0): 1 prints simulator diagnostics on stderr.
    pub log: bool,
}

impl ProcessConfig {
    /// Reads the process settings; malformed values are reported on stderr
    /// and replaced by their defaults (a library must not fail the caller).
    pub fn from_env() -> Self {
        let num = |var: &'static str, default: u64| match env_u64(var, default, parse_u64) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("simgpu: {e}; using {default}");
                default
            }
        };
        let kernel_ns = match std::env::var("SIMGPU_KERNEL_NS") {
            Ok(v) if !v.trim().is_empty() => match parse_u64(&v) {
                Ok(n) => Some(n),
                Err(reason) => {
                    eprintln!("simgpu: SIMGPU_KERNEL_NS={v:?}: {reason}; ignored");
                    None
                }
            },
            _ => None,
        };
        ProcessConfig {
            dir: std::env::var_os("SIMGPU_DIR")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/tmp/simgpu")),
            server: std::env::var_os("SIMGPU_SERVER")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            kernel_ns,
            queue_ms: num("SIMGPU_QUEUE_MS", 50),
            sample_ms: num("SIMGPU_SAMPLE_MS", 200).max(1),
            process_util: num("SIMGPU_PROCESS_UTIL", 1) != 0,
            idle_exit_ms: num("SIMGPU_IDLE_EXIT_MS", 30_000),
            log: num("SIMGPU_LOG", 0) != 0,
        }
    }
}

fn env_u64(
    var: &'static str,
    default: u64,
    parse: fn(&str) -> Result<u64, String>,
) -> Result<u64, SimError> {
    var_u64(std::env::var(var).ok(), var, default, parse)
}

fn var_u64(
    value: Option<String>,
    var: &'static str,
    default: u64,
    parse: fn(&str) -> Result<u64, String>,
) -> Result<u64, SimError> {
    match value {
        Some(v) if !v.trim().is_empty() => parse(v.trim()).map_err(|reason| SimError::Config {
            var,
            value: v,
            reason,
        }),
        _ => Ok(default),
    }
}

/// Parses a plain decimal number.
pub fn parse_u64(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| "not a non-negative integer".to_string())
}

/// Parses a size: decimal bytes with an optional `k`, `m`, `g` or `t` suffix
/// (binary multiples, case-insensitive): `80g`, `500m`, `1048576`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_lowercase() {
                'k' => 10,
                'm' => 20,
                'g' => 30,
                't' => 40,
                _ => return Err(format!("unknown size suffix {c:?} (use k, m, g or t)")),
            };
            (&s[..i], shift)
        }
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| "not a size such as 80g, 500m or 1048576".to_string())?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| "size overflows 64 bits".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("80g"), Ok(80 << 30));
        assert_eq!(parse_size("500M"), Ok(500 << 20));
        assert_eq!(parse_size("1024k"), Ok(1 << 20));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("1gb").is_err());
        assert!(parse_size("g").is_err());
        assert!(parse_size("99999999999t").is_err());
    }

    #[test]
    fn device_config_from_vars() {
        let c = DeviceConfig::from_vars(|k| (k == "SIMGPU_MEMORY").then(|| "1g".to_string()));
        assert_eq!(c.map(|c| c.memory).ok(), Some(1 << 30));
        assert!(DeviceConfig::from_vars(|k| (k == "SIMGPU_DEVICES").then(|| "17".into())).is_err());
        assert!(DeviceConfig::from_vars(|k| (k == "SIMGPU_MEMORY").then(|| "1gb".into())).is_err());
    }
}
