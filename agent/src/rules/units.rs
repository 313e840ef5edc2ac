//! Human units of the rules file and the command line: durations (`500us`, `2ms`, `1.5s`)
//! and sizes (`4MiB`, `4096`, `2GB`). Strings in, [`Duration`] / byte counts out, and back
//! (`format_duration`, `format_size`) for messages and summaries.

use std::time::Duration;

use super::error::snippet;

/// A duration or size string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// Not a number followed by a duration unit.
    #[error(
        "invalid duration `{input}`: expected a number and a unit (ns, us, ms, s, m or min, h), \
         e.g. 500us, 2ms, 1.5s, or 0"
    )]
    Duration { input: String },
    /// Finer than one nanosecond, e.g. `1.5ns`.
    #[error("invalid duration `{input}`: not a whole number of nanoseconds")]
    DurationPrecision { input: String },
    /// More than `u64::MAX` nanoseconds (about 584 years).
    #[error("duration `{input}` is too large")]
    DurationRange { input: String },
    /// Not a byte count or a number followed by a size unit.
    #[error(
        "invalid size `{input}`: expected a byte count (4096) or a number and a unit: \
         KiB, MiB, GiB, TiB (or K, M, G, T: powers of 1024) or KB, MB, GB, TB (powers of 1000), \
         e.g. 4MiB"
    )]
    Size { input: String },
    /// A fraction of a byte, e.g. `1.5` or `0.3KiB`.
    #[error("invalid size `{input}`: not a whole number of bytes")]
    SizeFraction { input: String },
    /// More than `u64::MAX` bytes.
    #[error("size `{input}` is too large")]
    SizeRange { input: String },
}

const NS_PER_US: u128 = 1_000;
const NS_PER_MS: u128 = 1_000_000;
const NS_PER_S: u128 = 1_000_000_000;

/// Duration units, longest spelling first so that `ms` is not read as `m` + `s`.
const DURATION_UNITS: &[(&str, u128)] = &[
    ("min", 60 * NS_PER_S),
    ("ns", 1),
    ("us", NS_PER_US),
    ("\u{b5}s", NS_PER_US),
    ("\u{3bc}s", NS_PER_US),
    ("ms", NS_PER_MS),
    ("s", NS_PER_S),
    ("m", 60 * NS_PER_S),
    ("h", 3600 * NS_PER_S),
];

const KIB: u128 = 1 << 10;
const MIB: u128 = 1 << 20;
const GIB: u128 = 1 << 30;
const TIB: u128 = 1 << 40;

/// Size units, matched case-insensitively, longest spelling first.
const SIZE_UNITS: &[(&str, u128)] = &[
    ("kib", KIB),
    ("mib", MIB),
    ("gib", GIB),
    ("tib", TIB),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("k", KIB),
    ("m", MIB),
    ("g", GIB),
    ("t", TIB),
    ("b", 1),
];

/// A decimal number split into its digits: `12.345` is `whole = "12"`, `fraction = "345"`.
struct Decimal<'a> {
    whole: &'a str,
    fraction: &'a str,
}

impl<'a> Decimal<'a> {
    /// Splits `text` into a leading decimal number and the rest (the unit), or `None` when
    /// `text` does not start with a digit.
    fn split(text: &'a str) -> Option<(Self, &'a str)> {
        let whole_len = text.bytes().take_while(u8::is_ascii_digit).count();
        if whole_len == 0 {
            return None;
        }
        let (whole, rest) = text.split_at(whole_len);
        let Some(after_dot) = rest.strip_prefix('.') else {
            return Some((
                Decimal {
                    whole,
                    fraction: "",
                },
                rest,
            ));
        };
        let fraction_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
        if fraction_len == 0 {
            return None;
        }
        let (fraction, unit) = after_dot.split_at(fraction_len);
        Some((Decimal { whole, fraction }, unit))
    }

    /// `self × scale`, or `Err(true)` when it overflows and `Err(false)` when the result is
    /// not a whole number.
    fn scale(&self, scale: u128) -> Result<u128, bool> {
        let whole: u128 = self.whole.parse().map_err(|_| true)?;
        let mut total = whole.checked_mul(scale).ok_or(true)?;
        let fraction = self.fraction.trim_end_matches('0');
        if !fraction.is_empty() {
            // More than 38 digits cannot be exact for any of our scales (at most 2^42).
            let digits = u32::try_from(fraction.len()).map_err(|_| false)?;
            let divisor = 10u128.checked_pow(digits).ok_or(false)?;
            let numerator: u128 = fraction.parse().map_err(|_| false)?;
            let scaled = numerator.checked_mul(scale).ok_or(false)?;
            if scaled % divisor != 0 {
                return Err(false);
            }
            total = total.checked_add(scaled / divisor).ok_or(true)?;
        }
        Ok(total)
    }
}

/// Parses a duration: a number (optionally with a fraction) and a unit, `ns`, `us` (or `µs`),
/// `ms`, `s`, `m` or `min`, `h`; or a bare `0`. Examples: `500us`, `2ms`, `1.5s`, `0ms`.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let input = || snippet(text);
    let trimmed = text.trim();
    let (number, unit) =
        Decimal::split(trimmed).ok_or_else(|| UnitError::Duration { input: input() })?;
    let unit = unit.trim_start();
    let scale = if unit.is_empty() {
        // A bare number is only unambiguous when it is zero.
        if number.whole.bytes().all(|b| b == b'0') && number.fraction.bytes().all(|b| b == b'0') {
            return Ok(Duration::ZERO);
        }
        return Err(UnitError::Duration { input: input() });
    } else {
        DURATION_UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|&(_, scale)| scale)
            .ok_or_else(|| UnitError::Duration { input: input() })?
    };
    let nanos = number.scale(scale).map_err(|overflow| {
        if overflow {
            UnitError::DurationRange { input: input() }
        } else {
            UnitError::DurationPrecision { input: input() }
        }
    })?;
    let nanos = u64::try_from(nanos).map_err(|_| UnitError::DurationRange { input: input() })?;
    Ok(Duration::from_nanos(nanos))
}

/// Parses a size in bytes: a plain byte count (`4096`), or a number and a unit, binary
/// `KiB`/`MiB`/`GiB`/`TiB` (also `K`/`M`/`G`/`T`, as dd reads them) or decimal
/// `KB`/`MB`/`GB`/`TB`; units are case-insensitive and an optional `B` may follow a count.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let input = || snippet(text);
    let trimmed = text.trim();
    let (number, unit) =
        Decimal::split(trimmed).ok_or_else(|| UnitError::Size { input: input() })?;
    let unit = unit.trim_start();
    let scale = if unit.is_empty() {
        1
    } else {
        SIZE_UNITS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(unit))
            .map(|&(_, scale)| scale)
            .ok_or_else(|| UnitError::Size { input: input() })?
    };
    let bytes = number.scale(scale).map_err(|overflow| {
        if overflow {
            UnitError::SizeRange { input: input() }
        } else {
            UnitError::SizeFraction { input: input() }
        }
    })?;
    u64::try_from(bytes).map_err(|_| UnitError::SizeRange { input: input() })
}

/// The shortest exact form of `duration` that [`parse_duration`] reads back: `0`, `250ns`,
/// `500us`, `1.5ms`, `2s`, `5min`, `1h`.
pub fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0".to_owned();
    }
    for (unit, scale) in [("h", 3600 * NS_PER_S), ("min", 60 * NS_PER_S)] {
        if nanos.is_multiple_of(scale) {
            return format!("{}{unit}", nanos / scale);
        }
    }
    // Largest unit not above the value, with up to three decimals when they are exact.
    for (unit, scale) in [("s", NS_PER_S), ("ms", NS_PER_MS), ("us", NS_PER_US)] {
        if nanos >= scale && (nanos * 1000).is_multiple_of(scale) {
            let thousandths = nanos * 1000 / scale;
            let (whole, fraction) = (thousandths / 1000, thousandths % 1000);
            if fraction == 0 {
                return format!("{whole}{unit}");
            }
            let digits = format!("{fraction:03}");
            return format!("{whole}.{}{unit}", digits.trim_end_matches('0'));
        }
    }
    format!("{nanos}ns")
}

/// The shortest exact binary form of `bytes`: `4MiB`, `512KiB`, or a plain count (`3000`).
pub fn format_size(bytes: u64) -> String {
    let value = u128::from(bytes);
    if value != 0 {
        for (unit, scale) in [("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)] {
            if value % scale == 0 {
                return format!("{}{unit}", value / scale);
            }
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn durations_in_every_unit() {
        let cases = [
            ("500us", Duration::from_micros(500)),
            ("500\u{b5}s", Duration::from_micros(500)),
            ("2ms", ms(2)),
            ("1.5s", ms(1500)),
            ("0.25s", ms(250)),
            ("1.5ms", Duration::from_micros(1500)),
            ("10s", Duration::from_secs(10)),
            ("250ns", Duration::from_nanos(250)),
            ("2m", Duration::from_mins(2)),
            ("1.5min", Duration::from_secs(90)),
            ("1h", Duration::from_hours(1)),
            ("0", Duration::ZERO),
            ("0ms", Duration::ZERO),
            ("0.0", Duration::ZERO),
            (" 5 ms ", ms(5)),
            ("1.000s", ms(1000)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "parsing {text:?}");
        }
    }

    #[test]
    fn bad_durations_say_what_is_accepted() {
        for text in [
            "", "ms", "5", "1.5", "5 sec", "-1s", "1e3ms", ".5s", "5.s", "1,5s", "2MS",
        ] {
            let err = parse_duration(text).expect_err(text);
            assert!(
                matches!(err, UnitError::Duration { .. }),
                "{text:?} gave {err:?}"
            );
            assert!(err.to_string().contains("e.g. 500us, 2ms, 1.5s"), "{err}");
        }
        assert!(matches!(
            parse_duration("1.5ns"),
            Err(UnitError::DurationPrecision { .. })
        ));
        assert!(matches!(
            parse_duration("999999999999h"),
            Err(UnitError::DurationRange { .. })
        ));
        assert!(matches!(
            parse_duration("99999999999999999999999999999999999999999s"),
            Err(UnitError::DurationRange { .. })
        ));
    }

    #[test]
    fn sizes_binary_and_decimal() {
        let cases = [
            ("4096", 4096),
            ("4096B", 4096),
            ("4MiB", 4 << 20),
            ("2GiB", 2 << 30),
            ("512KiB", 512 << 10),
            ("512kib", 512 << 10),
            ("4M", 4 << 20),
            ("1TiB", 1 << 40),
            ("1KB", 1000),
            ("3MB", 3_000_000),
            ("2GB", 2_000_000_000),
            ("1.5KiB", 1536),
            ("0", 0),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Ok(want), "parsing {text:?}");
        }
    }

    #[test]
    fn bad_sizes_say_what_is_accepted() {
        for text in ["", "MiB", "4 MiBs", "four", "-1", "4Mi", "0x1000"] {
            let err = parse_size(text).expect_err(text);
            assert!(
                matches!(err, UnitError::Size { .. }),
                "{text:?} gave {err:?}"
            );
            assert!(err.to_string().contains("KiB, MiB, GiB"), "{err}");
        }
        assert!(matches!(
            parse_size("1.5"),
            Err(UnitError::SizeFraction { .. })
        ));
        assert!(parse_size("100000TiB").is_ok());
        assert!(matches!(
            parse_size("99999999TiB"),
            Err(UnitError::SizeRange { .. })
        ));
    }

    #[test]
    fn formatting_round_trips() {
        for nanos in [
            0,
            1,
            999,
            1000,
            1500,
            2_000_000,
            1_500_000_000,
            60_000_000_000,
            1_234_567,
        ] {
            let duration = Duration::from_nanos(nanos);
            let text = format_duration(duration);
            assert_eq!(parse_duration(&text), Ok(duration), "{text}");
        }
        assert_eq!(format_duration(ms(1500)), "1.5s");
        assert_eq!(format_duration(ms(50)), "50ms");
        assert_eq!(format_duration(Duration::from_hours(1)), "1h");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        for bytes in [0, 1, 4096, 3000, 4 << 20, 2 << 30, 1 << 40] {
            assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }
        assert_eq!(format_size(4 << 20), "4MiB");
        assert_eq!(format_size(2 << 30), "2GiB");
    }

    #[test]
    fn huge_input_is_shortened_in_messages() {
        let text = "9".repeat(100_000);
        let err = parse_duration(&text).expect_err("a bare number");
        assert!(err.to_string().len() < 400, "{err}");
    }
}
