//! The configuration store, under the admin API and the sync server: every
//! write runs in one database transaction that reads the configuration (kept
//! in memory while this process knows the newest version), applies the
//! change, builds and validates the snapshot and records the changed rows and
//! the snapshot under the next version; readers get the current
//! configuration, old snapshots and the data planes' state. PostgreSQL in
//! production, SQLite embedded, same SQL on both through sqlx's `Any` driver.

mod data_planes;
mod history;
mod resources;
#[cfg(test)]
mod tests;
mod watcher;

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;
use sluice_proto::{Violation, v1};
use sqlx::any::AnyPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{AnyPool, ConnectOptions, Connection, Row};
use tokio::sync::watch;

use crate::model::Config;
use crate::secrets::SecretBox;
use crate::snapshot::build_snapshot;

pub use data_planes::DataPlaneRecord;
pub use history::SnapshotSummary;
use history::latest_head;
use watcher::spawn_version_watcher;

static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");
static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// Key of `pg_advisory_xact_lock` taken by every write ("sluice" in ASCII).
/// Control planes sharing one PostgreSQL serialize their writes on it, so
/// `latest + 1` is always free and each write sees the one before it.
const WRITE_LOCK_KEY: i64 = 0x736c_7569_6365;

/// SQLite has one writer at a time anyway; queueing our writers here instead
/// of in SQLite's busy handler keeps them fair and away from busy timeouts.
/// Process-wide because every `Store` on the same file shares the file lock.
static SQLITE_WRITER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// PostgreSQL channel a write notifies (payload: the new version) so that other
/// control planes on the same database push it without waiting for their poll.
pub const NOTIFY_CHANNEL: &str = "sluice_snapshots";

/// How often a PostgreSQL-backed store re-reads the latest version, covering
/// notifications lost while its LISTEN connection was down.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

const HMAC_KEY_SETTING: &str = "api_key_hmac_key";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL scheme `{scheme}`: expected sqlite:// or postgres://")]
    UnsupportedUrl { scheme: String },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("database migration failed: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    #[error("stored {kind} `{name}` is unreadable: {reason}")]
    CorruptResource { kind: String, name: String, reason: String },
    #[error("stored snapshot {version} is unreadable: {reason}")]
    CorruptSnapshot { version: i64, reason: String },
    #[error("stored setting `{key}` is unreadable: {reason}")]
    CorruptSetting { key: String, reason: String },
    #[error("stored data plane `{node_id}` is unreadable: {reason}")]
    CorruptDataPlane { node_id: String, reason: String },
    #[error("{what} {value} does not fit the database's signed 64-bit integer")]
    OutOfRange { what: &'static str, value: u64 },
    #[error("cannot encode {kind} `{name}`: {reason}")]
    Encode { kind: String, name: String, reason: String },
    /// Only at start-up: the stored resources no longer build a valid snapshot
    /// (e.g. a newer validation rule), so the initial version cannot be cut.
    #[error("stored configuration does not build a valid snapshot: {}", join_violations(.0))]
    InvalidStoredConfig(Vec<Violation>),
    #[error("the store holds no snapshot")]
    NoSnapshot,
}

fn join_violations(violations: &[Violation]) -> String {
    violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// Why a [`Store::write`] committed nothing.
#[derive(Debug, thiserror::Error)]
pub enum WriteError<E> {
    /// The change closure's own error, returned as is.
    #[error("{0}")]
    Rejected(E),
    /// The changed configuration does not build a valid snapshot; every problem, by path.
    #[error("invalid configuration: {}", join_violations(.0))]
    Invalid(Vec<Violation>),
    #[error(transparent)]
    Store(StoreError),
}

impl<E> From<StoreError> for WriteError<E> {
    fn from(error: StoreError) -> Self {
        WriteError::Store(error)
    }
}

impl<E> From<sqlx::Error> for WriteError<E> {
    fn from(error: sqlx::Error) -> Self {
        WriteError::Store(StoreError::Database(error))
    }
}

/// The outcome of a write that did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed<T> {
    /// What the change closure returned.
    pub value: T,
    /// The new version, or the current one when nothing changed.
    pub version: u64,
    /// False when the change left the configuration as it was: no new version.
    pub changed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    fn of_url(url: &str) -> Result<Backend, StoreError> {
        if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else {
            // Only the scheme: the rest of a URL may hold a password.
            let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
            Err(StoreError::UnsupportedUrl { scheme: scheme.chars().take(32).collect() })
        }
    }
}

/// The configuration and snapshot of one version; the snapshot when this
/// process built it (then the sync server need not read it back).
#[derive(Clone)]
struct Newest {
    version: u64,
    config: Arc<Config>,
    snapshot: Option<Arc<v1::Snapshot>>,
}

/// The configuration store. Cheap to clone; every clone is the same store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    pool: AnyPool,
    backend: Backend,
    secrets: SecretBox,
    api_key_hmac_key: Vec<u8>,
    versions: watch::Sender<u64>,
    /// The newest version this process has seen. Reading ten thousand rows
    /// and decoding their JSON costs far more than every other step of a
    /// write; this is used only when its version is the database's newest, so
    /// a write by another control plane on the same database makes it reload.
    newest: std::sync::Mutex<Option<Newest>>,
    /// Dropped with the store; ends the background version watcher.
    _shutdown: watch::Sender<()>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend())
            .field("version", &*self.inner.versions.borrow())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Connects (creating a missing SQLite file), migrates, creates the API-key
    /// HMAC key on first open, and commits version 1 (the empty configuration)
    /// when there is no snapshot yet.
    pub async fn open(database_url: &str, secrets: SecretBox) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of_url(database_url)?;
        let in_memory = backend == Backend::Sqlite && is_sqlite_memory(database_url);
        if backend == Backend::Sqlite && !in_memory {
            prepare_sqlite_file(database_url).await?;
        }
        let mut options = AnyPoolOptions::new();
        options = match backend {
            Backend::Postgres => options.max_connections(10),
            // An in-memory database lives as long as its one connection.
            Backend::Sqlite if in_memory => options.max_connections(1).idle_timeout(None).max_lifetime(None),
            Backend::Sqlite => options.max_connections(4),
        };
        let pool = options.connect(database_url).await?;
        match backend {
            Backend::Postgres => POSTGRES_MIGRATIONS.run(&pool).await?,
            Backend::Sqlite => SQLITE_MIGRATIONS.run(&pool).await?,
        }
        let api_key_hmac_key = ensure_hmac_key(&pool).await?;
        let (versions, _) = watch::channel(0);
        let (shutdown, shutdown_rx) = watch::channel(());
        let store = Store {
            inner: Arc::new(Inner {
                pool,
                backend,
                secrets,
                api_key_hmac_key,
                versions,
                newest: std::sync::Mutex::default(),
                _shutdown: shutdown,
            }),
        };

        if store.latest_version().await?.is_none() {
            // Another control plane may race us here; the write lock makes the
            // loser see version 1 and commit nothing.
            store.write("initial empty configuration", |_| Ok::<(), Infallible>(())).await.map_err(|e| match e {
                WriteError::Rejected(never) => match never {},
                WriteError::Invalid(violations) => StoreError::InvalidStoredConfig(violations),
                WriteError::Store(e) => e,
            })?;
        }
        let version = store.refresh_latest().await?;
        let listen_url = (backend == Backend::Postgres).then(|| database_url.to_owned());
        spawn_version_watcher(&store.inner, listen_url, shutdown_rx);
        tracing::info!(backend = store.backend(), version, "configuration store open");
        Ok(store)
    }

    /// Key of the HMAC-SHA256 digests of API keys; created once per database.
    pub fn api_key_hmac_key(&self) -> &[u8] {
        &self.inner.api_key_hmac_key
    }

    pub fn secrets(&self) -> &SecretBox {
        &self.inner.secrets
    }

    /// `"postgres"` or `"sqlite"`.
    pub fn backend(&self) -> &'static str {
        match self.inner.backend {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }

    /// The latest committed version this store knows of (what `subscribe` holds).
    /// A stored setting (e.g. a token digest), if present.
    pub async fn setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        let row =
            sqlx::query("SELECT value FROM settings WHERE key = $1").bind(key).fetch_optional(&self.inner.pool).await?;
        Ok(row.map(|r| r.try_get("value")).transpose()?)
    }

    /// Stores `value` unless the key already has one; returns what is stored.
    pub async fn insert_setting_if_absent(&self, key: &str, value: &str) -> Result<String, StoreError> {
        insert_setting_if_absent(&self.inner.pool, key, value).await
    }

    pub fn current_version(&self) -> u64 {
        *self.inner.versions.borrow()
    }

    /// Closes the connection pool; later calls fail. For orderly shutdown.
    pub async fn close(&self) {
        self.inner.pool.close().await;
    }

    /// The current configuration, each list sorted by name.
    pub async fn config(&self) -> Result<Arc<Config>, StoreError> {
        let mut conn = self.inner.pool.acquire().await?;
        let head = latest_head(&mut conn).await?;
        self.config_at(&mut conn, head.map(|(version, _)| version)).await
    }

    /// The configuration of version `head`, which the caller has just read as
    /// the newest: from memory when it holds that version, else loaded.
    /// Loaded after `head` was read, the rows are never older than `head`, so
    /// what is kept can only be newer than its label, never stale.
    async fn config_at(&self, conn: &mut sqlx::AnyConnection, head: Option<u64>) -> Result<Arc<Config>, StoreError> {
        if let Some(newest) = head.and_then(|head| self.newest_if(head)) {
            return Ok(newest.config);
        }
        let config = Arc::new(resources::load(conn).await?);
        if let Some(version) = head {
            self.remember(Newest { version, config: config.clone(), snapshot: None });
        }
        Ok(config)
    }

    fn newest_if(&self, version: u64) -> Option<Newest> {
        let newest = self.inner.newest.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        newest.as_ref().filter(|newest| newest.version == version).cloned()
    }

    /// Keeps `seen` unless what is kept is newer, or the same version with
    /// its snapshot (a read that raced the write committing it must not drop
    /// the snapshot the write kept).
    fn remember(&self, seen: Newest) {
        let mut newest = self.inner.newest.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let keep = newest.as_ref().is_some_and(|kept| {
            kept.version > seen.version || (kept.version == seen.version && kept.snapshot.is_some())
        });
        if !keep {
            *newest = Some(seen);
        }
    }

    /// Applies `change` to the current configuration in one transaction and
    /// commits it as the next snapshot version if it builds a valid snapshot.
    /// Writers are serialized, so `change` always sees the latest committed
    /// configuration. Nothing is committed when `change` fails, when the result
    /// is invalid, or when it equals the current configuration.
    pub async fn write<T, E>(
        &self,
        note: &str,
        change: impl FnOnce(&mut Config) -> Result<T, E> + Send,
    ) -> Result<Committed<T>, WriteError<E>> {
        let _writer = match self.inner.backend {
            Backend::Sqlite => Some(SQLITE_WRITER.lock().await),
            Backend::Postgres => None,
        };
        let mut tx = match self.inner.backend {
            // IMMEDIATE takes the write lock up front; a deferred transaction that
            // reads first could not upgrade after another connection wrote.
            Backend::Sqlite => self.inner.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => {
                let mut tx = self.inner.pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(WRITE_LOCK_KEY).execute(&mut *tx).await?;
                tx
            }
        };

        // Read only after the lock, so the previous writer's commit is visible.
        let latest = latest_head(&mut tx).await?;
        let before = self.config_at(&mut tx, latest.as_ref().map(|(version, _)| *version)).await?;
        let mut config = Config::clone(&before);
        // An error drops `tx`, which rolls back.
        let value = change(&mut config).map_err(WriteError::Rejected)?;
        // Sorted, the config lines up index for index with the canonical snapshot.
        resources::sort(&mut config);

        let mut snapshot =
            build_snapshot(&config, &self.inner.secrets, &self.inner.api_key_hmac_key).map_err(WriteError::Invalid)?;
        let diff = resources::diff(&before, &config)?;
        if let Some((version, hash)) = &latest
            && *hash == snapshot.hash
            && diff.is_empty()
        {
            drop(tx);
            return Ok(Committed { value, version: *version, changed: false });
        }
        // A change the data planes cannot see (say a spec's read-only title)
        // still gets a version, with an unchanged hash, so that the history and
        // rollback reproduce the configuration exactly.

        let now = now_ms();
        for (kind, name, body) in &diff.upserts {
            sqlx::query(
                "INSERT INTO resources (kind, name, body, updated_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (kind, name) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at",
            )
            .bind(resources::kind_name(*kind))
            .bind(name.as_str())
            .bind(body.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        for (kind, name) in &diff.deletes {
            sqlx::query("DELETE FROM resources WHERE kind = $1 AND name = $2")
                .bind(resources::kind_name(*kind))
                .bind(name.as_str())
                .execute(&mut *tx)
                .await?;
        }

        let version = latest.as_ref().map_or(1, |(version, _)| version + 1);
        snapshot.version = version;
        let encoded = snapshot.encode_to_vec();
        let config_json = serde_json::to_string(&config).map_err(|e| StoreError::Encode {
            kind: "config".into(),
            name: format!("version {version}"),
            reason: e.to_string(),
        })?;
        sqlx::query(
            "INSERT INTO snapshots (version, hash, created_at, config, snapshot, size_bytes, note) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(to_db(version, "version")?)
        .bind(snapshot.hash.as_str())
        .bind(now)
        .bind(config_json)
        .bind(encoded.as_slice())
        .bind(to_db(encoded.len() as u64, "snapshot size")?)
        .bind(note)
        .execute(&mut *tx)
        .await?;
        if self.inner.backend == Backend::Postgres {
            // Delivered only on commit, so listeners never see a rolled-back version.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(NOTIFY_CHANNEL)
                .bind(version.to_string())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;

        tracing::info!(
            version,
            hash = %snapshot.hash,
            upserted = diff.upserts.len(),
            deleted = diff.deletes.len(),
            size_bytes = encoded.len(),
            note,
            "configuration committed"
        );
        // Before publishing, so the sync server finds the snapshot in memory.
        self.remember(Newest { version, config: Arc::new(config), snapshot: Some(Arc::new(snapshot)) });
        self.publish(version);
        Ok(Committed { value, version, changed: true })
    }

    /// Follows the latest committed version. Bursts of writes coalesce: a slow
    /// receiver sees only the newest.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.versions.subscribe()
    }

    /// Re-reads the latest version from the database and publishes it if it is
    /// newer than what this store knew (another control plane wrote it).
    pub async fn refresh_latest(&self) -> Result<u64, StoreError> {
        let mut conn = self.inner.pool.acquire().await?;
        let version = latest_head(&mut conn).await?.map_or(0, |(version, _)| version);
        self.publish(version);
        Ok(self.current_version())
    }

    fn publish(&self, version: u64) {
        // Concurrent publishers may finish out of order; the channel only moves forward.
        self.inner.versions.send_if_modified(|current| {
            if version > *current {
                *current = version;
                true
            } else {
                false
            }
        });
    }

    async fn latest_version(&self) -> Result<Option<u64>, StoreError> {
        let mut conn = self.inner.pool.acquire().await?;
        Ok(latest_head(&mut conn).await?.map(|(version, _)| version))
    }
}

/// Reads the API-key HMAC key, creating it first if this database has none.
async fn ensure_hmac_key(pool: &AnyPool) -> Result<Vec<u8>, StoreError> {
    let fresh = hex::encode(crate::credentials::random_bytes::<32>());
    let value = insert_setting_if_absent(pool, HMAC_KEY_SETTING, &fresh).await?;
    let key = hex::decode(value.trim())
        .map_err(|e| StoreError::CorruptSetting { key: HMAC_KEY_SETTING.into(), reason: format!("not hex: {e}") })?;
    if key.len() < 16 {
        return Err(StoreError::CorruptSetting {
            key: HMAC_KEY_SETTING.into(),
            reason: "shorter than 16 bytes".into(),
        });
    }
    Ok(key)
}

/// Insert-if-absent then read, so concurrent first starts of several control
/// planes agree on one value. Returns the value that is stored.
async fn insert_setting_if_absent(pool: &AnyPool, key: &str, value: &str) -> Result<String, StoreError> {
    sqlx::query("INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
        .bind(key)
        .bind(value)
        .execute(pool)
        .await?;
    Ok(sqlx::query("SELECT value FROM settings WHERE key = $1").bind(key).fetch_one(pool).await?.try_get("value")?)
}

fn is_sqlite_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// Creates the file if missing and switches it to WAL (readers never block
/// the writer). WAL is a property of the file, so one connection sets it for
/// every later one, including the `Any` pool's which cannot set pragmas.
async fn prepare_sqlite_file(url: &str) -> Result<(), StoreError> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let conn = options.connect().await?;
    conn.close().await?;
    Ok(())
}

fn to_db(value: u64, what: &'static str) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { what, value })
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
