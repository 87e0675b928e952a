//! The `resources` table as the store's write path sees it: loading rows into a
//! `Config` inside the write transaction, and the per-(kind, name) JSON rows
//! and diff that decide what the transaction upserts and deletes.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{AnyConnection, Row};

use super::StoreError;
use crate::model::{Api, Certificate, Config, Consumer, Kind, Spec, Upstream};

/// A resource kind stored one row per named element.
trait Resource: Serialize + DeserializeOwned {
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

/// `(kind, name) -> JSON body` of every resource.
pub(super) type Rows = BTreeMap<(Kind, String), String>;

pub(super) fn rows(config: &Config) -> Result<Rows, StoreError> {
    fn add<R: Resource>(rows: &mut Rows, items: &[R]) -> Result<(), StoreError> {
        for item in items {
            let body = serde_json::to_string(item).map_err(|e| StoreError::Encode {
                kind: kind_name(R::KIND).into(),
                name: item.name().into(),
                reason: e.to_string(),
            })?;
            // Duplicate names cannot reach here: snapshot validation rejects them first.
            rows.insert((R::KIND, item.name().to_owned()), body);
        }
        Ok(())
    }
    let mut rows = Rows::new();
    add(&mut rows, &config.certificates)?;
    add(&mut rows, &config.upstreams)?;
    add(&mut rows, &config.specs)?;
    add(&mut rows, &config.consumers)?;
    add(&mut rows, &config.apis)?;
    Ok(rows)
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
/// their `updated_at` keeps meaning "last changed".
pub(super) fn diff(old: &Rows, new: &Rows) -> Diff {
    let mut diff = Diff::default();
    for ((kind, name), body) in new {
        if old.get(&(*kind, name.clone())) != Some(body) {
            diff.upserts.push((*kind, name.clone(), body.clone()));
        }
    }
    for (kind, name) in old.keys() {
        if !new.contains_key(&(*kind, name.clone())) {
            diff.deletes.push((*kind, name.clone()));
        }
    }
    diff
}
