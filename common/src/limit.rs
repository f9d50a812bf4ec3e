//! Parsing of `CUDA_DEVICE_MEMORY_LIMIT[_N]` and `CUDA_DEVICE_SM_LIMIT[_N]`.
//!
//! HAMi-core accepts anything `strtoul` half-reads and takes the suffix from
//! the last character (`1024mb` becomes 1024 bytes, `1.5g` becomes 1 GiB;
//! `get_limit_from_env` in its `src/multiprocess/multiprocess_memory_limit.c`,
//! <https://github.com/Project-HAMi/HAMi-core>). A wrong limit that looks right is
//! worse than none, so vgpu accepts exactly `<decimal digits>[k|K|m|M|g|G]`
//! and reports everything else as an error naming the variable.

use crate::region::rules::{sm_limit_shown, SM_UNLIMITED};
use crate::region::MAX_DEVICES;

/// Why a limit value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("{var} is empty")]
    Empty { var: String },
    #[error(
        "{var}={value:?} is not a size: expected digits with an optional k, m or g suffix \
         (for example 1g, 1024m, 1048576k or 1073741824)"
    )]
    Malformed { var: String, value: String },
    #[error(
        "{var}={value:?} has a leading zero; HAMi-core would read it as octal or hex, \
         so it is refused rather than guessed"
    )]
    Ambiguous { var: String, value: String },
    #[error("{var}={value:?} is too large (overflows 64 bits)")]
    Overflow { var: String, value: String },
    #[error("{var}={value:?} is not a percentage from 0 to 100")]
    Percent { var: String, value: String },
}

/// Parses a memory size: `1g`, `1024m`, `1048576k` or plain bytes.
/// `0` is returned as 0, which callers treat as "no limit" (HAMi's meaning).
pub fn parse_size(var: &str, value: &str) -> Result<u64, LimitError> {
    let err = |kind: fn(String, String) -> LimitError| kind(var.to_owned(), value.to_owned());
    if value.is_empty() {
        return Err(LimitError::Empty {
            var: var.to_owned(),
        });
    }
    let (digits, scale) = match value.as_bytes()[value.len() - 1] {
        b'k' | b'K' => (&value[..value.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&value[..value.len() - 1], 1u64 << 20),
        b'g' | b'G' => (&value[..value.len() - 1], 1u64 << 30),
        _ => (value, 1u64),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(|var, value| LimitError::Malformed { var, value }));
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return Err(err(|var, value| LimitError::Ambiguous { var, value }));
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| err(|var, value| LimitError::Overflow { var, value }))
}

/// Parses an SM share in percent. `0` means "no limit" (HAMi), returned as
/// [`SM_UNLIMITED`].
pub fn parse_percent(var: &str, value: &str) -> Result<u64, LimitError> {
    let bad = || LimitError::Percent {
        var: var.to_owned(),
        value: value.to_owned(),
    };
    if value.is_empty() {
        return Err(LimitError::Empty {
            var: var.to_owned(),
        });
    }
    if !value.bytes().all(|b| b.is_ascii_digit()) || (value.len() > 1 && value.starts_with('0')) {
        return Err(bad());
    }
    match value.parse::<u64>() {
        Ok(n) if n <= SM_UNLIMITED => Ok(sm_limit_shown(n)),
        _ => Err(bad()),
    }
}

/// Per-device limits from `BASE` and `BASE_<N>`, with the errors of every
/// variable that did not parse. A device whose variable is bad gets the
/// fallback (`default`), never a half-read value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLimits {
    pub values: [u64; MAX_DEVICES],
    pub errors: Vec<LimitError>,
}

/// Reads `base` and `base_0` … `base_15` through `lookup` (usually
/// `std::env::var`), parsing each with `parse`. `default` applies where
/// neither is set or valid.
pub fn device_limits(
    base: &str,
    default: u64,
    parse: fn(&str, &str) -> Result<u64, LimitError>,
    lookup: impl Fn(&str) -> Option<String>,
) -> DeviceLimits {
    let mut errors = Vec::new();
    let mut read = |var: &str| -> Option<u64> {
        let value = lookup(var)?;
        parse(var, &value).map_err(|e| errors.push(e)).ok()
    };
    let fallback = read(base).unwrap_or(default);
    let mut values = [fallback; MAX_DEVICES];
    for (i, v) in values.iter_mut().enumerate() {
        if let Some(n) = read(&format!("{base}_{i}")) {
            *v = n;
        }
    }
    DeviceLimits { values, errors }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;
    const K: u64 = 1 << 10;

    #[test]
    fn size_table() {
        let ok: &[(&str, u64)] = &[
            ("1g", G),
            ("1G", G),
            ("1024m", G),
            ("1024M", G),
            ("1048576k", G),
            ("1048576K", G),
            ("1073741824", G),
            ("0", 0),
            ("512m", 512 * M),
            ("3k", 3 * K),
            ("17179869184", 16 * G),
            ("18446744073709551615", u64::MAX),
        ];
        for (input, want) in ok {
            assert_eq!(parse_size("V", input), Ok(*want), "{input}");
        }
        type Case = (&'static str, fn(&LimitError) -> bool);
        let bad: &[Case] = &[
            ("", |e| matches!(e, LimitError::Empty { .. })),
            ("1024mb", |e| matches!(e, LimitError::Malformed { .. })),
            ("-1", |e| matches!(e, LimitError::Malformed { .. })),
            ("abc", |e| matches!(e, LimitError::Malformed { .. })),
            ("1.5g", |e| matches!(e, LimitError::Malformed { .. })),
            ("g", |e| matches!(e, LimitError::Malformed { .. })),
            (" 1g", |e| matches!(e, LimitError::Malformed { .. })),
            ("1g ", |e| matches!(e, LimitError::Malformed { .. })),
            ("1t", |e| matches!(e, LimitError::Malformed { .. })),
            ("+5", |e| matches!(e, LimitError::Malformed { .. })),
            ("0x10", |e| matches!(e, LimitError::Malformed { .. })),
            ("010m", |e| matches!(e, LimitError::Ambiguous { .. })),
            ("18446744073709551616", |e| {
                matches!(e, LimitError::Overflow { .. })
            }),
            ("17179869184g", |e| matches!(e, LimitError::Overflow { .. })),
        ];
        for (input, is_expected) in bad {
            let err = parse_size("CUDA_DEVICE_MEMORY_LIMIT", input)
                .expect_err(&format!("{input:?} must be refused"));
            assert!(is_expected(&err), "{input:?} gave {err:?}");
            assert!(
                err.to_string().contains("CUDA_DEVICE_MEMORY_LIMIT"),
                "error names the variable: {err}"
            );
        }
    }

    #[test]
    fn percent_table() {
        for (input, want) in [("0", 100), ("1", 1), ("30", 30), ("100", 100)] {
            assert_eq!(parse_percent("S", input), Ok(want), "{input}");
        }
        for input in [
            "",
            "101",
            "-5",
            "30%",
            "abc",
            "1.5",
            "050",
            "99999999999999999999",
        ] {
            assert!(parse_percent("S", input).is_err(), "{input:?}");
        }
    }

    #[test]
    fn per_device_variants_override_the_base() {
        let env = |var: &str| match var {
            "L" => Some("1g".to_owned()),
            "L_1" => Some("2g".to_owned()),
            "L_3" => Some("1024mb".to_owned()),
            _ => None,
        };
        let got = device_limits("L", 0, parse_size, env);
        assert_eq!(got.values[0], G);
        assert_eq!(got.values[1], 2 * G);
        assert_eq!(got.values[2], G);
        assert_eq!(got.values[3], G, "a bad _N falls back to the base");
        assert_eq!(got.errors.len(), 1);
        assert!(got.errors[0].to_string().contains("L_3"));
    }

    #[test]
    fn bad_base_means_no_limit_not_a_wrong_one() {
        let env = |var: &str| (var == "L").then(|| "1024mb".to_owned());
        let got = device_limits("L", 0, parse_size, env);
        assert_eq!(got.values, [0; MAX_DEVICES]);
        assert_eq!(got.errors.len(), 1);
    }
}
