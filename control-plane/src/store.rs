//! The configuration store, under the admin API and the sync server: every
//! write runs in one database transaction that reads the configuration (kept
//! in memory while this process knows the newest version), applies the
//! change, builds and validates the snapshot and records the changed rows and
//! the snapshot under the next version; readers get the current
//! configuration, old snapshots and the data planes' state. PostgreSQL in
//! production, SQLite embedded, same SQL on both through sqlx's `Any` driver.

mod admin_tokens;
mod data_planes;
mod history;
mod resources;
mod sealing;
mod spec_contents;
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
use sqlx::{Any, AnyConnection, AnyPool, ConnectOptions, Connection, Row, Transaction};
use tokio::sync::watch;

use crate::model::Config;
use crate::secrets::SecretBox;
use crate::snapshot::build_snapshot;
use crate::specs::{DEFAULT_MAX_SPEC_BYTES, SpecCache};

pub use data_planes::DataPlaneRecord;
use history::latest_head;
pub use history::{SnapshotLookup, SnapshotSummary};
pub use sealing::Rotated;
use watcher::spawn_version_watcher;
pub use watcher::{WatchMode, WatchState};

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

/// How many versions `--keep-snapshots` keeps by default.
pub const DEFAULT_KEEP_SNAPSHOTS: u64 = 100;

/// How a store runs, beyond where its database is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// Versions kept in the history; each write deletes older ones in its own transaction.
    pub keep_snapshots: u64,
    /// Largest spec text an upload may have (`--max-spec-bytes`).
    pub max_spec_bytes: usize,
    /// Longest wait for a database connection: while the database is
    /// unreachable, requests fail after this long (503) instead of hanging.
    pub acquire_timeout: Duration,
}

/// `--database-acquire-timeout`'s default.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            keep_snapshots: DEFAULT_KEEP_SNAPSHOTS,
            max_spec_bytes: DEFAULT_MAX_SPEC_BYTES,
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
        }
    }
}

/// Who made a write and what it did, one line each, as the history shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Note<'a> {
    /// The admin token's name (empty for writes the control plane makes itself).
    pub author: &'a str,
    pub summary: &'a str,
}

impl<'a> From<&'a str> for Note<'a> {
    fn from(summary: &'a str) -> Self {
        Note { author: "", summary }
    }
}

impl<'a> From<&'a String> for Note<'a> {
    fn from(summary: &'a String) -> Self {
        Note { author: "", summary }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL scheme `{scheme}`: expected sqlite:// or postgres://")]
    UnsupportedUrl { scheme: String },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("database file {}: {source}", .path.display())]
    DatabaseFile { path: std::path::PathBuf, source: std::io::Error },
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
    /// At open: the database's secrets are sealed with another key than this control plane's.
    #[error(
        "the database's secrets are sealed with another secret key (key id {stored}) than this control plane's; \
         start it with the key the database was set up with, or the new one if the key was rotated \
         (sluice-cp rotate-secret-key)"
    )]
    WrongSecretKey { stored: String },
    /// At a write: the key was rotated under this running control plane.
    #[error(
        "the secret key was rotated (the database now records key id {stored}); restart this control plane with \
         the new key before writing"
    )]
    SecretKeyRotated { stored: String },
    #[error("stored snapshot {version} cannot be opened: {source}")]
    Sealed { version: i64, source: crate::secrets::SecretError },
}

impl StoreError {
    /// Whether the database could not be reached (no connection within the
    /// acquire timeout, a connection lost, the server shutting down): a
    /// request may succeed when retried later, unlike on any other error.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Database(error) => database_unreachable(error),
            StoreError::Migration(sqlx::migrate::MigrateError::Execute(error)) => database_unreachable(error),
            _ => false,
        }
    }
}

fn database_unreachable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::WorkerCrashed => true,
        // SQLSTATE class 08 (connection exception), 57P01-57P03 (the server is
        // shutting down or starting), 53300 (too many connections).
        sqlx::Error::Database(e) => {
            e.code().is_some_and(|code| code.starts_with("08") || code.starts_with("57P") || code == "53300")
        }
        _ => false,
    }
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
    options: StoreOptions,
    versions: watch::Sender<u64>,
    /// The newest version this process has seen. Reading ten thousand rows
    /// and decoding their JSON costs far more than every other step of a
    /// write; this is used only when its version is the database's newest, so
    /// a write by another control plane on the same database makes it reload.
    newest: std::sync::Mutex<Option<Newest>>,
    /// Specs parsed by uploads and writes, one copy per distinct text in use.
    specs: SpecCache,
    /// How the version watcher learns of other processes' commits.
    watch: Arc<WatchState>,
    /// This process's data planes, written to the database in batches.
    data_planes: data_planes::LiveDataPlanes,
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
    /// [`Store::open_with`] the default options.
    pub async fn open(database_url: &str, secrets: SecretBox) -> Result<Store, StoreError> {
        Self::open_with(database_url, secrets, StoreOptions::default()).await
    }

    /// Connects (creating a missing SQLite file, 0600), migrates, checks the
    /// secret key against the database's and seals what an older release
    /// stored in clear, creates the API-key HMAC key on first open, and
    /// commits version 1 (the empty configuration) when there is no snapshot yet.
    pub async fn open_with(database_url: &str, secrets: SecretBox, options: StoreOptions) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of_url(database_url)?;
        let in_memory = backend == Backend::Sqlite && is_sqlite_memory(database_url);
        if backend == Backend::Sqlite && !in_memory {
            prepare_sqlite_file(database_url).await?;
        }
        let mut pool_options = AnyPoolOptions::new().acquire_timeout(options.acquire_timeout);
        pool_options = match backend {
            Backend::Postgres => pool_options.max_connections(10),
            // An in-memory database lives as long as its one connection.
            Backend::Sqlite if in_memory => pool_options.max_connections(1).idle_timeout(None).max_lifetime(None),
            Backend::Sqlite => pool_options.max_connections(4),
        };
        let pool = pool_options.connect(database_url).await?;
        match backend {
            Backend::Postgres => POSTGRES_MIGRATIONS.run(&pool).await?,
            Backend::Sqlite => SQLITE_MIGRATIONS.run(&pool).await?,
        }
        let api_key_hmac_key = sealing::prepare(&pool, backend, &secrets).await?;
        let (versions, _) = watch::channel(0);
        let (shutdown, shutdown_rx) = watch::channel(());
        let store = Store {
            inner: Arc::new(Inner {
                pool,
                backend,
                secrets,
                api_key_hmac_key,
                options: StoreOptions { keep_snapshots: options.keep_snapshots.max(1), ..options },
                versions,
                newest: std::sync::Mutex::default(),
                specs: SpecCache::default(),
                watch: Arc::default(),
                data_planes: data_planes::LiveDataPlanes::default(),
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

    /// Whether the version watcher is LISTENing or only polling (`/metrics`).
    pub fn watch_state(&self) -> &WatchState {
        &self.inner.watch
    }

    /// Key of the HMAC-SHA256 digests of API keys; created once per database.
    pub fn api_key_hmac_key(&self) -> &[u8] {
        &self.inner.api_key_hmac_key
    }

    pub fn secrets(&self) -> &SecretBox {
        &self.inner.secrets
    }

    /// The parsed specs, shared by uploads (`prepare`) and the snapshot build of every write.
    pub fn specs(&self) -> &SpecCache {
        &self.inner.specs
    }

    /// Largest spec text an upload may have (`--max-spec-bytes`).
    pub fn max_spec_bytes(&self) -> usize {
        self.inner.options.max_spec_bytes
    }

    /// How many versions the history keeps (`--keep-snapshots`).
    pub fn keep_snapshots(&self) -> u64 {
        self.inner.options.keep_snapshots
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
        let mut conn = self.inner.pool.acquire().await?;
        setting_in(&mut conn, key).await
    }

    /// Re-seals every secret of the database with `new`, in one transaction
    /// (see `sealing::rotate`). This store keeps the old key: open another
    /// with the new one to go on.
    pub async fn rotate_secret_key(&self, new: &SecretBox) -> Result<Rotated, StoreError> {
        sealing::rotate(&self.inner.pool, self.inner.backend, &self.inner.secrets, new).await
    }

    /// Stores `value` unless the key already has one; returns what is stored.
    pub async fn insert_setting_if_absent(&self, key: &str, value: &str) -> Result<String, StoreError> {
        insert_setting_if_absent(&self.inner.pool, key, value).await
    }

    pub fn current_version(&self) -> u64 {
        *self.inner.versions.borrow()
    }

    /// Closes the connection pool; later calls fail. For orderly shutdown.
    /// Writes the data planes' records still in memory, then closes the pool.
    pub async fn close(&self) {
        if let Err(error) = self.flush_data_planes().await {
            tracing::warn!(%error, "cannot write the data planes' last state before closing");
        }
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
    pub async fn write<'n, T, E>(
        &self,
        note: impl Into<Note<'n>>,
        change: impl FnOnce(&mut Config) -> Result<T, E> + Send,
    ) -> Result<Committed<T>, WriteError<E>> {
        let note = note.into();
        let (_writer, mut tx) = begin_write(&self.inner.pool, self.inner.backend).await?;

        // Read only after the lock, so the previous writer's commit is visible.
        let latest = latest_head(&mut tx).await?;
        // Sealing with a key the database no longer records would leave values nobody else can open.
        if let Some(stored) = setting_in(&mut tx, sealing::KEY_ID_SETTING).await?
            && stored != self.inner.secrets.key_id()
        {
            return Err(WriteError::Store(StoreError::SecretKeyRotated { stored }));
        }
        let before = self.config_at(&mut tx, latest.as_ref().map(|(version, _)| *version)).await?;
        let mut config = Config::clone(&before);
        // An error drops `tx`, which rolls back.
        let value = change(&mut config).map_err(WriteError::Rejected)?;
        // Sorted, the config lines up index for index with the canonical snapshot.
        resources::sort(&mut config);

        let mut snapshot =
            build_snapshot(&config, &self.inner.secrets, &self.inner.api_key_hmac_key, &self.inner.specs)
                .map_err(WriteError::Invalid)?;
        let writes = resources::row_writes(&before, &config)?;
        if let Some((version, hash)) = &latest
            && *hash == snapshot.hash
            && writes.is_empty()
        {
            drop(tx);
            return Ok(Committed { value, version: *version, changed: false });
        }
        // A change the data planes cannot see (say a spec's read-only title)
        // still gets a version, with an unchanged hash, so that the history and
        // rollback reproduce the configuration exactly.

        let now = now_ms();
        for (kind, name, body) in &writes.upserts {
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
        for (kind, name) in &writes.deletes {
            sqlx::query("DELETE FROM resources WHERE kind = $1 AND name = $2")
                .bind(resources::kind_name(*kind))
                .bind(name.as_str())
                .execute(&mut *tx)
                .await?;
        }

        let version = latest.as_ref().map_or(1, |(version, _)| version + 1);
        let db_version = to_db(version, "version")?;
        snapshot.version = version;
        // What data planes are sent, spec texts included.
        let size_bytes = snapshot.encoded_len();
        let stowed = spec_contents::stow(&mut tx, db_version, &mut config, &mut snapshot).await?;
        // Encoded straight into the sealed buffer and sealed in place: the
        // snapshot is never stored, nor copied, in clear.
        let sealed = self.inner.secrets.seal_blob(snapshot.encoded_len(), |buf| snapshot.encode_raw(buf));
        let config_json = serde_json::to_string(&config);
        stowed.restore(&mut config, &mut snapshot);
        let config_json = config_json.map_err(|e| StoreError::Encode {
            kind: "config".into(),
            name: format!("version {version}"),
            reason: e.to_string(),
        })?;
        sqlx::query(
            "INSERT INTO snapshots (version, hash, created_at, config, snapshot, size_bytes, note, author) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(db_version)
        .bind(snapshot.hash.as_str())
        .bind(now)
        .bind(config_json)
        .bind(sealed)
        .bind(to_db(size_bytes as u64, "snapshot size")?)
        .bind(note.summary)
        .bind(note.author)
        .execute(&mut *tx)
        .await?;
        // Retention, in the same transaction: the history never holds more
        // than `keep_snapshots` versions, whoever writes.
        if let Some(oldest_kept) = version.checked_sub(self.inner.options.keep_snapshots - 1).filter(|v| *v > 1) {
            let oldest_kept = to_db(oldest_kept, "version")?;
            sqlx::query("DELETE FROM snapshots WHERE version < $1").bind(oldest_kept).execute(&mut *tx).await?;
            spec_contents::prune(&mut tx, oldest_kept).await?;
        }
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
            upserted = writes.upserts.len(),
            deleted = writes.deletes.len(),
            size_bytes,
            note = note.summary,
            author = note.author,
            "configuration committed"
        );
        // The specs of this configuration stay parsed; replaced ones are dropped.
        self.inner.specs.sweep();
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

/// Takes the store's write lock and opens the transaction it guards: on
/// PostgreSQL an advisory lock shared by every control plane on the database,
/// on SQLite the process-wide writer queue and an IMMEDIATE transaction (which
/// takes SQLite's write lock up front: a deferred one that reads first could
/// not upgrade after another connection wrote).
async fn begin_write(
    pool: &AnyPool,
    backend: Backend,
) -> Result<(Option<tokio::sync::MutexGuard<'static, ()>>, Transaction<'static, Any>), StoreError> {
    match backend {
        Backend::Sqlite => {
            let writer = SQLITE_WRITER.lock().await;
            Ok((Some(writer), pool.begin_with("BEGIN IMMEDIATE").await?))
        }
        Backend::Postgres => {
            let mut tx = pool.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(WRITE_LOCK_KEY).execute(&mut *tx).await?;
            Ok((None, tx))
        }
    }
}

async fn setting_in(conn: &mut AnyConnection, key: &str) -> Result<Option<String>, StoreError> {
    let row = sqlx::query("SELECT value FROM settings WHERE key = $1").bind(key).fetch_optional(&mut *conn).await?;
    Ok(row.map(|r| r.try_get("value")).transpose()?)
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

/// Creates the file if missing, readable by its owner only, and switches it
/// to WAL (readers never block the writer). WAL is a property of the file, so
/// one connection sets it for every later one, including the `Any` pool's
/// which cannot set pragmas. SQLite creates the `-wal` and `-shm` files with
/// the database file's mode, so they are private too.
async fn prepare_sqlite_file(url: &str) -> Result<(), StoreError> {
    let options = SqliteConnectOptions::from_str(url)?;
    private_file(options.get_filename())?;
    let options =
        options.create_if_missing(true).journal_mode(SqliteJournalMode::Wal).busy_timeout(Duration::from_secs(5));
    let conn = options.connect().await?;
    conn.close().await?;
    Ok(())
}

/// The database holds hashed and sealed secrets and the whole configuration:
/// create it 0600, and take group and other access away from one an older
/// release created (and from its `-wal` and `-shm`).
fn private_file(path: &std::path::Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let io = |source| StoreError::DatabaseFile { path: path.to_owned(), source };
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = std::path::PathBuf::from(file);
        let Ok(meta) = std::fs::metadata(&file) else { continue };
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode & 0o700)).map_err(io)?;
            tracing::warn!(path = %file.display(), "the database file was readable by group or others; made it private (0600)");
        }
    }
    Ok(())
}

fn to_db(value: u64, what: &'static str) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { what, value })
}

/// Wall-clock now in unix milliseconds: the unit of `updated_at`, `created_at`
/// and a data plane's `last_seen`.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
