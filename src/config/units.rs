//! Durations and sizes as operators write them: always with a unit.
//!
//! A bare `30` is refused: is it seconds or milliseconds, bytes or MiB? The unit
//! makes a config readable and a typo visible.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

// === Size ===

/// A byte count written with a unit: `512B`, `64KiB`, `8MiB`, `1GiB`, `10MB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl Size {
    pub fn bytes(self) -> u64 {
        self.0
    }

    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl FromStr for Size {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let s = text.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("size `{text}` needs a unit, like \"8MiB\" or \"512KiB\""))?;
        let (number, unit) = s.split_at(split);
        let unit = unit.trim();
        let multiplier: u64 = match unit {
            "B" => 1,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            _ => {
                return Err(format!(
                    "size `{text}` has an unknown unit `{unit}` (use B, KB, MB, GB, KiB, MiB, GiB)"
                ))
            }
        };
        let value: f64 = number
            .parse()
            .map_err(|_| format!("size `{text}` does not start with a number"))?;
        let bytes = value * multiplier as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(format!("size `{text}` is out of range"));
        }
        Ok(Size(bytes.round() as u64))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (name, size) in UNITS {
            if self.0 >= size && self.0 % size == 0 {
                return write!(f, "{}{name}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = UnitText::deserialize(deserializer)?;
        text.0.parse().map_err(serde::de::Error::custom)
    }
}

// === Span (a duration) ===

/// A duration written with a unit: `500ms`, `1s`, `60s`, `5m`, `1h 30m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span(pub Duration);

impl Span {
    pub fn get(self) -> Duration {
        self.0
    }
}

impl FromStr for Span {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let s = text.trim();
        if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return Err(format!(
                "duration `{text}` needs a unit, like \"{s}s\" or \"{s}ms\""
            ));
        }
        humantime::parse_duration(s)
            .map(Span)
            .map_err(|e| format!("duration `{text}` is not understood ({e}); write it like \"500ms\", \"30s\" or \"5m\""))
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = UnitText::deserialize(deserializer)?;
        text.0.parse().map_err(serde::de::Error::custom)
    }
}

// === Share (a percentage) ===

/// A share of something written as a percentage: `5%`, `0%`, `12.5%`. Kept in parts per
/// million, so it compares and prints exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Share(u32);

impl Share {
    const WHOLE: u32 = 1_000_000;

    /// This share of `whole`, rounded down.
    pub fn of(self, whole: u64) -> u64 {
        u64::try_from(u128::from(whole) * u128::from(self.0) / u128::from(Self::WHOLE))
            .unwrap_or(u64::MAX)
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    pub const fn percent(p: u32) -> Self {
        Self(p * (Self::WHOLE / 100))
    }
}

impl FromStr for Share {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let s = text.trim();
        let Some(number) = s.strip_suffix('%') else {
            return Err(format!(
                "share `{text}` needs a %, like \"5%\" (a share of the whole, 0% to 100%)"
            ));
        };
        let value: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("share `{text}` does not start with a number"))?;
        if !(0.0..=100.0).contains(&value) {
            return Err(format!("share `{text}` is not between 0% and 100%"));
        }
        Ok(Share(
            (value * f64::from(Self::WHOLE) / 100.0).round() as u32
        ))
    }
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let percent = f64::from(self.0) * 100.0 / f64::from(Self::WHOLE);
        write!(f, "{percent}%")
    }
}

impl<'de> Deserialize<'de> for Share {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = UnitText::deserialize(deserializer)?;
        text.0.parse().map_err(serde::de::Error::custom)
    }
}

/// The text of a value that must carry a unit. A bare number is taken too, only to
/// give the "needs a unit" error rather than serde's "expected a string".
struct UnitText(String);

impl<'de> Deserialize<'de> for UnitText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = UnitText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string with a unit, like \"8MiB\" or \"30s\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<UnitText, E> {
                Ok(UnitText(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<UnitText, E> {
                Ok(UnitText(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<UnitText, E> {
                Ok(UnitText(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<UnitText, E> {
                Ok(UnitText(v.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!("8MiB".parse::<Size>(), Ok(Size(8 << 20)));
        assert_eq!("1GiB".parse::<Size>(), Ok(Size(1 << 30)));
        assert_eq!("512B".parse::<Size>(), Ok(Size(512)));
        assert_eq!("10MB".parse::<Size>(), Ok(Size(10_000_000)));
        assert_eq!("1.5KiB".parse::<Size>(), Ok(Size(1536)));
        assert_eq!("4 KiB".parse::<Size>(), Ok(Size(4096)));
        assert!("1024".parse::<Size>().unwrap_err().contains("needs a unit"));
        assert!("8Mb".parse::<Size>().unwrap_err().contains("unknown unit"));
        assert!("MiB".parse::<Size>().is_err());
        assert_eq!(Size(8 << 20).to_string(), "8MiB");
        assert_eq!(Size(1000).to_string(), "1000B");
    }

    #[test]
    fn shares() {
        assert_eq!("5%".parse::<Share>(), Ok(Share::percent(5)));
        assert_eq!(" 12.5 % ".parse::<Share>().map(|s| s.of(1000)), Ok(125));
        assert_eq!("0%".parse::<Share>().map(Share::is_zero), Ok(true));
        assert_eq!(Share::percent(100).of(u64::MAX), u64::MAX);
        assert_eq!(Share::percent(5).of(32 << 20), 1_677_721);
        assert!("5".parse::<Share>().unwrap_err().contains("needs a %"));
        assert!("101%".parse::<Share>().unwrap_err().contains("between"));
        assert!("-1%".parse::<Share>().is_err());
        assert_eq!(Share::percent(5).to_string(), "5%");
        assert_eq!(
            "12.5%".parse::<Share>().map(|s| s.to_string()),
            Ok("12.5%".into())
        );
    }

    #[test]
    fn spans() {
        assert_eq!("60s".parse::<Span>(), Ok(Span(Duration::from_secs(60))));
        assert_eq!(
            "500ms".parse::<Span>(),
            Ok(Span(Duration::from_millis(500)))
        );
        assert_eq!("5m".parse::<Span>(), Ok(Span(Duration::from_secs(300))));
        assert!("30".parse::<Span>().unwrap_err().contains("needs a unit"));
        assert!("soon".parse::<Span>().is_err());
    }
}
