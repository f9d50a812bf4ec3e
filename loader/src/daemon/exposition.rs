//! The two text formats `/metrics` serves and which one a client gets.
//!
//! [`super::metrics`] renders OpenMetrics once per scan; [`classic`]
//! derives the Prometheus text format 0.0.4 from it in one linear pass, so
//! both are ready before any request and a scrape only picks one
//! ([`negotiate`]). A client that asks for OpenMetrics in its `Accept`
//! header (Prometheus does, by default) gets it; every other client (curl,
//! older scrapers, HAMi's own tooling) gets 0.0.4, as HAMi's monitor serves.

use std::borrow::Cow;

use hyper::body::Bytes;

use super::legacy_metrics::UNSUFFIXED_COUNTERS;

/// `Content-Type` of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of the classic Prometheus text format.
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One render in both formats.
#[derive(Clone, Debug, Default)]
pub struct Exposition {
    pub openmetrics: Bytes,
    pub classic: Bytes,
}

impl Exposition {
    /// Both formats of OpenMetrics text `om`.
    pub fn from_openmetrics(om: String) -> Self {
        Self {
            classic: Bytes::from(classic(&om)),
            openmetrics: Bytes::from(om),
        }
    }

    /// The body and `Content-Type` of `format`.
    pub fn body(&self, format: Format) -> (Bytes, &'static str) {
        match format {
            Format::OpenMetrics => (self.openmetrics.clone(), OPENMETRICS),
            Format::Classic => (self.classic.clone(), CLASSIC),
        }
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
/// and `info` a gauge named `x_info`, as 0.0.4 parsers expect.
pub fn classic(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    // `# HELP` comes before `# TYPE`, which decides the family's 0.0.4 name.
    let mut help: Option<(&str, &str)> = None;
    let flush = |out: &mut String, help: &mut Option<(&str, &str)>| {
        if let Some((name, text)) = help.take() {
            push_line(out, &["# HELP ", name, " ", text]);
        }
    };
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush(&mut out, &mut help);
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or((rest, ""));
            let (family, ty) = classic_family(name, ty);
            match help.take() {
                Some((n, text)) if n == name => {
                    push_line(&mut out, &["# HELP ", &family, " ", text])
                }
                other => {
                    help = other;
                    flush(&mut out, &mut help);
                }
            }
            push_line(&mut out, &["# TYPE ", &family, " ", ty]);
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            flush(&mut out, &mut help);
            push_line(&mut out, &[line]);
        }
    }
    flush(&mut out, &mut help);
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
