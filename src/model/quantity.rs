//! Kubernetes resource quantities, parsed exactly as the API server does.
//!
//! A quantity is `<sign><digits>[.<digits>]<suffix>` where the suffix is a binary SI
//! suffix (`Ki Mi Gi Ti Pi Ei`), a decimal SI suffix (`m`, none, `k M G T P E`) or a
//! decimal exponent (`e3`, `E-2`). Tailor keeps CPU in millicores and everything else in
//! whole units (bytes, pods, devices), rounding *up* the way `resource.Quantity`'s
//! `MilliValue()` and `Value()` do, so that a request never shrinks by parsing.

/// Why a quantity string was rejected. Always quotes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string does not follow the quantity grammar.
    #[error("invalid quantity {input:?}: {reason}")]
    Syntax {
        /// The rejected string.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The string is well formed but its value does not fit Tailor's 64-bit units.
    #[error("quantity {input:?} is out of range")]
    OutOfRange {
        /// The rejected string.
        input: String,
    },
}

/// Result alias for quantity parsing.
pub type Result<T> = std::result::Result<T, QuantityError>;

/// The scale a suffix stands for: `base^exponent` (base 2 or 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scale {
    base: u32,
    exponent: i32,
}

/// An exact parsed quantity: `mantissa * 10^-fraction_digits * base^exponent`.
#[derive(Debug, Clone, Copy)]
struct Exact {
    negative: bool,
    mantissa: u128,
    fraction_digits: u32,
    scale: Scale,
}

fn syntax(input: &str, reason: &'static str) -> QuantityError {
    QuantityError::Syntax {
        input: input.to_string(),
        reason,
    }
}

fn parse_suffix(input: &str, suffix: &str) -> Result<Scale> {
    let decimal = |exponent| Ok(Scale { base: 10, exponent });
    let binary = |exponent| Ok(Scale { base: 2, exponent });
    match suffix {
        "" => decimal(0),
        // Nano and micro, as resource.Quantity accepts them (metrics-server writes "n").
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        s if s.starts_with(['e', 'E']) => {
            let digits = &s[1..];
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax(input, "malformed exponent"));
            }
            let exponent: i32 = digits
                .parse()
                .map_err(|_| syntax(input, "exponent out of range"))?;
            decimal(exponent)
        }
        _ => Err(syntax(input, "unknown suffix")),
    }
}

fn parse_exact(input: &str) -> Result<Exact> {
    // Like the API server, no surrounding whitespace is tolerated.
    let s = input;
    if s.is_empty() {
        return Err(syntax(input, "empty string"));
    }
    let (negative, rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if fraction.contains('.') {
        return Err(syntax(input, "more than one decimal point"));
    }
    if whole.is_empty() && fraction.is_empty() {
        return Err(syntax(input, "no digits"));
    }
    let scale = parse_suffix(input, suffix)?;
    // Trailing zeros of the fraction carry no value; dropping them keeps long inputs
    // such as "1.50000000000000000000000" exact without overflowing the mantissa.
    let fraction = fraction.trim_end_matches('0');
    let whole = whole.trim_start_matches('0');
    let mut mantissa: u128 = 0;
    for b in whole.bytes().chain(fraction.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(b - b'0')))
            .ok_or_else(|| QuantityError::OutOfRange {
                input: input.to_string(),
            })?;
    }
    Ok(Exact {
        negative,
        mantissa,
        fraction_digits: fraction.len() as u32,
        scale,
    })
}

impl Exact {
    /// The value multiplied by `10^extra`, rounded towards positive infinity, as an i64.
    fn scaled_ceil(&self, input: &str, extra: i32) -> Result<i64> {
        let out_of_range = || QuantityError::OutOfRange {
            input: input.to_string(),
        };
        // value = mantissa * base^exp * 10^(extra - fraction_digits)
        let mut numerator = self.mantissa;
        let mut denominator: u128 = 1;
        let mut ten_exp = i64::from(extra) - i64::from(self.fraction_digits);
        match self.scale.base {
            10 => ten_exp += i64::from(self.scale.exponent),
            _ => {
                // Binary suffixes are never negative.
                let shift = u32::try_from(self.scale.exponent).map_err(|_| out_of_range())?;
                numerator = numerator
                    .checked_mul(1u128.checked_shl(shift).ok_or_else(out_of_range)?)
                    .ok_or_else(out_of_range)?;
            }
        }
        if numerator == 0 {
            return Ok(0);
        }
        if ten_exp >= 0 {
            let factor = 10u128
                .checked_pow(u32::try_from(ten_exp).map_err(|_| out_of_range())?)
                .ok_or_else(out_of_range)?;
            numerator = numerator.checked_mul(factor).ok_or_else(out_of_range)?;
        } else {
            // A divisor beyond 10^38 makes any representable mantissa round to 0 or 1.
            match u32::try_from(-ten_exp)
                .ok()
                .and_then(|e| 10u128.checked_pow(e))
            {
                Some(d) => denominator = d,
                None => {
                    return Ok(if self.negative { 0 } else { 1 });
                }
            }
        }
        let quotient = numerator / denominator;
        let remainder = numerator % denominator;
        let magnitude = i64::try_from(quotient).map_err(|_| out_of_range())?;
        Ok(match (self.negative, remainder == 0) {
            (false, true) => magnitude,
            // Round up, as resource.Quantity does: positive values grow...
            (false, false) => magnitude.checked_add(1).ok_or_else(out_of_range)?,
            // ...and negative values move towards zero.
            (true, _) => -magnitude,
        })
    }
}

/// Parses a quantity into thousandths of a unit (millicores for CPU), rounding up.
///
/// `"1.5"` is 1500, `"100m"` is 100, `"0.1m"` is 1.
pub fn parse_milli(input: &str) -> Result<i64> {
    parse_exact(input)?.scaled_ceil(input, 3)
}

/// Parses a quantity into whole units (bytes for memory and storage, a count for pods
/// and extended resources), rounding up. `"1Gi"` is 1073741824, `"1e3"` is 1000.
pub fn parse_value(input: &str) -> Result<i64> {
    parse_exact(input)?.scaled_ceil(input, 0)
}

/// Formats millicores canonically: whole cores without a suffix, otherwise `m`.
pub fn format_milli(milli: i64) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// Formats a whole-unit value canonically, as the API server writes it back: the
/// largest binary suffix that divides it exactly, else the largest decimal one, else
/// the bare number.
pub fn format_value(value: i64) -> String {
    if value == 0 {
        return "0".to_string();
    }
    const BINARY: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    for (suffix, shift) in BINARY {
        let unit = 1i64 << shift;
        if value % unit == 0 {
            return format!("{}{suffix}", value / unit);
        }
    }
    const DECIMAL: [(&str, u32); 6] = [
        ("E", 18),
        ("P", 15),
        ("T", 12),
        ("G", 9),
        ("M", 6),
        ("k", 3),
    ];
    for (suffix, exponent) in DECIMAL {
        let unit = 10i64.pow(exponent);
        if value % unit == 0 {
            return format!("{}{suffix}", value / unit);
        }
    }
    value.to_string()
}

/// Human-friendly memory: GiB with up to two decimals (`"7.25Gi"`), for tables only.
pub fn display_bytes(bytes: i64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b.abs() >= GIB {
        trim_decimals(b / GIB, "Gi")
    } else {
        trim_decimals(b / MIB, "Mi")
    }
}

/// Human-friendly CPU: cores with up to three decimals (`"1.9"`), for tables only.
pub fn display_cores(milli: i64) -> String {
    trim_decimals(milli as f64 / 1000.0, "")
}

fn trim_decimals(v: f64, unit: &str) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{unit}")
}

/// Rounds a reported figure (dollars, fractions) to `decimals` places, never to `-0.0`:
/// a saving of -0.001 $/hour is reported as 0, not as a negative zero that prints `-0.00`.
pub fn round_to(x: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    // Adding +0.0 turns -0.0 into +0.0 and leaves every other value unchanged.
    (x * scale).round() / scale + 0.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn kubernetes_documented_examples_parse_to_their_values() {
        assert_eq!(parse_milli("1.5"), Ok(1500));
        assert_eq!(parse_milli("100m"), Ok(100));
        assert_eq!(parse_milli("0.1"), Ok(100));
        assert_eq!(parse_value("100Mi"), Ok(100 * 1024 * 1024));
        assert_eq!(parse_value("1e3"), Ok(1000));
        assert_eq!(parse_value("1E3"), Ok(1000));
        assert_eq!(parse_value("1Gi"), Ok(1_073_741_824));
        assert_eq!(parse_value("128974848"), Ok(128_974_848));
        assert_eq!(parse_value("129e6"), Ok(129_000_000));
        assert_eq!(parse_value("129M"), Ok(129_000_000));
        assert_eq!(parse_value("123Mi"), Ok(128_974_848));
        assert_eq!(parse_value("1k"), Ok(1000));
        assert_eq!(parse_value("2Ti"), Ok(2 << 40));
        assert_eq!(parse_milli("+2"), Ok(2000));
        assert_eq!(parse_milli(".5"), Ok(500));
        assert_eq!(parse_milli("5."), Ok(5000));
        assert_eq!(parse_milli("1e-3"), Ok(1));
    }

    #[test]
    fn cpu_rounds_up_to_the_millicore() {
        assert_eq!(parse_milli("0.1m"), Ok(1));
        assert_eq!(parse_milli("1.0001"), Ok(1001));
        assert_eq!(parse_milli("0.0000000001"), Ok(1));
        assert_eq!(parse_value("0.5"), Ok(1));
        assert_eq!(parse_value("1500m"), Ok(2));
        assert_eq!(parse_milli("0"), Ok(0));
        assert_eq!(parse_milli("-1.5m"), Ok(-1));
    }

    #[test]
    fn garbage_is_rejected_with_the_input_quoted() {
        for bad in [
            "", " ", "abc", "1.2.3", "1Qi", "1 Gi", "--1", "1e", "1e+", "Gi", ".", "1ki", "1mi",
            "0x10", "1e3.5", "∞",
        ] {
            let err = parse_value(bad).expect_err(bad);
            assert!(
                err.to_string().contains(&format!("{bad:?}")),
                "{err} should quote {bad:?}"
            );
        }
    }

    #[test]
    fn values_beyond_sixty_four_bits_are_out_of_range() {
        assert!(matches!(
            parse_value("16Ei"),
            Err(QuantityError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_milli("1e100"),
            Err(QuantityError::OutOfRange { .. })
        ));
    }

    #[test]
    fn canonical_forms_use_the_largest_exact_suffix() {
        assert_eq!(format_milli(1500), "1500m");
        assert_eq!(format_milli(2000), "2");
        assert_eq!(format_value(1 << 30), "1Gi");
        assert_eq!(format_value(1536 << 20), "1536Mi");
        assert_eq!(format_value(129_000_000), "129M");
        assert_eq!(format_value(1001), "1001");
        assert_eq!(display_bytes(7 << 30), "7Gi");
        assert_eq!(display_cores(1900), "1.9");
    }

    proptest! {
        #[test]
        fn formatted_millis_parse_back_to_themselves(m in -1_000_000_000_000i64..1_000_000_000_000) {
            prop_assert_eq!(parse_milli(&format_milli(m)), Ok(m));
        }

        #[test]
        fn formatted_values_parse_back_to_themselves(v in 0i64..i64::MAX) {
            prop_assert_eq!(parse_value(&format_value(v)), Ok(v));
        }

        #[test]
        fn binary_suffixes_multiply_exactly(n in 0i64..1_000_000, k in 0usize..4) {
            let (suffix, shift) = [("Ki", 10), ("Mi", 20), ("Gi", 30), ("Ti", 40)][k];
            prop_assert_eq!(parse_value(&format!("{n}{suffix}")), Ok(n << shift));
        }

        #[test]
        fn decimal_fractions_round_up(whole in 0i64..1_000_000, frac in 0u32..10_000) {
            // "<whole>.<4 digits>" in cores is whole*1000 + ceil(frac/10) millicores.
            let input = format!("{whole}.{frac:04}");
            prop_assert_eq!(parse_milli(&input), Ok(whole * 1000 + i64::from(frac.div_ceil(10))));
        }

        #[test]
        fn arbitrary_strings_never_panic(s in "\\PC{0,12}") {
            let _ = parse_value(&s);
            let _ = parse_milli(&s);
        }
    }

    #[test]
    fn rounding_a_tiny_negative_figure_gives_a_positive_zero() {
        for x in [-0.0, -0.001, -0.004_999, -1e-300] {
            let r = round_to(x, 2);
            assert!(r == 0.0 && r.is_sign_positive(), "{x} -> {r:?}");
            assert_eq!(format!("{r:+.2}"), "+0.00");
            assert_eq!(serde_json::to_string(&r).expect("json"), "0.0");
        }
        assert_eq!(round_to(-0.006, 2), -0.01);
        assert_eq!(round_to(12.3456, 2), 12.35);
    }

    #[test]
    fn nano_and_micro_suffixes_are_accepted_and_round_up() {
        assert_eq!(parse_milli("1n"), Ok(1));
        assert_eq!(parse_milli("250000000n"), Ok(250));
        assert_eq!(parse_milli("1500u"), Ok(2));
        assert_eq!(parse_value("1n"), Ok(1));
        assert_eq!(parse_value("0n"), Ok(0));
    }
}
