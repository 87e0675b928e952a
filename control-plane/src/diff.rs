//! What a config import would change, per kind and name: the answer of
//! `PUT /v1/config?dry_run=true` and `sluice apply --dry-run`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::model::{Config, Kind};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KindDiff {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

/// Per collection (`apis`, `upstreams`, ...), the names added, changed and removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ConfigDiff {
    #[serde(flatten)]
    pub kinds: BTreeMap<String, KindDiff>,
}

/// How many names a one-line summary lists before it only counts.
const SUMMARY_NAMES: usize = 6;

impl ConfigDiff {
    pub fn is_empty(&self) -> bool {
        self.kinds.values().all(|d| d.added.is_empty() && d.changed.is_empty() && d.removed.is_empty())
    }

    /// One line for the history: `+apis/shop ~upstreams/backend -consumers/bob`,
    /// the first few names then a count of the rest.
    pub fn summary(&self) -> String {
        let changes: Vec<String> = self
            .kinds
            .iter()
            .flat_map(|(kind, d)| {
                let names = |sign: char, names: &[String]| {
                    names.iter().map(move |name| format!("{sign}{kind}/{name}")).collect::<Vec<_>>()
                };
                [names('+', &d.added), names('~', &d.changed), names('-', &d.removed)].concat()
            })
            .collect();
        if changes.is_empty() {
            return "no change".into();
        }
        let mut line = changes[..changes.len().min(SUMMARY_NAMES)].join(" ");
        if changes.len() > SUMMARY_NAMES {
            line.push_str(&format!(" and {} more", changes.len() - SUMMARY_NAMES));
        }
        line
    }
}

/// Compares resources by name and by their stored JSON form.
pub fn diff_config(old: &Config, new: &Config) -> ConfigDiff {
    let mut diff = ConfigDiff::default();
    for kind in Kind::ALL {
        let before = named_values(old, kind);
        let after = named_values(new, kind);
        let mut d = KindDiff::default();
        for (name, value) in &after {
            match before.get(name) {
                None => d.added.push(name.clone()),
                Some(old) if old != value => d.changed.push(name.clone()),
                Some(_) => {}
            }
        }
        d.removed = before.keys().filter(|name| !after.contains_key(*name)).cloned().collect();
        diff.kinds.insert(kind.collection().to_string(), d);
    }
    diff
}

fn named_values(config: &Config, kind: Kind) -> BTreeMap<String, serde_json::Value> {
    fn collect<T: Serialize>(items: &[T], name: impl Fn(&T) -> &str) -> BTreeMap<String, serde_json::Value> {
        items
            .iter()
            .map(|item| (name(item).to_string(), serde_json::to_value(item).unwrap_or(serde_json::Value::Null)))
            .collect()
    }
    match kind {
        Kind::Api => collect(&config.apis, |a| &a.name),
        Kind::Upstream => collect(&config.upstreams, |u| &u.name),
        Kind::Consumer => collect(&config.consumers, |c| &c.username),
        Kind::Spec => collect(&config.specs, |s| &s.name),
        Kind::Certificate => collect(&config.certificates, |c| &c.name),
    }
}
