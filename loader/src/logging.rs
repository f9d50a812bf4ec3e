//! stderr logging: tracing's text (coloured only when stderr is a
//! terminal, so `kubectl logs` and files get no escape codes) or JSON, one
//! object per line. [`notice`] writes the daemon's start and stop lines in
//! the same format whatever the level filter.

use std::io::{IsTerminal as _, Write as _};
use std::sync::OnceLock;

/// How log lines are written to stderr.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Installs the subscriber; `level` applies unless `VGPU_LOG` is set.
pub fn init(format: LogFormat, level: &str) {
    let _ = FORMAT.set(format);
    let filter = tracing_subscriber::EnvFilter::try_from_env("VGPU_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // try_init also bridges `log` records (aya) into tracing.
    let _ = match format {
        LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).try_init(),
        LogFormat::Json => fmt.json().with_ansi(false).try_init(),
    };
}

/// An error and its causes as one sentence, joined by `: ` as `{:#}` does,
/// leaving out a cause the sentence already says: most of our errors put
/// their source in their own message and still expose it as `source()`, so
/// the chain stays whole for code without being printed twice.
pub fn sentence(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if out.is_empty() {
            out = part;
        } else if !out.contains(&part) {
            out.push_str(": ");
            out.push_str(&part);
        }
    }
    out
}

/// A line that is always shown: plain text, or a JSON object like
/// tracing's (`level` INFO, `fields.message`).
pub fn notice(message: &str) {
    let line = match FORMAT.get() {
        Some(LogFormat::Json) => serde_json::json!({
            "timestamp": timestamp(),
            "level": "INFO",
            "fields": { "message": message },
            "target": "vgpu",
        })
        .to_string(),
        _ => message.to_owned(),
    };
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The timestamp tracing's own lines carry.
fn timestamp() -> String {
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
    let mut ts = String::new();
    let _ = SystemTime.format_time(&mut Writer::new(&mut ts));
    ts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {path}: {source}")]
    struct Inline {
        path: &'static str,
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot start")]
    struct Apart(#[source] std::io::Error);

    #[test]
    fn a_cause_is_said_once() {
        let io = || std::io::Error::other("disk on fire");
        let e = anyhow::Error::new(Inline {
            path: "/x",
            source: io(),
        })
        .context("vgpu cleanup");
        assert_eq!(e.chain().count(), 3, "the chain is kept");
        assert_eq!(sentence(&e), "vgpu cleanup: cannot read /x: disk on fire");
        let e = anyhow::Error::new(Apart(io()));
        assert_eq!(sentence(&e), "cannot start: disk on fire");
        assert_eq!(sentence(&anyhow::anyhow!("plain")), "plain");
    }
}
