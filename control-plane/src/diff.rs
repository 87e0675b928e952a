//! What changed between two configurations, per kind and name: the one
//! comparison behind both the rows a store write touches (`store::resources`)
//! and the answer of `PUT /v1/config?dry_run=true` and `sluice apply --dry-run`.
//! Resources are compared by value in their stored form.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::model::{Api, Certificate, Config, Consumer, Resource, Spec, Upstream};

/// One resource that differs between the old and the new configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a, R> {
    Added(&'a R),
    Changed(&'a R),
    Removed(&'a R),
}

/// Every resource of `old` and `new` that differs (added, changed, removed),
/// new ones in `new`'s order, then removed ones in `old`'s. Both lists must be
/// sorted by name (the store keeps them so).
pub fn changes<'a, R: Resource, T: Borrow<R>>(old: &'a [T], new: &'a [T]) -> Vec<Change<'a, R>> {
    let mut changes = Vec::new();
    // Most writes change items in place, so the same position usually holds
    // the same name; otherwise search (the lists are sorted by name).
    let find = |items: &[T], at: usize, name: &str| match items.get(at) {
        Some(item) if item.borrow().name() == name => Some(at),
        _ => items.binary_search_by(|item| item.borrow().name().cmp(name)).ok(),
    };
    for (at, item) in new.iter().map(Borrow::borrow).enumerate() {
        match find(old, at, item.name()) {
            None => changes.push(Change::Added(item)),
            Some(i) if old[i].borrow() != item => changes.push(Change::Changed(item)),
            Some(_) => {}
        }
    }
    for (at, item) in old.iter().map(Borrow::borrow).enumerate() {
        if find(new, at, item.name()).is_none() {
            changes.push(Change::Removed(item));
        }
    }
    changes
}

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

/// The names added, changed and removed from `old` to `new`, whatever order
/// their lists are in.
pub fn diff_config(old: &Config, new: &Config) -> ConfigDiff {
    let mut diff = ConfigDiff::default();
    kind_diff::<Certificate>(&mut diff, old, new);
    kind_diff::<Upstream>(&mut diff, old, new);
    kind_diff::<Spec>(&mut diff, old, new);
    kind_diff::<Consumer>(&mut diff, old, new);
    kind_diff::<Api>(&mut diff, old, new);
    diff
}

fn kind_diff<R: Resource>(diff: &mut ConfigDiff, old: &Config, new: &Config) {
    let sorted = |config| {
        let mut items: Vec<&R> = R::items(config).iter().collect();
        items.sort_by(|a, b| a.name().cmp(b.name()));
        items
    };
    let (old, new) = (sorted(old), sorted(new));
    let mut names = KindDiff::default();
    for change in changes::<R, _>(&old, &new) {
        match change {
            Change::Added(item) => names.added.push(item.name().to_owned()),
            Change::Changed(item) => names.changed.push(item.name().to_owned()),
            Change::Removed(item) => names.removed.push(item.name().to_owned()),
        }
    }
    diff.kinds.insert(R::KIND.collection().to_owned(), names);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(name: &str, prefix: &str) -> Api {
        serde_json::from_value(serde_json::json!({ "name": name, "path_prefix": prefix, "upstream": "u" })).unwrap()
    }

    #[test]
    fn names_what_changed_in_any_order() {
        let old = Config { apis: vec![api("c", "/c"), api("a", "/a"), api("b", "/b")], ..Config::default() };
        let new = Config { apis: vec![api("d", "/d"), api("b", "/b2"), api("a", "/a")], ..Config::default() };
        let diff = diff_config(&old, &new);
        let apis = &diff.kinds["apis"];
        assert_eq!(
            (apis.added.as_slice(), apis.changed.as_slice(), apis.removed.as_slice()),
            (&["d".to_owned()][..], &["b".to_owned()][..], &["c".to_owned()][..])
        );
        assert_eq!(diff.kinds.len(), 5);
        assert!(!diff.is_empty());
        assert!(diff_config(&new, &new).is_empty());
    }
}
