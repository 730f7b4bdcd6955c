//! Resource quantities in the form the API server stores them.
//!
//! A real API server rewrites every quantity of a built-in object to its canonical form (`0.5` →
//! `500m`, `1.0Gi` → `1Gi`, `2000` → `2k`). A controller that compares what it would apply
//! with what is stored must build the same form, or every resync of an unchanged notebook looks
//! like a change. This follows `resource.Quantity`'s parsing and `CanonicalizeBytes` exactly.

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// Why a text is no quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} does not start with a number")]
    NoNumber(String),
    #[error("{0:?} has an unknown suffix")]
    Suffix(String),
    #[error("{0:?} is too large to represent")]
    TooLarge(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// `Ki`, `Mi`, … : powers of 1024.
    BinarySi,
    /// `m`, `k`, `M`, … or no suffix.
    DecimalSi,
    /// `e3`, `E-2`.
    DecimalExponent,
}

/// A parsed quantity: `mantissa × 10^exponent`, exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Parsed {
    negative: bool,
    mantissa: u128,
    exponent: i32,
    format: Format,
}

/// The canonical text of `text`, as the API server would store it.
pub fn canonical(text: &str) -> Result<String, QuantityError> {
    let parsed = parse(text)?;
    format(parsed).ok_or_else(|| QuantityError::TooLarge(text.to_owned()))
}

/// The value of `text`, as a float (exact enough for comparing amounts and sizing limits).
pub fn value(text: &str) -> Result<f64, QuantityError> {
    let parsed = parse(text)?;
    // The mantissa's digits and the power of ten apart, so that neither overflows alone.
    let magnitude = format!("{}e{}", parsed.mantissa, parsed.exponent)
        .parse::<f64>()
        .map_err(|_| QuantityError::TooLarge(text.to_owned()))?;
    Ok(if parsed.negative {
        -magnitude
    } else {
        magnitude
    })
}

fn parse(text: &str) -> Result<Parsed, QuantityError> {
    let no_number = || QuantityError::NoNumber(text.to_owned());
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let integer_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (integer, rest) = rest.split_at(integer_len);
    let (fraction, suffix) = match rest.strip_prefix('.') {
        Some(after) => after.split_at(after.bytes().take_while(u8::is_ascii_digit).count()),
        None => ("", rest),
    };
    if integer.is_empty() && fraction.is_empty() {
        return Err(no_number());
    }
    let too_large = || QuantityError::TooLarge(text.to_owned());
    let mut mantissa: u128 = 0;
    for digit in integer.bytes().chain(fraction.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(digit - b'0')))
            .ok_or_else(too_large)?;
    }
    let mut exponent = -i32::try_from(fraction.len()).map_err(|_| too_large())?;
    let (format, power_of_ten, power_of_1024) = match suffix {
        "" => (Format::DecimalSi, 0, 0),
        "n" => (Format::DecimalSi, -9, 0),
        "u" => (Format::DecimalSi, -6, 0),
        "m" => (Format::DecimalSi, -3, 0),
        "k" => (Format::DecimalSi, 3, 0),
        "M" => (Format::DecimalSi, 6, 0),
        "G" => (Format::DecimalSi, 9, 0),
        "T" => (Format::DecimalSi, 12, 0),
        "P" => (Format::DecimalSi, 15, 0),
        "E" => (Format::DecimalSi, 18, 0),
        "Ki" => (Format::BinarySi, 0, 1),
        "Mi" => (Format::BinarySi, 0, 2),
        "Gi" => (Format::BinarySi, 0, 3),
        "Ti" => (Format::BinarySi, 0, 4),
        "Pi" => (Format::BinarySi, 0, 5),
        "Ei" => (Format::BinarySi, 0, 6),
        _ => {
            let digits = suffix
                .strip_prefix(['e', 'E'])
                .ok_or_else(|| QuantityError::Suffix(text.to_owned()))?;
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::Suffix(text.to_owned()));
            }
            let power: i32 = digits.parse().map_err(|_| too_large())?;
            (Format::DecimalExponent, power, 0)
        }
    };
    exponent = exponent.checked_add(power_of_ten).ok_or_else(too_large)?;
    for _ in 0..power_of_1024 {
        mantissa = mantissa.checked_mul(1024).ok_or_else(too_large)?;
    }
    // Quantities are exact to the nano; finer amounts round away from zero.
    if exponent < -9 {
        let divisor = 10u128
            .checked_pow(u32::try_from(-9 - exponent).map_err(|_| too_large())?)
            .unwrap_or(u128::MAX);
        mantissa = mantissa.div_ceil(divisor);
        exponent = -9;
    }
    Ok(Parsed {
        negative,
        mantissa,
        exponent,
        format,
    })
}

fn format(q: Parsed) -> Option<String> {
    if q.mantissa == 0 {
        return Some("0".to_owned());
    }
    let sign = if q.negative { "-" } else { "" };
    let mut format = q.format;
    if format == Format::BinarySi {
        // Below 1024, or not a whole number, a binary suffix would hide or round: decimal.
        match whole(q.mantissa, q.exponent) {
            Some(value) if value >= 1024 => {
                let (amount, times) = remove_factors(value, 1024);
                let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].get(times)?;
                return Some(format!("{sign}{amount}{suffix}"));
            }
            _ => format = Format::DecimalSi,
        }
    }
    let (mut amount, times) = remove_factors(q.mantissa, 10);
    let mut exponent = q.exponent.checked_add(i32::try_from(times).ok()?)?;
    // Down to a multiple of three, so that an SI suffix names it.
    let below = exponent.rem_euclid(3);
    amount = amount.checked_mul(10u128.pow(u32::try_from(below).ok()?))?;
    exponent -= below;
    let suffix = match format {
        Format::DecimalExponent if exponent == 0 => String::new(),
        Format::DecimalExponent => format!("e{exponent}"),
        _ => match exponent {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => return None,
        }
        .to_owned(),
    };
    Some(format!("{sign}{amount}{suffix}"))
}

/// `mantissa × 10^exponent` when it is a whole number.
fn whole(mantissa: u128, exponent: i32) -> Option<u128> {
    let power = 10u128.checked_pow(exponent.unsigned_abs())?;
    if exponent >= 0 {
        mantissa.checked_mul(power)
    } else {
        mantissa.is_multiple_of(power).then(|| mantissa / power)
    }
}

fn remove_factors(mut value: u128, base: u128) -> (u128, usize) {
    let mut times = 0;
    while value != 0 && value.is_multiple_of(base) {
        value /= base;
        times += 1;
    }
    (value, times)
}

fn canonicalize_map(quantities: &mut Option<BTreeMap<String, Quantity>>) {
    for quantity in quantities.iter_mut().flat_map(|map| map.values_mut()) {
        if let Ok(text) = canonical(&quantity.0) {
            quantity.0 = text;
        }
    }
}

fn canonicalize_resources(resources: &mut Option<ResourceRequirements>) {
    if let Some(resources) = resources {
        canonicalize_map(&mut resources.limits);
        canonicalize_map(&mut resources.requests);
    }
}

/// Rewrites every quantity of a pod spec (resources, overhead, emptyDir sizes) to its canonical
/// form; a malformed one is left for the API server to refuse.
pub fn canonicalize_pod_spec(spec: &mut PodSpec) {
    let containers: &mut dyn Iterator<Item = &mut Container> = &mut spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for container in containers {
        canonicalize_resources(&mut container.resources);
    }
    canonicalize_resources(&mut spec.resources);
    canonicalize_map(&mut spec.overhead);
    for volume in spec.volumes.iter_mut().flatten() {
        if let Some(size) = volume
            .empty_dir
            .as_mut()
            .and_then(|e| e.size_limit.as_mut())
            && let Ok(text) = canonical(&size.0)
        {
            size.0 = text;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_take_the_api_servers_canonical_form() {
        let cases = [
            ("0.5", "500m"),
            ("1.0Gi", "1Gi"),
            ("1", "1"),
            ("1.5", "1500m"),
            ("0.1", "100m"),
            ("2000", "2k"),
            ("1024", "1024"),
            ("1000k", "1M"),
            ("100m", "100m"),
            ("1.5Gi", "1536Mi"),
            ("0.5Gi", "512Mi"),
            ("1000Mi", "1000Mi"),
            ("512Ki", "512Ki"),
            ("0.5Ki", "512"),
            ("1.5Ki", "1536"),
            ("0.1Ki", "102400m"),
            ("1e3", "1e3"),
            ("1E3", "1e3"),
            ("1500e0", "1500"),
            ("1E", "1E"),
            ("+1", "1"),
            ("01", "1"),
            ("-0.5", "-500m"),
            ("0", "0"),
            ("0Gi", "0"),
            ("0.0", "0"),
            (".5", "500m"),
            ("5.", "5"),
            ("0.0000000001", "1n"),
            ("1.0000000001", "1000000001n"),
            ("12e-1", "1200e-3"),
        ];
        for (text, expected) in cases {
            assert_eq!(canonical(text).as_deref(), Ok(expected), "{text}");
        }
    }

    #[test]
    fn values_are_read_with_every_suffix() {
        let cases = [
            ("500m", 0.5),
            ("400u", 0.0004),
            ("3n", 3e-9),
            ("1.5Gi", 1.5 * 1024.0 * 1024.0 * 1024.0),
            ("2E", 2e18),
            ("1Ei", 1024f64.powi(6)),
            ("1e3", 1000.0),
            ("-2k", -2000.0),
        ];
        for (text, expected) in cases {
            let value = value(text).unwrap();
            assert!(
                (value - expected).abs() <= expected.abs() * 1e-12,
                "{text}: {value}"
            );
        }
    }

    #[test]
    fn malformed_quantities_are_errors() {
        for text in ["", "-", "Gi", "1x", "1e", "1e+", "1 Gi", "1.2.3", "1KiB"] {
            assert!(canonical(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn a_pod_specs_quantities_are_all_canonicalized() {
        let mut spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{"name": "a", "resources": {"limits": {"cpu": "0.5", "memory": "1.0Gi"},
                                                        "requests": {"cpu": "0.25"}}}],
            "initContainers": [{"name": "b", "resources": {"limits": {"cpu": "2000m"}}}],
            "volumes": [{"name": "dshm", "emptyDir": {"sizeLimit": "1.0Gi"}}]
        }))
        .unwrap();
        canonicalize_pod_spec(&mut spec);
        let value = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            value["containers"][0]["resources"],
            serde_json::json!({"limits": {"cpu": "500m", "memory": "1Gi"}, "requests": {"cpu": "250m"}})
        );
        assert_eq!(
            value["initContainers"][0]["resources"]["limits"]["cpu"],
            "2"
        );
        assert_eq!(value["volumes"][0]["emptyDir"]["sizeLimit"], "1Gi");
    }
}
