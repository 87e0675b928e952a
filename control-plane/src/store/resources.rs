//! The `resources` table as the store's write path sees it: loading rows into a
//! `Config`, and the diff between two configs that decides which rows a write
//! transaction upserts and deletes.

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{AnyConnection, Row};

use super::StoreError;
use crate::model::{Api, Certificate, Config, Consumer, Kind, Spec, Upstream};

/// A resource kind stored one row per named element.
trait Resource: Serialize + DeserializeOwned + PartialEq {
    const KIND: Kind;
    fn name(&self) -> &str;
}

macro_rules! resource {
    ($type:ty, $kind:expr, $field:ident) => {
        impl Resource for $type {
            const KIND: Kind = $kind;
            fn name(&self) -> &str {
                &self.$field
            }
        }
    };
}
resource!(Certificate, Kind::Certificate, name);
resource!(Upstream, Kind::Upstream, name);
resource!(Spec, Kind::Spec, name);
resource!(Consumer, Kind::Consumer, username);
resource!(Api, Kind::Api, name);

/// The `kind` column's value. Fixed strings, not `Debug` output, because rows outlive code changes.
pub(super) fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Certificate => "certificate",
        Kind::Upstream => "upstream",
        Kind::Spec => "spec",
        Kind::Consumer => "consumer",
        Kind::Api => "api",
    }
}

fn kind_of(name: &str) -> Option<Kind> {
    Kind::ALL.into_iter().find(|kind| kind_name(*kind) == name)
}

/// Sorts every list by name, byte-wise. Done here rather than in SQL because
/// PostgreSQL's collation and SQLite's would order names differently.
pub(super) fn sort(config: &mut Config) {
    fn by_name<R: Resource>(items: &mut [R]) {
        items.sort_by(|a, b| a.name().cmp(b.name()));
    }
    by_name(&mut config.certificates);
    by_name(&mut config.upstreams);
    by_name(&mut config.specs);
    by_name(&mut config.consumers);
    by_name(&mut config.apis);
}

/// The current configuration, sorted.
pub(super) async fn load(conn: &mut AnyConnection) -> Result<Config, StoreError> {
    let rows = sqlx::query("SELECT kind, name, body FROM resources").fetch_all(&mut *conn).await?;
    let mut config = Config::default();
    for row in &rows {
        let kind: String = row.try_get("kind")?;
        let name: String = row.try_get("name")?;
        let body: String = row.try_get("body")?;
        let corrupt = |reason: String| StoreError::CorruptResource { kind: kind.clone(), name: name.clone(), reason };
        match kind_of(&kind).ok_or_else(|| corrupt("unknown kind".into()))? {
            Kind::Certificate => config.certificates.push(decode(&name, &body).map_err(corrupt)?),
            Kind::Upstream => config.upstreams.push(decode(&name, &body).map_err(corrupt)?),
            Kind::Spec => config.specs.push(decode(&name, &body).map_err(corrupt)?),
            Kind::Consumer => config.consumers.push(decode(&name, &body).map_err(corrupt)?),
            Kind::Api => config.apis.push(decode(&name, &body).map_err(corrupt)?),
        }
    }
    sort(&mut config);
    Ok(config)
}

fn decode<R: Resource>(name: &str, body: &str) -> Result<R, String> {
    let resource: R = serde_json::from_str(body).map_err(|e| e.to_string())?;
    // The key and the body must agree, or a rename would leave two rows for one resource.
    if resource.name() != name {
        return Err(format!("body names `{}`", resource.name()));
    }
    Ok(resource)
}

#[derive(Debug, Default)]
pub(super) struct Diff {
    pub upserts: Vec<(Kind, String, String)>,
    pub deletes: Vec<(Kind, String)>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty()
    }
}

/// The row writes that turn `old` into `new`; unchanged rows are left alone so
/// their `updated_at` keeps meaning "last changed". Only changed resources are
/// encoded: a write to one API of ten thousand encodes one body. Both configs
/// must be sorted by name (see [`sort`]).
pub(super) fn diff(old: &Config, new: &Config) -> Result<Diff, StoreError> {
    let mut diff = Diff::default();
    diff_items(&mut diff, &old.certificates, &new.certificates)?;
    diff_items(&mut diff, &old.upstreams, &new.upstreams)?;
    diff_items(&mut diff, &old.specs, &new.specs)?;
    diff_items(&mut diff, &old.consumers, &new.consumers)?;
    diff_items(&mut diff, &old.apis, &new.apis)?;
    Ok(diff)
}

fn diff_items<R: Resource>(diff: &mut Diff, old: &[R], new: &[R]) -> Result<(), StoreError> {
    // Most writes change items in place, so the same position usually holds
    // the same name; otherwise search (the lists are sorted by name).
    let find = |items: &[R], at: usize, name: &str| match items.get(at) {
        Some(item) if item.name() == name => Some(at),
        _ => items.binary_search_by(|item| item.name().cmp(name)).ok(),
    };
    for (at, item) in new.iter().enumerate() {
        if find(old, at, item.name()).is_none_or(|i| old[i] != *item) {
            let body = serde_json::to_string(item).map_err(|e| StoreError::Encode {
                kind: kind_name(R::KIND).into(),
                name: item.name().into(),
                reason: e.to_string(),
            })?;
            diff.upserts.push((R::KIND, item.name().to_owned(), body));
        }
    }
    for (at, item) in old.iter().enumerate() {
        if find(new, at, item.name()).is_none() {
            diff.deletes.push((R::KIND, item.name().to_owned()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(name: &str, prefix: &str) -> Api {
        serde_json::from_value(serde_json::json!({ "name": name, "path_prefix": prefix, "upstream": "u" })).unwrap()
    }

    #[test]
    fn diff_writes_only_what_changed() {
        let old = Config { apis: vec![api("a", "/a"), api("b", "/b"), api("c", "/c")], ..Config::default() };
        let new = Config { apis: vec![api("a", "/a"), api("b", "/b2"), api("d", "/d")], ..Config::default() };
        let diff = diff(&old, &new).unwrap();
        let upserted: Vec<(Kind, &str)> = diff.upserts.iter().map(|(kind, name, _)| (*kind, name.as_str())).collect();
        assert_eq!(upserted, vec![(Kind::Api, "b"), (Kind::Api, "d")]);
        let body: Api = serde_json::from_str(&diff.upserts[0].2).unwrap();
        assert_eq!(body, new.apis[1]);
        assert_eq!(diff.deletes, vec![(Kind::Api, "c".to_string())]);
        assert!(super::diff(&new, &new).unwrap().is_empty());
    }
}
