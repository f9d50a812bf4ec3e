//! Kubernetes quantities (`8Gi`, `512M`, `30`, `1.5Gi`) as whole numbers:
//! what a consumed capacity of `memory` (bytes) or `cores` (percent) is.

/// Why a quantity is not a whole number vgpu can use.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("not a quantity (a number with an optional suffix such as Ki, Mi, Gi, k, M, G)")]
    Malformed,
    #[error("not a whole number")]
    Fraction,
    #[error("too large")]
    Overflow,
}

/// Parses a non-negative quantity that is a whole number.
pub fn parse(s: &str) -> Result<u64, QuantityError> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let (num, den): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "m" => (1, 1_000),
        "u" => (1, 1_000_000),
        "n" => (1, 1_000_000_000),
        _ => return Err(QuantityError::Malformed),
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() {
        return Err(QuantityError::Malformed);
    }
    if frac.contains('.') || frac.len() > 18 {
        return Err(QuantityError::Malformed);
    }
    let digits = format!("{int}{frac}");
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| QuantityError::Overflow)?
    };
    let scale = 10u128.pow(u32::try_from(frac.len()).map_err(|_| QuantityError::Malformed)?);
    let top = mantissa.checked_mul(num).ok_or(QuantityError::Overflow)?;
    let bottom = scale * den;
    if top % bottom != 0 {
        return Err(QuantityError::Fraction);
    }
    u64::try_from(top / bottom).map_err(|_| QuantityError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_quantities_parse_and_others_do_not() {
        assert_eq!(parse("8Gi"), Ok(8 << 30));
        assert_eq!(parse("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse("30"), Ok(30));
        assert_eq!(parse("4G"), Ok(4_000_000_000));
        assert_eq!(parse("1000m"), Ok(1));
        assert_eq!(parse("1500m"), Err(QuantityError::Fraction));
        assert_eq!(parse("12Qi"), Err(QuantityError::Malformed));
        assert_eq!(parse("-1"), Err(QuantityError::Malformed));
        assert_eq!(parse(""), Err(QuantityError::Malformed));
        assert_eq!(parse("100Ei"), Err(QuantityError::Overflow));
    }
}
