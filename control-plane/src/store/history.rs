//! Reading the snapshot history the write path recorded: what the sync server
//! pushes (`latest_snapshot`, opened from its sealed form only in memory), and
//! what `/v1/snapshots` lists, shows and rolls back to.

use std::sync::Arc;

use prost::Message;
use serde::Serialize;
use sluice_proto::v1;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};
use utoipa::ToSchema;

use super::{Store, StoreError, spec_contents};
use crate::model::Config;

/// One line of the snapshot history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SnapshotSummary {
    pub version: u64,
    /// Hex SHA-256 of the snapshot's content.
    pub hash: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Size of the encoded snapshot pushed to data planes.
    pub size_bytes: u64,
    /// What this version changed, in one line (e.g. `replaced api shop`).
    pub note: String,
    /// The name of the admin token that made it; empty for versions the control plane made itself.
    pub author: String,
}

/// Where a version stands in the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotLookup {
    Kept,
    /// Deleted by retention: older than every version kept (`oldest_kept`).
    Pruned {
        oldest_kept: u64,
    },
    /// Never committed (or beyond the newest).
    Unknown,
}

impl Store {
    /// The newest snapshot: the one this process just committed, if it is
    /// still the newest, else read back from the database.
    pub async fn latest_snapshot(&self) -> Result<Arc<v1::Snapshot>, StoreError> {
        let mut conn = self.inner.pool.acquire().await?;
        let head = latest_head(&mut conn).await?.ok_or(StoreError::NoSnapshot)?;
        if let Some(snapshot) = self.newest_if(head.0).and_then(|newest| newest.snapshot) {
            return Ok(snapshot);
        }
        let row = sqlx::query("SELECT version, snapshot FROM snapshots ORDER BY version DESC LIMIT 1")
            .fetch_optional(&mut *conn)
            .await?
            .ok_or(StoreError::NoSnapshot)?;
        self.load_snapshot(&mut conn, &row).await.map(Arc::new)
    }

    pub async fn snapshot(&self, version: u64) -> Result<Option<v1::Snapshot>, StoreError> {
        let Ok(version) = i64::try_from(version) else { return Ok(None) };
        let mut conn = self.inner.pool.acquire().await?;
        let row = sqlx::query("SELECT version, snapshot FROM snapshots WHERE version = $1")
            .bind(version)
            .fetch_optional(&mut *conn)
            .await?;
        match row {
            Some(row) => self.load_snapshot(&mut conn, &row).await.map(Some),
            None => Ok(None),
        }
    }

    /// Whether `version` is in the history, was pruned from it, or never existed.
    pub async fn lookup_snapshot(&self, version: u64) -> Result<SnapshotLookup, StoreError> {
        let row = sqlx::query("SELECT MIN(version) AS oldest, MAX(version) AS newest FROM snapshots")
            .fetch_one(&self.inner.pool)
            .await?;
        let (Some(oldest), Some(newest)) =
            (row.try_get::<Option<i64>, _>("oldest")?, row.try_get::<Option<i64>, _>("newest")?)
        else {
            return Ok(SnapshotLookup::Unknown);
        };
        let (oldest, newest) = (u64::try_from(oldest).unwrap_or(0), u64::try_from(newest).unwrap_or(0));
        Ok(match version {
            0 => SnapshotLookup::Unknown,
            v if v < oldest => SnapshotLookup::Pruned { oldest_kept: oldest },
            v if v > newest => SnapshotLookup::Unknown,
            // Versions are never skipped, so every one in range is kept.
            _ => SnapshotLookup::Kept,
        })
    }

    /// The newest snapshot below `before` that `refused` does not rule out:
    /// what a node that refused every newer one can still be given. Reads
    /// versions and hashes a page at a time, and only the chosen snapshot whole.
    pub async fn newest_snapshot_below(
        &self,
        before: u64,
        refused: impl Fn(u64, &str) -> bool,
    ) -> Result<Option<v1::Snapshot>, StoreError> {
        const PAGE: i64 = 64;
        let mut below = i64::try_from(before).unwrap_or(i64::MAX);
        loop {
            let rows =
                sqlx::query("SELECT version, hash FROM snapshots WHERE version < $1 ORDER BY version DESC LIMIT $2")
                    .bind(below)
                    .bind(PAGE)
                    .fetch_all(&self.inner.pool)
                    .await?;
            for row in &rows {
                let version: i64 = row.try_get("version")?;
                let hash: String = row.try_get("hash")?;
                below = version;
                let Ok(unsigned) = u64::try_from(version) else { continue };
                if !refused(unsigned, &hash) {
                    return self.snapshot(unsigned).await;
                }
            }
            if rows.len() < PAGE as usize {
                return Ok(None);
            }
        }
    }

    /// The configuration as it was committed at `version` (for rollback and diff).
    pub async fn snapshot_config(&self, version: u64) -> Result<Option<Config>, StoreError> {
        let Ok(version) = i64::try_from(version) else { return Ok(None) };
        let mut conn = self.inner.pool.acquire().await?;
        let row = sqlx::query("SELECT config FROM snapshots WHERE version = $1")
            .bind(version)
            .fetch_optional(&mut *conn)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let json: String = row.try_get("config")?;
        let mut config: Config = serde_json::from_str(&json)
            .map_err(|e| StoreError::CorruptSnapshot { version, reason: format!("config: {e}") })?;
        spec_contents::resolve_config(&mut conn, version, &mut config).await?;
        Ok(Some(config))
    }

    /// Snapshot history, newest first, versions below `before` (all when `None`).
    pub async fn list_snapshots(&self, before: Option<u64>, limit: u32) -> Result<Vec<SnapshotSummary>, StoreError> {
        let before = before.map_or(i64::MAX, |b| i64::try_from(b).unwrap_or(i64::MAX));
        let rows = sqlx::query(
            "SELECT version, hash, created_at, size_bytes, note, author FROM snapshots \
             WHERE version < $1 ORDER BY version DESC LIMIT $2",
        )
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let version: i64 = row.try_get("version")?;
                let corrupt = |reason: &str| StoreError::CorruptSnapshot { version, reason: reason.into() };
                Ok(SnapshotSummary {
                    version: u64::try_from(version).map_err(|_| corrupt("negative version"))?,
                    hash: row.try_get("hash")?,
                    created_at: row.try_get("created_at")?,
                    size_bytes: u64::try_from(row.try_get::<i64, _>("size_bytes")?)
                        .map_err(|_| corrupt("negative size"))?,
                    note: row.try_get("note")?,
                    author: row.try_get("author")?,
                })
            })
            .collect()
    }
}

/// `(version, hash)` of the newest snapshot.
pub(super) async fn latest_head(conn: &mut AnyConnection) -> Result<Option<(u64, String)>, StoreError> {
    let row = sqlx::query("SELECT version, hash FROM snapshots ORDER BY version DESC LIMIT 1")
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let version: i64 = row.try_get("version")?;
    let hash: String = row.try_get("hash")?;
    let version = u64::try_from(version)
        .map_err(|_| StoreError::CorruptSnapshot { version, reason: "negative version".into() })?;
    Ok(Some((version, hash)))
}

impl Store {
    /// Opens a row's sealed snapshot, decodes it and puts its spec texts back;
    /// the clear form exists only here, in memory.
    async fn load_snapshot(&self, conn: &mut AnyConnection, row: &AnyRow) -> Result<v1::Snapshot, StoreError> {
        let version: i64 = row.try_get("version")?;
        let bytes = self
            .inner
            .secrets
            .open_blob(row.try_get("snapshot")?)
            .map_err(|source| StoreError::Sealed { version, source })?;
        let mut snapshot = v1::Snapshot::decode(bytes.as_slice())
            .map_err(|e| StoreError::CorruptSnapshot { version, reason: format!("snapshot: {e}") })?;
        spec_contents::resolve_snapshot(conn, version, &mut snapshot).await?;
        Ok(snapshot)
    }
}
