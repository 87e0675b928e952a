//! The `data_planes` table: what the sync server records about each connected
//! node (hello, ACK/NACK, heartbeat) and what `GET /v1/data-planes` shows.
//!
//! A connected node's record changes with every heartbeat and answer, so a
//! thousand nodes would make a database write per message. The sessions of
//! this process record into memory instead ([`Store::record_data_plane`]);
//! the sync server's flusher writes what changed in one transaction, in
//! multi-row statements ([`Store::flush_data_planes`]). Readers see the
//! memory first, so this process's view of its own nodes is always current;
//! another control plane on the same database sees them one flush late.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Serialize;
use sqlx::Row;
use sqlx::any::{AnyArguments, AnyRow};
use sqlx::query::Query;
use sqlx::{Any, AnyConnection, AssertSqlSafe};
use utoipa::ToSchema;

use super::{Store, StoreError, to_db};

/// Columns of one row, in statement order.
const COLUMNS: usize = 14;
/// Rows per statement, far below the parameter limits (PostgreSQL 65,535,
/// SQLite 32,766): SQLite finds a `$N` parameter by a linear scan of the
/// statement's parameters, at prepare and again at every bind, so a statement
/// costs the square of its parameters. Batches of hundreds of rows made the
/// flush of a large fleet the control plane's main CPU cost (bench/ `fleet`);
/// a few more statements per flush (round trips on PostgreSQL) cost far less.
const ROWS_PER_STATEMENT: usize = 32;

/// Records of the nodes whose streams this process serves (and of those
/// that just left, until written).
#[derive(Debug, Default)]
pub(super) struct LiveDataPlanes {
    records: Mutex<HashMap<String, Live>>,
}

#[derive(Debug)]
struct Live {
    record: DataPlaneRecord,
    /// Changed since it was last written.
    dirty: bool,
}

impl LiveDataPlanes {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Live>> {
        // Every critical section is a plain map update: consistent even after a panic.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

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

const SELECT: &str = "SELECT node_id, hostname, address, software_version, protocol_version, applied_version, \
     applied_hash, last_ack_version, last_nack_version, last_nack_hash, last_error, connected, first_seen, \
     last_seen FROM data_planes";

impl Store {
    /// Records the node's state in memory; it reaches the database with the
    /// next [`Store::flush_data_planes`]. Readers of this store see it at once.
    pub fn record_data_plane(&self, record: DataPlaneRecord) {
        let mut live = self.inner.data_planes.lock();
        live.insert(record.node_id.clone(), Live { record, dirty: true });
    }

    /// Writes every record changed in memory since the last flush, in one
    /// transaction; returns how many. A failed write leaves them to the next
    /// flush. Records of nodes that left are then dropped from memory: the
    /// database has them.
    pub async fn flush_data_planes(&self) -> Result<usize, StoreError> {
        let dirty: Vec<DataPlaneRecord> = {
            let mut live = self.inner.data_planes.lock();
            live.values_mut()
                .filter(|l| l.dirty)
                .map(|l| {
                    l.dirty = false;
                    l.record.clone()
                })
                .collect()
        };
        if dirty.is_empty() {
            return Ok(0);
        }
        let written = async {
            let mut tx = self.inner.pool.begin().await?;
            for rows in dirty.chunks(ROWS_PER_STATEMENT) {
                upsert(&mut tx, rows).await?;
            }
            tx.commit().await?;
            Ok::<(), StoreError>(())
        };
        let result = written.await;
        let mut live = self.inner.data_planes.lock();
        match &result {
            // Written as they were: an entry changed since stays dirty.
            Ok(()) => live.retain(|_, l| l.dirty || l.record.connected),
            Err(_) => {
                for record in &dirty {
                    if let Some(l) = live.get_mut(&record.node_id) {
                        l.dirty = true;
                    }
                }
            }
        }
        result.map(|()| dirty.len())
    }

    /// Inserts or replaces the node's row now; `first_seen` keeps its first value.
    pub async fn upsert_data_plane(&self, record: &DataPlaneRecord) -> Result<(), StoreError> {
        let mut conn = self.inner.pool.acquire().await?;
        upsert(&mut conn, std::slice::from_ref(record)).await
    }

    /// Every known data plane, by node id: this process's nodes as in
    /// memory, the others as last written.
    pub async fn list_data_planes(&self) -> Result<Vec<DataPlaneRecord>, StoreError> {
        let rows = sqlx::query(SELECT).fetch_all(&self.inner.pool).await?;
        let mut records: HashMap<String, DataPlaneRecord> =
            rows.iter().map(record).map(|r| r.map(|r| (r.node_id.clone(), r))).collect::<Result<_, _>>()?;
        for (node_id, live) in self.inner.data_planes.lock().iter() {
            let first_seen = records.get(node_id).map(|r| r.first_seen);
            let mut shown = live.record.clone();
            // As the database keeps it: the first value ever recorded.
            shown.first_seen = first_seen.map_or(shown.first_seen, |f| f.min(shown.first_seen));
            records.insert(node_id.clone(), shown);
        }
        let mut records: Vec<DataPlaneRecord> = records.into_values().collect();
        // Byte order in Rust: the two databases collate text differently.
        records.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        Ok(records)
    }

    /// One node's record, from memory if this process serves it.
    pub async fn data_plane(&self, node_id: &str) -> Result<Option<DataPlaneRecord>, StoreError> {
        if let Some(live) = self.inner.data_planes.lock().get(node_id) {
            return Ok(Some(live.record.clone()));
        }
        let row = sqlx::query(AssertSqlSafe(format!("{SELECT} WHERE node_id = $1")))
            .bind(node_id)
            .fetch_optional(&self.inner.pool)
            .await?;
        row.as_ref().map(record).transpose()
    }

    /// Forgets nodes not seen since `last_seen_before_ms`; returns how many rows went.
    pub async fn purge_data_planes(&self, last_seen_before_ms: i64) -> Result<u64, StoreError> {
        self.inner.data_planes.lock().retain(|_, l| l.record.connected || l.record.last_seen >= last_seen_before_ms);
        let result = sqlx::query("DELETE FROM data_planes WHERE last_seen < $1")
            .bind(last_seen_before_ms)
            .execute(&self.inner.pool)
            .await?;
        Ok(result.rows_affected())
    }
}

/// One multi-row upsert; `first_seen` keeps the value first written.
async fn upsert(conn: &mut AnyConnection, rows: &[DataPlaneRecord]) -> Result<(), StoreError> {
    let mut sql = String::from(
        "INSERT INTO data_planes (node_id, hostname, address, software_version, protocol_version, \
         applied_version, applied_hash, last_ack_version, last_nack_version, last_nack_hash, last_error, connected, \
         first_seen, last_seen) VALUES ",
    );
    for i in 0..rows.len() {
        sql.push_str(if i == 0 { "(" } else { ", (" });
        for column in 0..COLUMNS {
            if column > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!("${}", i * COLUMNS + column + 1));
        }
        sql.push(')');
    }
    sql.push_str(
        " ON CONFLICT (node_id) DO UPDATE SET hostname = excluded.hostname, address = excluded.address, \
         software_version = excluded.software_version, protocol_version = excluded.protocol_version, \
         applied_version = excluded.applied_version, applied_hash = excluded.applied_hash, \
         last_ack_version = excluded.last_ack_version, last_nack_version = excluded.last_nack_version, \
         last_nack_hash = excluded.last_nack_hash, last_error = excluded.last_error, \
         connected = excluded.connected, last_seen = excluded.last_seen",
    );
    // Only placeholders are generated; every value is bound.
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for record in rows {
        query = bind(query, record)?;
    }
    query.execute(conn).await?;
    Ok(())
}

fn bind<'q>(
    query: Query<'q, Any, AnyArguments>,
    record: &DataPlaneRecord,
) -> Result<Query<'q, Any, AnyArguments>, StoreError> {
    let optional = |value: Option<u64>, what| value.map(|v| to_db(v, what)).transpose();
    Ok(query
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
        .bind(record.last_seen))
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
