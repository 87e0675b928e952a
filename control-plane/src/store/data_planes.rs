//! The `data_planes` table: what the sync server records about each connected
//! node (hello, ACK/NACK, heartbeat) and what `GET /v1/data-planes` shows.

use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;
use utoipa::ToSchema;

use super::{Store, StoreError, to_db};

/// One data plane as last seen by a control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct DataPlaneRecord {
    pub node_id: String,
    pub hostname: String,
    /// Peer address of its sync stream.
    pub address: String,
    pub software_version: String,
    pub protocol_version: u32,
    /// Version of the snapshot it runs.
    pub applied_version: Option<u64>,
    pub applied_hash: Option<String>,
    pub last_ack_version: Option<u64>,
    pub last_nack_version: Option<u64>,
    /// Hash of the last NACKed snapshot: that content is not sent again to the
    /// same build of this node, under any version number.
    pub last_nack_hash: Option<String>,
    /// Reason of the last NACK, until a newer snapshot is accepted.
    pub last_error: Option<String>,
    pub connected: bool,
    /// Unix milliseconds.
    pub first_seen: i64,
    /// Unix milliseconds.
    pub last_seen: i64,
}

impl Store {
    /// Inserts or replaces the node's row; `first_seen` keeps its first value.
    pub async fn upsert_data_plane(&self, record: &DataPlaneRecord) -> Result<(), StoreError> {
        let optional = |value: Option<u64>, what| value.map(|v| to_db(v, what)).transpose();
        sqlx::query(
            "INSERT INTO data_planes (node_id, hostname, address, software_version, protocol_version, \
             applied_version, applied_hash, last_ack_version, last_nack_version, last_nack_hash, last_error, connected, \
             first_seen, last_seen) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
             ON CONFLICT (node_id) DO UPDATE SET hostname = excluded.hostname, address = excluded.address, \
             software_version = excluded.software_version, protocol_version = excluded.protocol_version, \
             applied_version = excluded.applied_version, applied_hash = excluded.applied_hash, \
             last_ack_version = excluded.last_ack_version, last_nack_version = excluded.last_nack_version, \
             last_nack_hash = excluded.last_nack_hash, last_error = excluded.last_error, \
             connected = excluded.connected, last_seen = excluded.last_seen",
        )
        .bind(record.node_id.as_str())
        .bind(record.hostname.as_str())
        .bind(record.address.as_str())
        .bind(record.software_version.as_str())
        .bind(i64::from(record.protocol_version))
        .bind(optional(record.applied_version, "applied version")?)
        .bind(record.applied_hash.as_deref())
        .bind(optional(record.last_ack_version, "ACK version")?)
        .bind(optional(record.last_nack_version, "NACK version")?)
        .bind(record.last_nack_hash.as_deref())
        .bind(record.last_error.as_deref())
        .bind(record.connected)
        .bind(record.first_seen)
        .bind(record.last_seen)
        .execute(&self.inner.pool)
        .await?;
        Ok(())
    }

    /// Every known data plane, by node id.
    pub async fn list_data_planes(&self) -> Result<Vec<DataPlaneRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT node_id, hostname, address, software_version, protocol_version, applied_version, \
             applied_hash, last_ack_version, last_nack_version, last_nack_hash, last_error, connected, first_seen, \
             last_seen FROM data_planes",
        )
        .fetch_all(&self.inner.pool)
        .await?;
        let mut records = rows.iter().map(record).collect::<Result<Vec<_>, _>>()?;
        // Byte order in Rust: the two databases collate text differently.
        records.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        Ok(records)
    }

    /// Forgets nodes not seen since `last_seen_before_ms`; returns how many.
    pub async fn purge_data_planes(&self, last_seen_before_ms: i64) -> Result<u64, StoreError> {
        let result = sqlx::query("DELETE FROM data_planes WHERE last_seen < $1")
            .bind(last_seen_before_ms)
            .execute(&self.inner.pool)
            .await?;
        Ok(result.rows_affected())
    }
}

fn record(row: &AnyRow) -> Result<DataPlaneRecord, StoreError> {
    let node_id: String = row.try_get("node_id")?;
    let corrupt = |column: &str| StoreError::CorruptDataPlane { node_id: node_id.clone(), reason: column.into() };
    let version = |column: &str| -> Result<Option<u64>, StoreError> {
        row.try_get::<Option<i64>, _>(column)?.map(|v| u64::try_from(v).map_err(|_| corrupt(column))).transpose()
    };
    let protocol_version: i64 = row.try_get("protocol_version")?;
    Ok(DataPlaneRecord {
        hostname: row.try_get("hostname")?,
        address: row.try_get("address")?,
        software_version: row.try_get("software_version")?,
        protocol_version: u32::try_from(protocol_version).map_err(|_| corrupt("protocol_version"))?,
        applied_version: version("applied_version")?,
        applied_hash: row.try_get("applied_hash")?,
        last_ack_version: version("last_ack_version")?,
        last_nack_version: version("last_nack_version")?,
        last_nack_hash: row.try_get("last_nack_hash")?,
        last_error: row.try_get("last_error")?,
        // BOOLEAN on PostgreSQL, INTEGER 0/1 on SQLite.
        connected: match row.try_get::<bool, _>("connected") {
            Ok(connected) => connected,
            Err(_) => row.try_get::<i64, _>("connected")? != 0,
        },
        first_seen: row.try_get("first_seen")?,
        last_seen: row.try_get("last_seen")?,
        node_id,
    })
}
