//! Spec documents in the snapshot history, stored once by content. A stored
//! version holds each spec twice (its uploaded text in `config`, its JSON form
//! in the sealed `snapshot`), and most writes leave the specs as they were:
//! stored inline, a 5 MiB spec kept 100 versions would take a gigabyte. So a
//! version's row holds a reference in each spec text's place, and the text
//! sits once in `spec_contents`, kept while a version refers to it.
//!
//! The reference can never be mistaken for a spec: a spec's text is a YAML or
//! JSON mapping (the upload checks refuse anything else) and its JSON form
//! starts with `{`. Rows written before references existed hold the texts
//! inline and are read as they are.

use sha2::{Digest, Sha256};
use sluice_proto::v1;
use sqlx::{AnyConnection, Row};

use super::StoreError;
use crate::model::Config;

const REFERENCE_PREFIX: &str = "sluice-spec-content:sha256:";

/// The spec texts [`stow`] took out of a configuration and its snapshot, to put back with [`Stowed::restore`].
#[must_use = "the configuration and snapshot hold references until restored"]
pub(super) struct Stowed {
    config_texts: Vec<String>,
    snapshot_texts: Vec<String>,
}

/// Stores each spec text of `config` and `snapshot` that the store does not
/// hold yet, records that `version` refers to them, and leaves a reference in
/// each text's place (for the caller to encode the row).
pub(super) async fn stow(
    conn: &mut AnyConnection,
    version: i64,
    config: &mut Config,
    snapshot: &mut v1::Snapshot,
) -> Result<Stowed, StoreError> {
    let mut stowed = Stowed { config_texts: Vec::new(), snapshot_texts: Vec::new() };
    for text in config.specs.iter_mut().map(|spec| &mut spec.content) {
        let reference = stow_text(conn, version, text).await?;
        stowed.config_texts.push(std::mem::replace(text, reference));
    }
    for text in snapshot.specs.iter_mut().map(|spec| &mut spec.json) {
        let reference = stow_text(conn, version, text).await?;
        stowed.snapshot_texts.push(std::mem::replace(text, reference));
    }
    Ok(stowed)
}

impl Stowed {
    pub(super) fn restore(self, config: &mut Config, snapshot: &mut v1::Snapshot) {
        for (spec, text) in config.specs.iter_mut().zip(self.config_texts) {
            spec.content = text;
        }
        for (spec, text) in snapshot.specs.iter_mut().zip(self.snapshot_texts) {
            spec.json = text;
        }
    }
}

async fn stow_text(conn: &mut AnyConnection, version: i64, text: &str) -> Result<String, StoreError> {
    let digest = hex::encode(Sha256::digest(text.as_bytes()));
    // Looked up first: most writes keep their specs, and sending megabytes to the database only for
    // ON CONFLICT to drop them would cost more than the lookup.
    let stored = sqlx::query("SELECT sha256 FROM spec_contents WHERE sha256 = $1")
        .bind(&digest)
        .fetch_optional(&mut *conn)
        .await?
        .is_some();
    if !stored {
        sqlx::query("INSERT INTO spec_contents (sha256, content) VALUES ($1, $2)")
            .bind(&digest)
            .bind(text)
            .execute(&mut *conn)
            .await?;
    }
    // Two specs of one version may share a text.
    sqlx::query(
        "INSERT INTO snapshot_spec_contents (version, sha256) VALUES ($1, $2) ON CONFLICT (version, sha256) DO NOTHING",
    )
    .bind(version)
    .bind(&digest)
    .execute(&mut *conn)
    .await?;
    Ok(format!("{REFERENCE_PREFIX}{digest}"))
}

/// Puts the stored texts back in place of the references of version `version`'s configuration.
pub(super) async fn resolve_config(
    conn: &mut AnyConnection,
    version: i64,
    config: &mut Config,
) -> Result<(), StoreError> {
    for text in config.specs.iter_mut().map(|spec| &mut spec.content) {
        resolve(conn, version, text).await?;
    }
    Ok(())
}

/// Puts the stored texts back in place of the references of version `version`'s snapshot.
pub(super) async fn resolve_snapshot(
    conn: &mut AnyConnection,
    version: i64,
    snapshot: &mut v1::Snapshot,
) -> Result<(), StoreError> {
    for text in snapshot.specs.iter_mut().map(|spec| &mut spec.json) {
        resolve(conn, version, text).await?;
    }
    Ok(())
}

async fn resolve(conn: &mut AnyConnection, version: i64, text: &mut String) -> Result<(), StoreError> {
    let Some(digest) = text.strip_prefix(REFERENCE_PREFIX) else { return Ok(()) };
    let row = sqlx::query("SELECT content FROM spec_contents WHERE sha256 = $1")
        .bind(digest)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| StoreError::CorruptSnapshot {
            version,
            reason: format!("the spec text {digest} it refers to is not stored"),
        })?;
    *text = row.try_get("content")?;
    Ok(())
}

/// Forgets which texts the versions below `oldest_kept` referred to, and deletes the texts no version refers to.
pub(super) async fn prune(conn: &mut AnyConnection, oldest_kept: i64) -> Result<(), StoreError> {
    let forgotten = sqlx::query("DELETE FROM snapshot_spec_contents WHERE version < $1")
        .bind(oldest_kept)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if forgotten > 0 {
        sqlx::query(
            "DELETE FROM spec_contents WHERE NOT EXISTS \
             (SELECT 1 FROM snapshot_spec_contents WHERE snapshot_spec_contents.sha256 = spec_contents.sha256)",
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}
