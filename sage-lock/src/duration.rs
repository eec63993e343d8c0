//! Duration text: `"150ms"`, `"2s"`, `"1m"`, `"1h"` and combinations such as `"1m30s"`.
//!
//! One grammar for `#[locked]` (checked when the macro expands) and for settings read at run time
//! (profiles, environment variables). A proc-macro crate cannot share run-time code with the
//! crate that re-exports it, so this file exists twice, identical: `sage-lock-macros/src/
//! duration.rs` and `sage-lock/src/duration.rs`; the test `duration_grammar` keeps them equal.

use std::fmt;

/// The units a duration literal may use, largest first (components must appear in this order).
const UNITS: [(&str, u64); 4] = [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)];

/// Why a duration literal was rejected. `Display` gives the whole message, including the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DurationError {
    Empty,
    Negative,
    MissingUnit {
        number: String,
    },
    MissingNumber {
        unit: String,
    },
    NotADuration {
        word: String,
    },
    Fraction,
    UnknownUnit {
        unit: String,
        suggestion: Option<&'static str>,
    },
    SubMillisecond {
        unit: String,
    },
    OutOfOrder {
        unit: String,
    },
    Repeated {
        unit: String,
    },
    Unexpected {
        ch: char,
    },
    Overflow,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const FORMS: &str = "a duration is a number with a unit (`ms`, `s`, `m`, `h`), \
                             or a combination like \"1m30s\"";
        match self {
            Self::Empty => write!(f, "empty duration: {FORMS}"),
            Self::Negative => write!(f, "durations cannot be negative: {FORMS}"),
            Self::MissingUnit { number } => write!(
                f,
                "missing unit after `{number}`: write \"{number}s\" for seconds or \"{number}ms\" \
                 for milliseconds"
            ),
            Self::MissingNumber { unit } => {
                write!(f, "missing number before `{unit}`: write e.g. \"2{unit}\"")
            }
            Self::NotADuration { word } => write!(f, "`{word}` is not a duration: {FORMS}"),
            Self::Fraction => write!(
                f,
                "fractional durations are not supported: write \"1s500ms\" or \"1500ms\" \
                 instead of \"1.5s\""
            ),
            Self::UnknownUnit {
                unit,
                suggestion: Some(good),
            } => write!(
                f,
                "unknown duration unit `{unit}`: did you mean `{good}`? \
                 The units are `ms`, `s`, `m` and `h`"
            ),
            Self::UnknownUnit {
                unit,
                suggestion: None,
            } => write!(
                f,
                "unknown duration unit `{unit}`: the units are `ms`, `s`, `m` and `h`"
            ),
            Self::SubMillisecond { unit } => write!(
                f,
                "`{unit}` is finer than lock timing can honour: the smallest unit is `ms`"
            ),
            Self::OutOfOrder { unit } => write!(
                f,
                "`{unit}` comes too late: write the components from largest to smallest, \
                 like \"1h30m\" or \"1m30s\""
            ),
            Self::Repeated { unit } => write!(
                f,
                "the unit `{unit}` appears twice: add the amounts up, like \"1m30s\""
            ),
            Self::Unexpected { ch } => write!(f, "unexpected `{ch}` in duration: {FORMS}"),
            Self::Overflow => write!(f, "duration is too large"),
        }
    }
}

/// Suggests the right unit for common spellings.
fn suggest_unit(unit: &str) -> Option<&'static str> {
    match unit.to_ascii_lowercase().as_str() {
        "ms" | "msec" | "msecs" | "millis" | "milli" | "millisecond" | "milliseconds" => Some("ms"),
        "s" | "sec" | "secs" | "second" | "seconds" => Some("s"),
        "m" | "min" | "mins" | "minute" | "minutes" => Some("m"),
        "h" | "hr" | "hrs" | "hour" | "hours" => Some("h"),
        _ => None,
    }
}

/// Parses a duration literal into milliseconds.
pub(crate) fn parse_millis(text: &str) -> Result<u64, DurationError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    if text.starts_with('-') {
        return Err(DurationError::Negative);
    }
    let mut total: u64 = 0;
    // Index into UNITS of the last unit seen: later components must use a smaller unit.
    let mut last_unit: Option<usize> = None;
    let mut rest = text;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let digits_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (number, after_number) = rest.split_at(digits_len);
        if after_number.starts_with(['.', ',']) && !number.is_empty() {
            return Err(DurationError::Fraction);
        }
        let after_number = after_number.trim_start();
        let unit_len = after_number
            .find(|c: char| !c.is_alphabetic() && c != 'µ')
            .unwrap_or(after_number.len());
        let (unit, after_unit) = after_number.split_at(unit_len);
        if number.is_empty() {
            if unit.is_empty() {
                let ch = after_number.chars().next().unwrap_or(' ');
                return Err(DurationError::Unexpected { ch });
            }
            // A unit alone ("s", "sec") lacks its number; any other word is no duration.
            return Err(match suggest_unit(unit) {
                Some(known) => DurationError::MissingNumber {
                    unit: known.to_owned(),
                },
                None => DurationError::NotADuration {
                    word: unit.to_owned(),
                },
            });
        }
        if unit.is_empty() {
            return Err(DurationError::MissingUnit {
                number: number.to_owned(),
            });
        }
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            if matches!(unit, "us" | "µs" | "ns" | "micros" | "nanos") {
                return Err(DurationError::SubMillisecond {
                    unit: unit.to_owned(),
                });
            }
            return Err(DurationError::UnknownUnit {
                unit: unit.to_owned(),
                suggestion: suggest_unit(unit),
            });
        };
        match last_unit {
            Some(last) if last == index => {
                return Err(DurationError::Repeated {
                    unit: unit.to_owned(),
                });
            }
            Some(last) if last > index => {
                return Err(DurationError::OutOfOrder {
                    unit: unit.to_owned(),
                });
            }
            _ => {}
        }
        last_unit = Some(index);
        let amount: u64 = number.parse().map_err(|_| DurationError::Overflow)?;
        let millis = amount
            .checked_mul(UNITS[index].1)
            .ok_or(DurationError::Overflow)?;
        total = total.checked_add(millis).ok_or(DurationError::Overflow)?;
        rest = after_unit;
    }
    Ok(total)
}

/// Renders milliseconds the way a user would write them, for messages: `1500` → `1s500ms`.
pub(crate) fn format_millis(millis: u64) -> String {
    if millis == 0 {
        return "0ms".to_owned();
    }
    let mut out = String::new();
    let mut rest = millis;
    for (name, size) in UNITS {
        let amount = rest / size;
        if amount > 0 {
            out.push_str(&amount.to_string());
            out.push_str(name);
            rest %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(parse_millis("150ms"), Ok(150));
        assert_eq!(parse_millis("2s"), Ok(2_000));
        assert_eq!(parse_millis("1m"), Ok(60_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("1m30s"), Ok(90_000));
        assert_eq!(parse_millis("1h 2m 3s 4ms"), Ok(3_723_004));
        assert_eq!(parse_millis("0s"), Ok(0));
    }

    #[test]
    fn rejects_bad_forms_with_a_fix() {
        assert_eq!(
            parse_millis("30"),
            Err(DurationError::MissingUnit {
                number: "30".into()
            })
        );
        assert_eq!(
            parse_millis("2sec"),
            Err(DurationError::UnknownUnit {
                unit: "sec".into(),
                suggestion: Some("s")
            })
        );
        assert_eq!(
            parse_millis("2d"),
            Err(DurationError::UnknownUnit {
                unit: "d".into(),
                suggestion: None
            })
        );
        assert_eq!(parse_millis("1.5s"), Err(DurationError::Fraction));
        assert_eq!(parse_millis(""), Err(DurationError::Empty));
        assert_eq!(parse_millis("-1s"), Err(DurationError::Negative));
        assert_eq!(
            parse_millis("30s1m"),
            Err(DurationError::OutOfOrder { unit: "m".into() })
        );
        assert_eq!(
            parse_millis("1s1s"),
            Err(DurationError::Repeated { unit: "s".into() })
        );
        assert_eq!(
            parse_millis("s"),
            Err(DurationError::MissingNumber { unit: "s".into() })
        );
        assert_eq!(
            parse_millis("10us"),
            Err(DurationError::SubMillisecond { unit: "us".into() })
        );
        assert_eq!(
            parse_millis("99999999999999999999h"),
            Err(DurationError::Overflow)
        );
        assert_eq!(
            parse_millis("5124095576030432h"),
            Err(DurationError::Overflow)
        );
        assert_eq!(
            parse_millis("1s+"),
            Err(DurationError::Unexpected { ch: '+' })
        );
    }

    #[test]
    fn a_word_is_not_taken_for_a_unit() {
        for word in ["soon", "garbage", "bad"] {
            let message = parse_millis(word).map_or_else(|e| e.to_string(), |ms| ms.to_string());
            assert!(
                message.starts_with(&format!("`{word}` is not a duration: ")),
                "{message}"
            );
        }
        let message = parse_millis("sec").map_or_else(|e| e.to_string(), |ms| ms.to_string());
        assert!(message.contains("\"2s\""), "{message}");
    }

    #[test]
    fn formats_millis_for_messages() {
        assert_eq!(format_millis(0), "0ms");
        assert_eq!(format_millis(10), "10ms");
        assert_eq!(format_millis(1_500), "1s500ms");
        assert_eq!(format_millis(3_723_004), "1h2m3s4ms");
    }
}
