//! Durations written the way operators write them (`500ms`, `5s`, `1h`).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const fn from_secs(seconds: u64) -> Self {
        Self(Duration::from_secs(seconds))
    }

    pub fn as_millis_u64(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// Units in the order the published pattern tries them (longest spelling first), as humantime reads them.
const UNITS: &[&str] = &[
    "nanos", "nsec", "ns", "usec", "us", "µs", "millis", "msec", "ms", "seconds", "second", "secs", "sec", "s",
    "minutes", "minute", "mins", "min", "m", "hours", "hour", "hrs", "hr", "h", "days", "day", "d", "weeks", "week",
    "wks", "wk", "w", "months", "month", "M", "years", "year", "yrs", "yr", "y",
];

/// The longest duration text accepted; far more than any real one, short enough to keep parsing trivial.
pub const MAX_DURATION_LEN: usize = 64;

/// The published grammar of a duration: one or more `<number><unit>` spans, spaces allowed between them
/// (`500ms`, `1h 30m`, `1.5s`, and everything `humantime::format_duration` prints, so an export re-imports).
/// `HumanDuration` accepts exactly the texts this matches (up to `MAX_DURATION_LEN`) that do not overflow.
pub fn duration_pattern() -> String {
    let span = format!("[0-9]+(\\.[0-9]+)? *({})", UNITS.join("|"));
    format!("^ *{span}( *{span})* *$")
}

/// Hand-written twin of `duration_pattern`, so parsing needs no regex engine; the tests check they agree.
fn well_formed(text: &str) -> bool {
    let mut rest = text.trim_start_matches(' ');
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        if let Some(fraction) = rest.strip_prefix('.') {
            let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return false;
            }
            rest = &fraction[digits..];
        }
        rest = rest.trim_start_matches(' ');
        let letters = rest.find(|c: char| !(c.is_ascii_alphabetic() || c == 'µ')).unwrap_or(rest.len());
        if !UNITS.contains(&&rest[..letters]) {
            return false;
        }
        rest = rest[letters..].trim_start_matches(' ');
    }
    true
}

impl std::str::FromStr for HumanDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() > MAX_DURATION_LEN || !well_formed(text) {
            return Err(format!("`{}` is not a duration like 500ms, 5s, 1m, 1h or 1d", text.escape_debug()));
        }
        humantime::parse_duration(text.trim())
            .map(Self)
            .map_err(|e| format!("`{text}` is not a duration this gateway can hold: {e}"))
    }
}

/// Published as the `Duration` component: a string with the pattern that `FromStr` enforces.
impl utoipa::PartialSchema for HumanDuration {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("A duration: numbers with units (ms, s, m, h, d, ...), e.g. `500ms`, `5s`, `1h 30m`."))
            .pattern(Some(duration_pattern()))
            .min_length(Some(2))
            .max_length(Some(MAX_DURATION_LEN))
            .examples(["5s"])
            .into()
    }
}

impl utoipa::ToSchema for HumanDuration {
    fn name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_operator_durations() {
        for (text, millis, printed) in
            [("500ms", 500, "500ms"), ("5s", 5_000, "5s"), ("1h", 3_600_000, "1h"), ("1d", 86_400_000, "1day")]
        {
            let parsed: HumanDuration = text.parse().unwrap_or(HumanDuration::from_secs(0));
            assert_eq!(parsed.as_millis_u64(), millis, "{text}");
            assert_eq!(parsed.to_string(), printed);
        }
        assert!("soon".parse::<HumanDuration>().is_err());
    }

    #[test]
    fn the_published_pattern_and_the_parser_agree() {
        let pattern =
            jsonschema::validator_for(&serde_json::json!({ "type": "string", "pattern": duration_pattern() }))
                .unwrap_or_else(|e| panic!("pattern: {e}"));
        for text in [
            "500ms",
            "5s",
            "1h 30m",
            "1h30m",
            " 2days 3h ",
            "1.5s",
            "1year 2months",
            "3µs",
            "10 s",
            "1day",
            "",
            "s",
            "5",
            "5 parsecs",
            "1.s",
            "-1s",
            "1s-",
            "1,5s",
            "5S",
            "1h  ",
            "\u{0}5s",
            "5s\n",
        ] {
            let parsed = text.parse::<HumanDuration>().is_ok();
            assert_eq!(pattern.is_valid(&serde_json::json!(text)), parsed, "{text:?}");
        }
        // Whatever is printed reads back.
        for millis in [1, 999, 1_000, 61_000, 3_600_000, 90_061_001, 400_000_000_000] {
            let printed = HumanDuration(Duration::from_millis(millis)).to_string();
            assert!(printed.parse::<HumanDuration>().is_ok(), "{printed}");
        }
    }
}
