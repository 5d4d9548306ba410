//! Resource quantities (`100m`, `1.5Gi`, `2e3`) read as integers, as upstream's
//! `resource.Quantity` scales them: the scheduler counts requests with it, admission
//! compares them with LimitRanges.

/// Why a quantity string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {quantity:?}: {reason}")]
pub struct QuantityError {
    pub quantity: String,
    pub reason: &'static str,
}

/// Returns `ceil(quantity * 10^scale)`, saturated to the `i64` range.
///
/// `scale = 3` gives the milli-value used for CPU, `scale = 0` the plain value
/// used for memory and every other resource (both round up, as upstream does).
pub fn scaled_value(quantity: &str, scale: i32) -> Result<i64, QuantityError> {
    let err = |reason| QuantityError {
        quantity: quantity.to_string(),
        reason,
    };
    let s = quantity.trim();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err("missing number"));
    }
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 20 {
        return Err(err("too many significant digits"));
    }
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| err("malformed number"))?
    };
    let (decimal_exponent, binary_exponent) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().map_err(|_| err("malformed exponent"))?;
            (e, 0)
        }
        _ => return Err(err("unknown suffix")),
    };
    // Checked: an exponent a client wrote (`1e2147483647`) must not overflow.
    let exponent = i32::try_from(frac_part.len())
        .ok()
        .and_then(|frac| decimal_exponent.checked_add(scale)?.checked_sub(frac))
        .ok_or_else(|| err("exponent out of range"))?;
    let magnitude = mantissa << binary_exponent;
    let result: i128 = if exponent >= 0 {
        10i128
            .checked_pow(exponent as u32)
            .and_then(|p| magnitude.checked_mul(p))
            .unwrap_or(i128::MAX)
    } else {
        match 10i128.checked_pow(exponent.unsigned_abs()) {
            Some(divisor) if negative => magnitude / divisor,
            Some(divisor) => (magnitude + divisor - 1) / divisor,
            None if negative || magnitude == 0 => 0,
            None => 1,
        }
    };
    let result = if negative { -result } else { result };
    Ok(result.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_round_up_like_upstream() {
        assert_eq!(scaled_value("100m", 3).unwrap(), 100);
        assert_eq!(scaled_value("1", 3).unwrap(), 1000);
        assert_eq!(scaled_value("0.5", 3).unwrap(), 500);
        assert_eq!(scaled_value("1.0001", 3).unwrap(), 1001);
        assert_eq!(scaled_value("128Mi", 0).unwrap(), 128 * 1024 * 1024);
        assert_eq!(scaled_value("1G", 0).unwrap(), 1_000_000_000);
        assert_eq!(scaled_value("1e3", 0).unwrap(), 1000);
        assert_eq!(scaled_value("1500m", 0).unwrap(), 2);
        assert_eq!(scaled_value("1n", 3).unwrap(), 1);
        assert_eq!(scaled_value("-1500m", 0).unwrap(), -1);
        assert!(scaled_value("12Q", 0).is_err());
        assert!(scaled_value("1e2147483647", 3).is_err());
        assert_eq!(scaled_value("1e-2147483648", 0).unwrap(), 1);
        assert!(scaled_value("", 0).is_err());
    }
}
