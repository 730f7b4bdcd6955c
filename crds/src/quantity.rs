//! Resource quantities in the form the API server stores them.
//!
//! A real API server rewrites every quantity of a built-in object to its canonical form (`0.5` →
//! `500m`, `1.0Gi` → `1Gi`, `2000` → `2k`). A controller that compares what it would apply
//! with what is stored must build the same form, or every resync of an unchanged notebook looks
//! like a change. This follows `resource.Quantity`'s parsing, including the text it keeps as
//! written when it already looks canonical (`+1`, `1.500`), and `CanonicalizeBytes`; amounts
//! past what 128 bits hold are left as written.

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
    if kept_as_written(text) {
        return Ok(text.to_owned());
    }
    format(parsed).ok_or_else(|| QuantityError::TooLarge(text.to_owned()))
}

/// Whether the API server keeps `text` (a valid quantity) as it was written: its parser's fast
/// path does when the digits fit 64 bits, are exact to the nano, and already look canonical (an
/// exponent that is a multiple of three, no leading zero and no trailing `000`; for a binary
/// suffix, digits not divisible by eight).
fn kept_as_written(text: &str) -> bool {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let number_len = unsigned
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    // Its parser drops leading zeros first (`01` keeps its text, `0.5` does not).
    let whole = whole.trim_start_matches('0');
    let digits = format!("{whole}{fraction}");
    let Ok(value) = digits.parse::<i64>() else {
        return false;
    };
    let length = |text: &str| i64::try_from(text.len()).unwrap_or(i64::MAX);
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
        .iter()
        .position(|s| *s == suffix)
        .map(|p| 10 * (i64::try_from(p).unwrap_or(0) + 1));
    if let Some(power_of_two) = binary {
        let precision = 15 - length(whole) - power_of_two * 3 / 10 - 1;
        return fraction.is_empty()
            && precision >= 0
            && value.checked_mul(1i64 << power_of_two).is_some()
            && value & 7 != 0;
    }
    let power_of_ten = match suffix {
        "n" => -9,
        "u" => -6,
        "m" => -3,
        "" => 0,
        "k" => 3,
        "M" => 6,
        "G" => 9,
        "T" => 12,
        "P" => 15,
        "E" => 18,
        exponent => match exponent.get(1..).map(str::parse::<i64>) {
            Some(Ok(power)) => power,
            _ => return false,
        },
    };
    let scale = power_of_ten - length(fraction);
    18 - length(&digits) >= 0
        && scale >= -9
        && scale % 3 == 0
        && !digits.ends_with("000")
        && !digits.starts_with('0')
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
    let exponent_suffix = || match exponent {
        0 => String::new(),
        _ => format!("e{exponent}"),
    };
    let suffix = match format {
        Format::DecimalExponent => exponent_suffix(),
        _ => match exponent {
            -9 => "n".to_owned(),
            -6 => "u".to_owned(),
            -3 => "m".to_owned(),
            0 => String::new(),
            3 => "k".to_owned(),
            6 => "M".to_owned(),
            9 => "G".to_owned(),
            12 => "T".to_owned(),
            15 => "P".to_owned(),
            18 => "E".to_owned(),
            // Past the SI suffixes, an exponent.
            _ => exponent_suffix(),
        },
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
    quantities
        .iter_mut()
        .flat_map(|map| map.values_mut())
        .for_each(canonicalize_one);
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
        let divisors = container.env.iter_mut().flatten().filter_map(|e| {
            e.value_from
                .as_mut()?
                .resource_field_ref
                .as_mut()?
                .divisor
                .as_mut()
        });
        for divisor in divisors {
            canonicalize_one(divisor);
        }
    }
    canonicalize_resources(&mut spec.resources);
    canonicalize_map(&mut spec.overhead);
    for volume in spec.volumes.iter_mut().flatten() {
        if let Some(size) = volume
            .empty_dir
            .as_mut()
            .and_then(|e| e.size_limit.as_mut())
        {
            canonicalize_one(size);
        }
        let claim = volume
            .ephemeral
            .as_mut()
            .and_then(|e| e.volume_claim_template.as_mut())
            .and_then(|t| t.spec.resources.as_mut());
        if let Some(resources) = claim {
            canonicalize_map(&mut resources.limits);
            canonicalize_map(&mut resources.requests);
        }
    }
}

fn canonicalize_one(quantity: &mut Quantity) {
    if let Ok(text) = canonical(&quantity.0) {
        quantity.0 = text;
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
            ("1E", "1E"),
            ("00", "0"),
            ("1000E", "1e21"),
            ("3Gi", "3Gi"),
            ("1024Mi", "1Gi"),
            // Kept as written: the parser finds them canonical already.
            ("+1", "+1"),
            ("5.", "5."),
            ("1E3", "1E3"),
            ("1500e0", "1500e0"),
            ("1.500", "1.500"),
            ("01", "01"),
            ("0.500", "0.500"),
            ("0100m", "0100m"),
            ("-0.5", "-500m"),
            ("0", "0"),
            ("0Gi", "0"),
            ("0.0", "0"),
            (".5", "500m"),
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
