//! Private logging to stderr (never a global logger): one line per message,
//! prefixed `[vgpu pid=<pid>]`. The level comes from `LIBCUDA_LOG_LEVEL`
//! (0/1 errors, 2 warnings (default), 3 info, 4 debug), read once.

use std::sync::atomic::{AtomicU8, Ordering};

pub const ERROR: u8 = 1;
pub const WARN: u8 = 2;
pub const INFO: u8 = 3;
pub const DEBUG: u8 = 4;

/// 0xff = not read yet.
static LEVEL: AtomicU8 = AtomicU8::new(0xff);

/// The configured level, read from the environment on first use.
pub fn level() -> u8 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != 0xff {
        return l;
    }
    let parsed = std::env::var(vgpu_common::env::LOG_LEVEL)
        .ok()
        .and_then(|v| v.trim().parse::<u8>().ok())
        .unwrap_or(WARN)
        .min(DEBUG);
    LEVEL.store(parsed, Ordering::Relaxed);
    parsed
}

pub fn enabled(lvl: u8) -> bool {
    lvl <= level().max(ERROR)
}

/// Writes one line; never panics, never allocates a logger.
pub fn emit(lvl: u8, args: std::fmt::Arguments<'_>) {
    let tag = match lvl {
        ERROR => "ERROR",
        WARN => "WARN",
        INFO => "INFO",
        _ => "DEBUG",
    };
    let line = format!("[vgpu pid={}] {tag}: {args}\n", std::process::id());
    // SAFETY: writes a valid, initialised buffer of `line.len()` bytes to fd
    // 2; a short or failed write only loses the log line.
    let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// `vlog!(ERROR, "…", args)`.
macro_rules! vlog {
    ($lvl:expr, $($arg:tt)*) => {
        if $crate::log::enabled($lvl) {
            $crate::log::emit($lvl, format_args!($($arg)*));
        }
    };
}

/// Logs at most once per call site.
macro_rules! vlog_once {
    ($lvl:expr, $($arg:tt)*) => {{
        static ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !ONCE.swap(true, std::sync::atomic::Ordering::Relaxed) {
            vlog!($lvl, $($arg)*);
        }
    }};
}
