//! Durations as Kubernetes users write them: Go duration strings (`"90s"`, `"1h30m"`, `"720h"`)
//! and, where a field allows it, the word `"Never"`.
//!
//! The CRD fields stay strings so that YAML written for Karpenter round-trips unchanged; these
//! functions turn them into [`jiff::SignedDuration`] values for the decision code.

use jiff::SignedDuration;

use crate::apis::{Error, Result};

/// The word that disables a duration-valued setting (`expireAfter: Never`).
pub const NEVER: &str = "Never";

/// Schema pattern for a non-negative Go duration such as `"30s"`, `"1h30m"` or `"0"`.
pub const DURATION_PATTERN: &str = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+)$";

/// Schema pattern for a non-negative Go duration or the word `Never`.
pub const DURATION_OR_NEVER_PATTERN: &str = r"^(Never|0|([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+)$";

/// Parses a non-negative Go duration string (`"300ms"`, `"1.5h"`, `"2h45m"`, `"0"`).
pub fn parse_duration(value: &str) -> Result<SignedDuration> {
    let invalid = |reason: &'static str| Error::InvalidDuration {
        value: value.to_owned(),
        reason,
    };
    if value == "0" {
        return Ok(SignedDuration::ZERO);
    }
    if value.is_empty() {
        return Err(invalid("it is empty"));
    }
    if value.starts_with('-') {
        return Err(invalid("it is negative"));
    }

    let not_digit = |c: char| !c.is_ascii_digit();
    let mut rest = value.strip_prefix('+').unwrap_or(value);
    let mut total_nanos: i128 = 0;
    while !rest.is_empty() {
        let (whole, after) = rest.split_at(rest.find(not_digit).unwrap_or(rest.len()));
        let (fraction, after) = match after.strip_prefix('.') {
            Some(tail) => tail.split_at(tail.find(not_digit).unwrap_or(tail.len())),
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(invalid("a number is missing before a unit"));
        }
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let unit_nanos: i128 = match unit {
            "ns" => 1,
            // Go accepts both the micro sign and the Greek mu.
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(invalid("a number has no unit (use ns, us, ms, s, m or h)")),
            _ => return Err(invalid("the unit is not one of ns, us, ms, s, m, h")),
        };

        let whole: i128 = if whole.is_empty() {
            0
        } else {
            whole
                .parse()
                .map_err(|_| invalid("a number is too large"))?
        };
        // Like Go, keep the fraction exact: digits beyond nanosecond precision are dropped.
        let (mut fraction_value, mut scale) = (0_i128, 1_i128);
        for digit in fraction.bytes().take(18) {
            fraction_value = fraction_value * 10 + i128::from(digit - b'0');
            scale *= 10;
        }
        let part = whole
            .checked_mul(unit_nanos)
            .and_then(|n| n.checked_add(fraction_value * unit_nanos / scale))
            .ok_or_else(|| invalid("it is too long"))?;
        total_nanos = total_nanos
            .checked_add(part)
            .ok_or_else(|| invalid("it is too long"))?;
        rest = after;
    }

    let nanos = i64::try_from(total_nanos).map_err(|_| invalid("it is longer than 292 years"))?;
    Ok(SignedDuration::from_nanos(nanos))
}

/// Parses a Go duration string or `"Never"`; `Ok(None)` means never.
pub fn parse_duration_or_never(value: &str) -> Result<Option<SignedDuration>> {
    if value == NEVER {
        Ok(None)
    } else {
        parse_duration(value).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: i64) -> SignedDuration {
        SignedDuration::from_secs(s)
    }

    #[test]
    fn go_durations_parse_into_exact_spans() {
        assert_eq!(parse_duration("0").ok(), Some(SignedDuration::ZERO));
        assert_eq!(parse_duration("0s").ok(), Some(SignedDuration::ZERO));
        assert_eq!(parse_duration("90s").ok(), Some(secs(90)));
        assert_eq!(parse_duration("1h30m").ok(), Some(secs(5400)));
        assert_eq!(parse_duration("720h").ok(), Some(secs(720 * 3600)));
        assert_eq!(parse_duration("1.5h").ok(), Some(secs(5400)));
        assert_eq!(
            parse_duration("300ms").ok(),
            Some(SignedDuration::from_millis(300))
        );
        assert_eq!(
            parse_duration("1\u{b5}s").ok(),
            Some(SignedDuration::from_micros(1))
        );
    }

    #[test]
    fn never_means_no_duration_at_all() {
        assert_eq!(parse_duration_or_never("Never").ok(), Some(None));
        assert_eq!(
            parse_duration_or_never("24h").ok(),
            Some(Some(secs(86_400)))
        );
        assert!(parse_duration("Never").is_err());
    }

    #[test]
    fn malformed_durations_are_rejected_with_the_value_named() {
        for bad in [
            "",
            "10",
            "h",
            "5d",
            "-1h",
            "1.h5",
            "99999999999999999999999h",
        ] {
            let err = parse_duration(bad).err();
            assert!(err.is_some(), "{bad:?} should be rejected");
            let message = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(message.contains(&format!("{bad:?}")), "{message}");
        }
    }
}
