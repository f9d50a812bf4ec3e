//! stderr logging: tracing's text (coloured only when stderr is a
//! terminal, so `kubectl logs` and files get no escape codes) or JSON, one
//! object per line. [`notice`] writes the daemon's start and stop lines in
//! the same format whatever the level filter.
//!
//! Messages quote what tenants chose (process names, the paths they name):
//! in text, every field goes through [`escape_controls`], so that one event
//! is one line and no escape sequence reaches a terminal; JSON's serializer
//! escapes control characters itself.

use std::io::{IsTerminal as _, Write as _};
use std::sync::OnceLock;

use tracing_subscriber::field::MakeExt as _;
use tracing_subscriber::fmt::format::Writer;

use crate::printable::escape_controls;

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
        LogFormat::Text => fmt
            .fmt_fields(text_fields())
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => fmt.json().with_ansi(false).try_init(),
    };
}

/// One field of a text line: the message as it is, others `name=value`,
/// each escaped. `log.*` fields (where a `log` record came from) are left
/// out, as tracing's default formatter does.
fn text_field(
    w: &mut Writer<'_>,
    field: &tracing::field::Field,
    value: &dyn std::fmt::Debug,
) -> std::fmt::Result {
    let name = field.name();
    if name.starts_with("log.") {
        return Ok(());
    }
    let text = format!("{value:?}");
    let text = escape_controls(&text);
    if name == "message" {
        write!(w, "{text}")
    } else {
        write!(w, "{}={text}", name.trim_start_matches("r#"))
    }
}

/// The text format's field formatter: [`text_field`], space-separated.
fn text_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    tracing_subscriber::fmt::format::debug_fn(text_field).delimited(" ")
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
    line("INFO", message);
}

/// The error a command ended with: plain text, or under `--log-format
/// json` a JSON object like tracing's, so a collector parses every line.
pub fn error(message: &str) {
    line("ERROR", message);
}

/// A JSON log line with tracing's keys in tracing's order (`timestamp`,
/// `level`, `fields`, `target`), so that every line of one stream has the
/// same shape whoever wrote it.
#[derive(serde::Serialize)]
struct JsonLine<'a> {
    timestamp: String,
    level: &'a str,
    fields: JsonFields<'a>,
    target: &'a str,
}

#[derive(serde::Serialize)]
struct JsonFields<'a> {
    message: &'a str,
}

fn json_line(level: &str, message: &str) -> String {
    let line = JsonLine {
        timestamp: timestamp(),
        level,
        fields: JsonFields { message },
        target: "vgpu",
    };
    // Serializing strings into a String cannot fail; the fallback keeps
    // the line whatever happens.
    serde_json::to_string(&line).unwrap_or_else(|_| {
        format!("{{\"level\":{level:?},\"fields\":{{\"message\":\"unprintable\"}}}}")
    })
}

fn line(level: &str, message: &str) {
    let line = match FORMAT.get() {
        Some(LogFormat::Json) => json_line(level, message),
        _ => escape_controls(message).into_owned(),
    };
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Reports a command line clap refused, and the status to exit with.
/// Help and `--version` go to stdout as clap prints them; an error is
/// clap's text, or one JSON line when the command line asked for
/// `--log-format json` (read from the raw arguments: they did not parse).
pub fn usage_error(e: &clap::Error) -> std::process::ExitCode {
    let code = std::process::ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
    if !e.use_stderr() || !json_requested(std::env::args_os().skip(1)) {
        let _ = e.print();
        return code;
    }
    let text = e.render().to_string();
    // The first paragraph says what is wrong; the rest is usage and the
    // hint to try --help, for a person at a terminal.
    let first = text.split("\n\n").next().unwrap_or(&text).trim_end();
    let message = first.strip_prefix("error: ").unwrap_or(first);
    let _ = writeln!(std::io::stderr().lock(), "{}", json_line("ERROR", message));
    code
}

/// Whether raw arguments ask for JSON logs (`--log-format json` or
/// `--log-format=json`; the last one wins, as clap would decide).
fn json_requested(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    let mut json = false;
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("--log-format") => json = args.next().is_some_and(|v| v == "json"),
            Some(s) if s.starts_with("--log-format=") => json = s == "--log-format=json",
            Some("--") => break,
            _ => {}
        }
    }
    json
}

/// Whether the error is stdout's reader going away (EPIPE): a listing cut
/// short by `head` is not a failure.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .is_some_and(|j| j.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe))
    })
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

    /// A `MakeWriter` into a shared buffer.
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buf {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// A message and a field holding a newline and an escape sequence make
    /// one line in text (escaped) and in JSON (escaped by serde).
    #[test]
    fn tenant_text_makes_one_line_in_both_formats() {
        let emit = || {
            let comm = "x\nFORGED \x1b[2J";
            tracing::warn!(path = %"/r\n.cache", "no region: pid 7 ({comm})");
        };
        let text = Buf::default();
        let w = text.clone();
        let sub = tracing_subscriber::fmt()
            .fmt_fields(text_fields())
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(sub, emit);
        let out = text.text();
        assert_eq!(out.lines().count(), 1, "{out:?}");
        assert!(
            out.contains(r"no region: pid 7 (x\nFORGED \x1b[2J) path=/r\n.cache"),
            "{out:?}"
        );
        let json = Buf::default();
        let w = json.clone();
        let sub = tracing_subscriber::fmt()
            .json()
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(sub, emit);
        let out = json.text();
        assert_eq!(out.lines().count(), 1, "{out:?}");
        assert!(!out.trim_end().contains(['\x1b', '\r']), "{out:?}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["fields"]["message"],
            "no region: pid 7 (x\nFORGED \x1b[2J)"
        );
    }

    #[test]
    fn own_json_lines_have_tracings_key_order() {
        let line = json_line("ERROR", "no \"region\"");
        let at = |k: &str| line.find(&format!("\"{k}\":")).unwrap();
        assert!(line.starts_with("{\"timestamp\":"), "{line}");
        assert!(at("timestamp") < at("level"), "{line}");
        assert!(at("level") < at("fields"), "{line}");
        assert!(at("fields") < at("target"), "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["fields"]["message"], "no \"region\"");
        assert_eq!(v["level"], "ERROR");
    }

    #[test]
    fn json_is_asked_for_either_way_and_the_last_word_wins() {
        let ask = |a: &[&str]| json_requested(a.iter().map(std::ffi::OsString::from));
        assert!(ask(&["--log-format", "json", "daemon", "--interval", "0"]));
        assert!(ask(&["daemon", "--log-format=json"]));
        assert!(!ask(&[
            "daemon",
            "--log-format=json",
            "--log-format",
            "text"
        ]));
        assert!(!ask(&["inspect", "--", "--log-format=json"]));
        assert!(!ask(&["daemon"]));
    }

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
