//! The two text formats `/metrics` serves and which one a client gets.
//!
//! [`crate::daemon::publish::metrics`] renders OpenMetrics once per region pass. The
//! Prometheus text format 0.0.4 differs from it only in its comment lines,
//! so it is not kept as a second copy of the text: [`classic_pieces`]
//! notes, in one linear pass at render time, which runs of sample lines
//! it shares with the OpenMetrics text and the rewritten comment lines
//! between them, and a scrape of the classic format streams those runs as
//! slices of the one buffer ([`Chunks`]). A client that asks for
//! OpenMetrics in its `Accept` header (Prometheus does, by default) gets
//! it; every other client (curl, older scrapers, HAMi's own tooling) gets
//! 0.0.4, as HAMi's monitor serves ([`negotiate`]).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame, SizeHint};

use crate::daemon::publish::legacy_metrics::UNSUFFIXED_COUNTERS;

/// `Content-Type` of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of the classic Prometheus text format.
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One render: the OpenMetrics text and how the classic text is made of it.
#[derive(Clone, Debug, Default)]
pub struct Exposition {
    pub openmetrics: Bytes,
    classic: Arc<[Piece]>,
}

/// A piece of the classic text: lines it shares with the OpenMetrics text
/// (a byte range of it), or comment lines of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Shared(Range<usize>),
    Own(Bytes),
}

impl Exposition {
    /// OpenMetrics text `om` and the pieces of its classic form.
    pub fn from_openmetrics(om: String) -> Self {
        Self {
            classic: classic_pieces(&om).into(),
            openmetrics: Bytes::from(om),
        }
    }

    /// The body and `Content-Type` of `format` (the server always appends
    /// [`Self::body_with`]'s tail).
    #[cfg(test)]
    pub fn body(&self, format: Format) -> (Chunks, &'static str) {
        (Chunks::new(self.parts(format, false)), content_type(format))
    }

    /// The body of `format` with `tail`'s families after this one's (the
    /// series rendered at each request, `crate::daemon::publish::self_metrics`): OpenMetrics
    /// keeps a single `# EOF`, `tail`'s.
    pub fn body_with(&self, format: Format, tail: &Exposition) -> (Chunks, &'static str) {
        let mut parts = self.parts(format, true);
        parts.extend(tail.parts(format, false));
        (Chunks::new(parts), content_type(format))
    }

    /// The buffers of `format`, each shared with the render; `open` leaves
    /// out OpenMetrics' closing `# EOF` so that more families can follow.
    fn parts(&self, format: Format, open: bool) -> VecDeque<Bytes> {
        match format {
            Format::OpenMetrics => {
                let om = &self.openmetrics;
                let end = if open && om.ends_with(EOF) {
                    om.len() - EOF.len()
                } else {
                    om.len()
                };
                VecDeque::from([om.slice(..end)])
            }
            Format::Classic => self
                .classic
                .iter()
                .map(|p| match p {
                    Piece::Shared(r) => self.openmetrics.slice(r.clone()),
                    Piece::Own(b) => b.clone(),
                })
                .collect(),
        }
    }
}

/// The line that ends OpenMetrics text.
const EOF: &[u8] = b"# EOF\n";

fn content_type(format: Format) -> &'static str {
    match format {
        Format::OpenMetrics => OPENMETRICS,
        Format::Classic => CLASSIC,
    }
}

/// A response body sent as a few buffers, each shared with what it was cut
/// from (nothing copied), with its exact length (`Content-Length`).
#[derive(Debug, Default)]
pub struct Chunks {
    parts: VecDeque<Bytes>,
    left: u64,
}

impl Chunks {
    pub fn new(parts: VecDeque<Bytes>) -> Self {
        let left = parts.iter().map(|b| b.len() as u64).sum();
        Self { parts, left }
    }

    /// The whole body as text (tests).
    #[cfg(test)]
    pub fn to_text(&self) -> String {
        self.parts
            .iter()
            .map(|b| String::from_utf8_lossy(b))
            .collect()
    }
}

impl From<Bytes> for Chunks {
    fn from(b: Bytes) -> Self {
        Self::new(VecDeque::from([b]))
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        while let Some(b) = this.parts.pop_front() {
            if !b.is_empty() {
                this.left -= b.len() as u64;
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// A text format of `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Classic,
}

/// The classic text format (0.0.4) of OpenMetrics text `om` as
/// `prometheus_client` writes it: no `# EOF` and no `# UNIT`; a counter
/// family is named after its samples (`x_total`), `unknown` is `untyped`
/// and `info` a gauge named `x_info`, as 0.0.4 parsers expect. Sample
/// lines are the same in both: they are ranges of `om`.
pub fn classic_pieces(om: &str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut own = String::new();
    let mut shared: Option<Range<usize>> = None;
    // `# HELP` comes before `# TYPE`, which decides the family's 0.0.4 name.
    let mut help: Option<(&str, &str)> = None;
    let flush = |out: &mut String, help: &mut Option<(&str, &str)>| {
        if let Some((name, text)) = help.take() {
            push_line(out, &["# HELP ", name, " ", text]);
        }
    };
    let mut at = 0;
    for raw in om.split_inclusive('\n') {
        let from = at;
        at += raw.len();
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        if !line.starts_with('#') {
            flush(&mut own, &mut help);
            if !own.is_empty() {
                if let Some(r) = shared.take() {
                    pieces.push(Piece::Shared(r));
                }
                pieces.push(Piece::Own(Bytes::from(std::mem::take(&mut own))));
            }
            shared = match shared.take() {
                Some(r) if r.end == from => Some(r.start..at),
                Some(r) => {
                    pieces.push(Piece::Shared(r));
                    Some(from..at)
                }
                None => Some(from..at),
            };
            if !raw.ends_with('\n') {
                // The last line of a text without a final newline.
                own.push('\n');
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush(&mut own, &mut help);
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or((rest, ""));
            let (family, ty) = classic_family(name, ty);
            match help.take() {
                Some((n, text)) if n == name => {
                    push_line(&mut own, &["# HELP ", &family, " ", text])
                }
                other => {
                    help = other;
                    flush(&mut own, &mut help);
                }
            }
            push_line(&mut own, &["# TYPE ", &family, " ", ty]);
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            flush(&mut own, &mut help);
            push_line(&mut own, &[line]);
        }
    }
    flush(&mut own, &mut help);
    if let Some(r) = shared {
        pieces.push(Piece::Shared(r));
    }
    if !own.is_empty() {
        pieces.push(Piece::Own(Bytes::from(own)));
    }
    pieces
}

/// [`classic_pieces`] of `om` as one string.
#[cfg(test)]
fn classic(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    for p in classic_pieces(om) {
        match p {
            Piece::Shared(r) => out.push_str(&om[r]),
            Piece::Own(b) => out.push_str(&String::from_utf8_lossy(&b)),
        }
    }
    out
}

fn push_line(out: &mut String, parts: &[&str]) {
    for p in parts {
        out.push_str(p);
    }
    out.push('\n');
}

/// A family's 0.0.4 name and type from its OpenMetrics ones.
fn classic_family<'a>(name: &'a str, ty: &'a str) -> (Cow<'a, str>, &'a str) {
    match ty {
        "counter" => (Cow::Owned(format!("{name}_total")), "counter"),
        "unknown" if UNSUFFIXED_COUNTERS.contains(&name) => (Cow::Borrowed(name), "counter"),
        "unknown" => (Cow::Borrowed(name), "untyped"),
        "info" => (Cow::Owned(format!("{name}_info")), "gauge"),
        _ => (Cow::Borrowed(name), ty),
    }
}

/// The format a request with `Accept` header `accept` gets: the acceptable
/// media range of highest `q` that names one (an exact type before a
/// wildcard, then the earlier); OpenMetrics for
/// `application/openmetrics-text` of version 1.0.0 or 0.0.1 (or none) and
/// `application/*`, the classic format for `text/plain` (any version),
/// `text/*` and `*/*`. No header, or nothing acceptable in it: classic,
/// which every Prometheus client reads.
pub fn negotiate(accept: Option<&str>) -> Format {
    let mut best: Option<(u32, bool, Format)> = None;
    for range in accept.unwrap_or("").split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let mut q = 1000;
        let mut version = None;
        for p in parts {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            let v = v.trim().trim_matches('"');
            match k.trim().to_ascii_lowercase().as_str() {
                "q" => q = parse_q(v),
                "version" => version = Some(v.to_owned()),
                _ => {}
            }
        }
        let (format, exact) = match media.as_str() {
            "application/openmetrics-text"
                if matches!(version.as_deref(), None | Some("1.0.0" | "0.0.1")) =>
            {
                (Format::OpenMetrics, true)
            }
            "application/*" => (Format::OpenMetrics, false),
            "text/plain" => (Format::Classic, true),
            "text/*" | "*/*" => (Format::Classic, false),
            _ => continue,
        };
        if q == 0 {
            continue;
        }
        if best.is_none_or(|(bq, bexact, _)| (q, exact) > (bq, bexact)) {
            best = Some((q, exact, format));
        }
    }
    best.map_or(Format::Classic, |(_, _, f)| f)
}

/// RFC 9110's qvalue in thousandths; anything malformed counts as 0 (not
/// acceptable), so a garbled range never wins.
fn parse_q(v: &str) -> u32 {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return 0;
    }
    let frac_thousandths = format!("{frac:0<3}").parse::<u32>().unwrap_or(0);
    match int {
        "0" => frac_thousandths,
        "1" if frac_thousandths == 0 => 1000,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_follows_the_render_before_the_one_eof() {
        let main = Exposition::from_openmetrics(
            "# HELP a A.\n# TYPE a counter\na_total 1\n# EOF\n".into(),
        );
        let tail = Exposition::from_openmetrics("# HELP b B.\n# TYPE b gauge\nb 2\n# EOF\n".into());
        let (om, ctype) = main.body_with(Format::OpenMetrics, &tail);
        assert_eq!(ctype, OPENMETRICS);
        assert_eq!(
            om.to_text(),
            "# HELP a A.\n# TYPE a counter\na_total 1\n# HELP b B.\n# TYPE b gauge\nb 2\n# EOF\n"
        );
        assert_eq!(om.size_hint().exact(), Some(om.to_text().len() as u64));
        let (classic, _) = main.body_with(Format::Classic, &tail);
        assert_eq!(
            classic.to_text(),
            "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n# HELP b B.\n# TYPE b gauge\nb 2\n"
        );
        // Before the first scan the render is empty: the tail alone.
        let (om, _) = Exposition::default().body_with(Format::OpenMetrics, &tail);
        assert_eq!(om.to_text(), "# HELP b B.\n# TYPE b gauge\nb 2\n# EOF\n");
    }

    #[test]
    fn prometheus_and_plain_clients_get_their_format() {
        use Format::*;
        for (accept, want) in [
            (None, Classic),
            (Some(""), Classic),
            (Some("*/*"), Classic),
            (Some("text/plain"), Classic),
            (Some("text/plain;version=0.0.4"), Classic),
            (Some("application/openmetrics-text"), OpenMetrics),
            (
                Some("application/openmetrics-text; version=1.0.0"),
                OpenMetrics,
            ),
            // Prometheus 2.x's default scrape header.
            (
                Some(
                    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                     version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                ),
                OpenMetrics,
            ),
            // Prometheus 3 with scrape_protocols preferring the classic format.
            (
                Some(
                    "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;\
                     version=1.0.0;q=0.5,*/*;q=0.1",
                ),
                Classic,
            ),
            (Some("application/openmetrics-text;q=0, */*"), Classic),
            (Some("application/openmetrics-text;version=2.0.0"), Classic),
            (
                Some("text/plain;q=0.2, application/openmetrics-text;q=0.3"),
                OpenMetrics,
            ),
            (
                Some("*/*;q=0.9, application/openmetrics-text;q=0.9"),
                OpenMetrics,
            ),
            (
                Some("application/openmetrics-text;q=0.9, text/plain;q=0.9"),
                OpenMetrics,
            ),
            (
                Some("text/plain;q=0.9, application/openmetrics-text;q=0.9"),
                Classic,
            ),
            (
                Some("application/openmetrics-text;q=1.5, text/plain;q=0.1"),
                Classic,
            ),
            (Some("application/json"), Classic),
        ] {
            assert_eq!(negotiate(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn q_values_parse_as_rfc_9110_says() {
        assert_eq!(parse_q("1"), 1000);
        assert_eq!(parse_q("1.000"), 1000);
        assert_eq!(parse_q("0.5"), 500);
        assert_eq!(parse_q("0.125"), 125);
        assert_eq!(parse_q("0"), 0);
        assert_eq!(parse_q("1.5"), 0);
        assert_eq!(parse_q("0.1234"), 0);
        assert_eq!(parse_q("x"), 0);
    }

    /// The classic body is the OpenMetrics text's sample lines, shared
    /// rather than copied, with the comment lines rewritten; its length is
    /// announced exactly.
    #[test]
    fn the_classic_body_shares_the_sample_lines() {
        let om = "# HELP a_fills Fills.\n# TYPE a_fills counter\na_fills_total 3\n\
                  a_fills_total{x=\"2\"} 4\n# HELP b Bytes.\n# TYPE b_bytes gauge\n\
                  # UNIT b_bytes bytes\nb_bytes 1\n# EOF\n";
        let e = Exposition::from_openmetrics(om.to_owned());
        let (mut body, ctype) = e.body(Format::Classic);
        assert_eq!(ctype, CLASSIC);
        let want = "# HELP a_fills_total Fills.\n# TYPE a_fills_total counter\n\
                    a_fills_total 3\na_fills_total{x=\"2\"} 4\n\
                    # HELP b Bytes.\n# TYPE b_bytes gauge\nb_bytes 1\n";
        assert_eq!(body.size_hint().exact(), Some(want.len() as u64));
        let mut got = Vec::new();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        while let Poll::Ready(Some(Ok(f))) = Pin::new(&mut body).poll_frame(&mut cx) {
            let b = f.into_data().unwrap();
            if b.starts_with(b"a_fills_total 3") {
                // A slice of the one buffer, not a copy.
                assert!(e.openmetrics.as_ptr_range().contains(&b.as_ptr()));
            }
            got.extend_from_slice(&b);
        }
        assert!(body.is_end_stream());
        assert_eq!(String::from_utf8(got).unwrap(), want);
        assert_eq!(
            e.classic
                .iter()
                .filter(|p| matches!(p, Piece::Shared(_)))
                .count(),
            2,
            "{:?}",
            e.classic
        );
        let (om_body, ctype) = e.body(Format::OpenMetrics);
        assert_eq!(ctype, OPENMETRICS);
        assert_eq!(om_body.size_hint().exact(), Some(om.len() as u64));
        // A text whose last line has no newline still ends in one.
        assert_eq!(classic("# TYPE u unknown\nu 1"), "# TYPE u untyped\nu 1\n");
    }

    #[test]
    fn the_classic_format_names_families_as_0_0_4_does() {
        let om = "# HELP a_fills Fills.\n# TYPE a_fills counter\na_fills_total 3\n\
                  # HELP b Bytes.\n# TYPE b_bytes gauge\n# UNIT b_bytes bytes\nb_bytes 1\n\
                  # HELP Device_memory_desc_of_container D.\n\
                  # TYPE Device_memory_desc_of_container unknown\n\
                  Device_memory_desc_of_container{x=\"1\"} 5\n\
                  # HELP u U.\n# TYPE u unknown\nu 1\n# HELP i I.\n# TYPE i info\ni_info{v=\"1\"} 1\n\
                  # EOF\n";
        assert_eq!(
            classic(om),
            "# HELP a_fills_total Fills.\n# TYPE a_fills_total counter\na_fills_total 3\n\
             # HELP b Bytes.\n# TYPE b_bytes gauge\nb_bytes 1\n\
             # HELP Device_memory_desc_of_container D.\n\
             # TYPE Device_memory_desc_of_container counter\n\
             Device_memory_desc_of_container{x=\"1\"} 5\n\
             # HELP u U.\n# TYPE u untyped\nu 1\n# HELP i_info I.\n# TYPE i_info gauge\n\
             i_info{v=\"1\"} 1\n"
        );
    }
}
