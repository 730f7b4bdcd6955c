//! Kubernetes resource quantities (`500m`, `1Gi`, `1e3`), parsed as `resource.ParseQuantity` does.
//!
//! Kept apart from the product's parser (`labforge_crds::quantity`) on purpose: the fake stands for
//! the API server, and a bug both shared would pass every test.

/// Parses a quantity and returns its approximate value (for comparing requests with limits).
///
/// Grammar: `[+-]? (digits [. digits*] | . digits) [suffix]` where the suffix is a binary SI suffix
/// (`Ki` .. `Ei`), a decimal SI suffix (`n u m k M G T P E`) or a decimal exponent (`e3`, `E-2`).
pub(crate) fn parse_quantity(text: &str) -> Result<f64, String> {
    let bytes = text.as_bytes();
    let mut pos = 0;
    let mut sign = 1.0;
    if let Some(first) = bytes.first() {
        if *first == b'-' {
            sign = -1.0;
            pos = 1;
        } else if *first == b'+' {
            pos = 1;
        }
    }
    let number_start = pos;
    let integer_digits = count_digits(&bytes[pos..]);
    pos += integer_digits;
    let mut fraction_digits = 0;
    if bytes.get(pos) == Some(&b'.') {
        pos += 1;
        fraction_digits = count_digits(&bytes[pos..]);
        pos += fraction_digits;
    }
    if integer_digits == 0 && fraction_digits == 0 {
        return Err(format!("{text:?} does not start with a number"));
    }
    let number: f64 = text[number_start..pos]
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number"))?;
    let suffix = &text[pos..];
    let multiplier = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        _ => {
            let exponent = suffix
                .strip_prefix(['e', 'E'])
                .ok_or_else(|| format!("{text:?} has an unknown suffix {suffix:?}"))?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || count_digits(digits.as_bytes()) != digits.len() {
                return Err(format!("{text:?} has an invalid exponent {suffix:?}"));
            }
            let exponent: i32 = exponent
                .parse()
                .map_err(|_| format!("{text:?} has an invalid exponent {suffix:?}"))?;
            10f64.powi(exponent)
        }
    };
    Ok(sign * number * multiplier)
}

/// The text a real API server stores for a built-in object's quantity (`resource.Quantity`'s
/// canonical form: `0.5` → `500m`, `1.5Gi` → `1536Mi`, `2000` → `2k`), or `None` when `text`
/// is no quantity or past what this fake represents.
pub(crate) fn canonical_quantity(text: &str) -> Option<String> {
    parse_quantity(text).ok()?;
    if stored_as_written(text) {
        return Some(text.to_string());
    }
    let (negative, body) = match text.strip_prefix('-') {
        Some(body) => (true, body),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let split = body
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let mut value: i128 = format!("{whole}{fraction}0").parse::<i128>().ok()? / 10;
    let mut scale = -i64::try_from(fraction.len()).ok()?;
    let binary_power = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
        .iter()
        .position(|s| *s == suffix)
        .map(|p| p + 1);
    let decimal_power = ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"]
        .iter()
        .position(|s| *s == suffix)
        .map(|p| (i64::try_from(p).unwrap_or(0) - 3) * 3);
    let exponent_form = binary_power.is_none() && decimal_power.is_none();
    match (binary_power, decimal_power) {
        (Some(power), _) => {
            value = value.checked_mul(1024i128.checked_pow(u32::try_from(power).ok()?)?)?
        }
        (None, Some(power)) => scale += power,
        (None, None) => scale += suffix[1..].parse::<i64>().ok()?,
    }
    // Exact to the nano: anything finer is rounded up.
    if scale < -9 {
        // Exact to the nano: anything finer is rounded up, in one division.
        let divisor = u32::try_from(-9 - scale)
            .ok()
            .and_then(|drop| 10i128.checked_pow(drop));
        value = match divisor {
            Some(divisor) => value / divisor + i128::from(value % divisor != 0),
            None => i128::from(value != 0),
        };
        scale = -9;
    }
    if value == 0 {
        return Some("0".into());
    }
    let sign = if negative { "-" } else { "" };
    if binary_power.is_some() {
        let integer = if scale >= 0 {
            value.checked_mul(10i128.checked_pow(u32::try_from(scale).ok()?)?)
        } else {
            let divisor = 10i128.checked_pow(u32::try_from(-scale).ok()?)?;
            (value % divisor == 0).then(|| value / divisor)
        };
        if let Some(mut integer) = integer.filter(|i| *i >= 1024) {
            let mut power = 0;
            while integer % 1024 == 0 {
                integer /= 1024;
                power += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].get(power)?;
            return Some(format!("{sign}{integer}{suffix}"));
        }
    }
    while value % 10 == 0 {
        value /= 10;
        scale += 1;
    }
    while scale.rem_euclid(3) != 0 {
        value = value.checked_mul(10)?;
        scale -= 1;
    }
    let suffix = if exponent_form {
        if scale == 0 {
            String::new()
        } else {
            format!("e{scale}")
        }
    } else {
        match usize::try_from(scale / 3 + 3)
            .ok()
            .and_then(|i| ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"].get(i))
        {
            Some(suffix) => suffix.to_string(),
            None => format!("e{scale}"),
        }
    };
    Some(format!("{sign}{value}{suffix}"))
}

/// `resource.ParseQuantity`'s fast path keeps the caller's text when its digits fit an int64 and
/// it already reads as canonical: decimal, exact to the nano, an exponent that is a multiple of
/// three, no leading zero, no trailing "000"; binary, a whole number not divisible by 8.
fn stored_as_written(text: &str) -> bool {
    let body = text.trim_start_matches(['+', '-']);
    let end = body
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(end);
    let (num, denom) = number.split_once('.').unwrap_or((number, ""));
    // Leading zeros are dropped before the test (`01` is kept as written, `0.5` is not).
    let num = num.trim_start_matches('0');
    let shifted = format!("{num}{denom}");
    let Ok(value) = shifted.parse::<i64>() else {
        return false;
    };
    let len = |s: &str| s.len() as i64;
    if let Some(index) = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
        .iter()
        .position(|s| *s == suffix)
    {
        let exponent = 10 * (index as i64 + 1);
        return denom.is_empty()
            && 15 - len(num) - exponent * 3 / 10 > 0
            && value.checked_mul(1 << exponent).is_some()
            && value % 8 != 0;
    }
    let exponent = match ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"]
        .iter()
        .position(|s| *s == suffix)
    {
        Some(index) => (index as i64 - 3) * 3,
        None => match suffix[1..].parse::<i64>() {
            Ok(exponent) => exponent,
            Err(_) => return false,
        },
    };
    let scale = exponent - len(denom);
    18 - len(&shifted) >= 0
        && scale >= -9
        && scale % 3 == 0
        && !shifted.ends_with("000")
        && !shifted.starts_with('0')
}

fn count_digits(bytes: &[u8]) -> usize {
    bytes.iter().take_while(|b| b.is_ascii_digit()).count()
}

#[cfg(test)]
mod tests {
    use super::{canonical_quantity, parse_quantity};

    #[test]
    fn built_in_quantities_are_stored_canonical() {
        for (text, stored) in [
            ("0.5", "500m"),
            ("1.0Gi", "1Gi"),
            ("1.5Gi", "1536Mi"),
            ("0.5Ki", "512"),
            ("2000", "2k"),
            ("1024", "1024"),
            ("1e3", "1e3"),
            ("12e-1", "1200e-3"),
            ("-0.5", "-500m"),
            ("0Gi", "0"),
            ("0.0000000001", "1n"),
            ("+3k", "+3k"),
            ("1.500", "1.500"),
            ("01", "01"),
            ("0.500", "0.500"),
            ("00", "0"),
            ("1024Mi", "1Gi"),
            ("1000E", "1e21"),
            ("1e-2000000000", "1e-9"),
            ("1", "1"),
            ("100m", "100m"),
        ] {
            assert_eq!(canonical_quantity(text).as_deref(), Some(stored), "{text}");
        }
        assert_eq!(canonical_quantity("1GB"), None);
    }

    #[test]
    fn accepts_kubernetes_quantities() {
        for (text, value) in [
            ("500m", 0.5),
            ("1Gi", 1024.0 * 1024.0 * 1024.0),
            ("2", 2.0),
            ("1.5", 1.5),
            ("1e3", 1000.0),
            ("1E-2", 0.01),
            (".5", 0.5),
            ("1.", 1.0),
            ("+3k", 3000.0),
            ("-1", -1.0),
            ("100Mi", 100.0 * 1024.0 * 1024.0),
            ("0", 0.0),
        ] {
            let parsed = parse_quantity(text).unwrap_or_else(|err| panic!("{text}: {err}"));
            assert!(
                (parsed - value).abs() < 1e-9 * value.abs().max(1.0),
                "{text}: {parsed} != {value}"
            );
        }
    }

    #[test]
    fn rejects_malformed_quantities() {
        for text in [
            "1GB", "abc", "-", "", ".", "1K", "1ki", "0.1mi", "1e", "1e1.5", "1 ", " 1", "1Gi2",
            "e3",
        ] {
            assert!(parse_quantity(text).is_err(), "{text:?} should be rejected");
        }
    }
}
