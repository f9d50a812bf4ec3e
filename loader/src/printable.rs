//! Text a tenant chose (a process name, a path it names, bytes of its
//! region) shown to an operator: in the text log, `vgpu inspect` and `vgpu
//! top`. Raw, a newline in it starts a line of its own (a forged log line)
//! and an escape sequence drives the admin's terminal (`ESC ]0;` retitles
//! the window, `ESC [2J` clears it). [`escape_controls`] is the one place
//! that makes such text inert; JSON output needs nothing more, as its
//! serializer already escapes every control character.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a log line or a terminal as is: C0 and C1
/// control characters (newline, carriage return, tab and escape included),
/// DEL, the Unicode line and paragraph separators (a line break to some
/// readers), and the bidirectional controls that reorder what is shown.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `s` with every unsafe character written as an escape: `\n`, `\r`, `\t`,
/// `\x1b` (below U+0080), `\u{9b}` (above); the rest, backslashes included,
/// unchanged, so ordinary paths and messages read as before. Borrowed when
/// there is nothing to escape.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_unsafe(c) && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_the_rest_is_kept() {
        assert!(matches!(
            escape_controls("/usr/local/vgpu/a b\\c ünï.cache"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            escape_controls("x\nFORGED line\r\t"),
            "x\\nFORGED line\\r\\t"
        );
        assert_eq!(
            escape_controls("GPU-\x1b]0;pwned\x07\x1b[2J\x7f"),
            "GPU-\\x1b]0;pwned\\x07\\x1b[2J\\x7f"
        );
        assert_eq!(
            escape_controls("\u{9b}2J \u{2028}\u{202e}txt.exe"),
            "\\u{9b}2J \\u{2028}\\u{202e}txt.exe"
        );
        for s in ["a\u{85}b", "\0", "\u{2066}x\u{2069}"] {
            let e = escape_controls(s);
            assert!(!e.chars().any(is_unsafe), "{e:?}");
        }
    }
}
