//! Kubernetes resource quantities (`500m`, `1Gi`, `1e3`), parsed as `resource.ParseQuantity` does.

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

fn count_digits(bytes: &[u8]) -> usize {
    bytes.iter().take_while(|b| b.is_ascii_digit()).count()
}

#[cfg(test)]
mod tests {
    use super::parse_quantity;

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
