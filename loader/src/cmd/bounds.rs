//! Bounded numeric arguments: a period of 0 (a busy loop), NaN or a year
//! is refused by clap with the accepted range, instead of being clamped
//! silently or spinning a core.

/// A clap value parser for a number of seconds within `min..=max`.
pub fn seconds(
    min: f64,
    max: f64,
) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    number(min, max, "seconds")
}

/// A clap value parser for a decimal number within `min..=max` (`what`
/// names the unit in the message).
pub fn number(
    min: f64,
    max: f64,
    what: &'static str,
) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("not a number of {what}"))?;
        if v.is_finite() && (min..=max).contains(&v) {
            Ok(v)
        } else {
            Err(format!("{what} must be from {min} to {max}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive_and_refuse_the_rest() {
        let p = seconds(0.05, 3600.0);
        assert_eq!(p("0.05"), Ok(0.05));
        assert_eq!(p("3600"), Ok(3600.0));
        for bad in ["0", "-1", "NaN", "inf", "3600.5", "x", ""] {
            assert!(p(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            p("0").unwrap_err(),
            "seconds must be from 0.05 to 3600",
            "the message names the range"
        );
    }
}
