//! The `resources` table as the store's write path sees it: loading rows into a
//! `Config`, and the rows a write transaction upserts and deletes to turn one
//! config into the next (what changed is decided by `crate::diff`).

use sqlx::{AnyConnection, Row};

use super::StoreError;
use crate::diff::{Change, changes};
use crate::model::{Config, Kind, Resource};

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
pub(super) struct RowWrites {
    pub upserts: Vec<(Kind, String, String)>,
    pub deletes: Vec<(Kind, String)>,
}

impl RowWrites {
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty()
    }
}

/// The row writes that turn `old` into `new`; unchanged rows are left alone so
/// their `updated_at` keeps meaning "last changed". Only changed resources are
/// encoded: a write to one API of ten thousand encodes one body. Both configs
/// must be sorted by name (see [`sort`]).
pub(super) fn row_writes(old: &Config, new: &Config) -> Result<RowWrites, StoreError> {
    let mut writes = RowWrites::default();
    kind_writes(&mut writes, &old.certificates, &new.certificates)?;
    kind_writes(&mut writes, &old.upstreams, &new.upstreams)?;
    kind_writes(&mut writes, &old.specs, &new.specs)?;
    kind_writes(&mut writes, &old.consumers, &new.consumers)?;
    kind_writes(&mut writes, &old.apis, &new.apis)?;
    Ok(writes)
}

fn kind_writes<R: Resource>(writes: &mut RowWrites, old: &[R], new: &[R]) -> Result<(), StoreError> {
    for change in changes(old, new) {
        match change {
            Change::Added(item) | Change::Changed(item) => {
                let body = serde_json::to_string(item).map_err(|e| StoreError::Encode {
                    kind: kind_name(R::KIND).into(),
                    name: item.name().into(),
                    reason: e.to_string(),
                })?;
                writes.upserts.push((R::KIND, item.name().to_owned(), body));
            }
            Change::Removed(item) => writes.deletes.push((R::KIND, item.name().to_owned())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Api;

    fn api(name: &str, prefix: &str) -> Api {
        serde_json::from_value(serde_json::json!({ "name": name, "path_prefix": prefix, "upstream": "u" })).unwrap()
    }

    #[test]
    fn only_what_changed_is_written() {
        let old = Config { apis: vec![api("a", "/a"), api("b", "/b"), api("c", "/c")], ..Config::default() };
        let new = Config { apis: vec![api("a", "/a"), api("b", "/b2"), api("d", "/d")], ..Config::default() };
        let writes = row_writes(&old, &new).unwrap();
        let upserted: Vec<(Kind, &str)> = writes.upserts.iter().map(|(kind, name, _)| (*kind, name.as_str())).collect();
        assert_eq!(upserted, vec![(Kind::Api, "b"), (Kind::Api, "d")]);
        let body: Api = serde_json::from_str(&writes.upserts[0].2).unwrap();
        assert_eq!(body, new.apis[1]);
        assert_eq!(writes.deletes, vec![(Kind::Api, "c".to_string())]);
        assert!(row_writes(&new, &new).unwrap().is_empty());
    }
}
