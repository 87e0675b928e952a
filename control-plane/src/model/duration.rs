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

impl std::str::FromStr for HumanDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(text.trim())
            .map(Self)
            .map_err(|e| format!("`{text}` is not a duration like 500ms, 5s, 1m, 1h or 1d: {e}"))
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
}
