//! The store's test suite, run once on a temporary SQLite file and once on a
//! fresh PostgreSQL database (`sluice_testkit::postgres`: skipped when
//! `SLUICE_TEST_DATABASE_URL` is unset, a failure under `CI=true`).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use sluice_testkit::postgres::FreshDatabase;

use super::*;
use crate::model::{Api, Upstream};

const TEST_KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
/// The key a rotation moves to.
const OTHER_KEY: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

fn secrets() -> SecretBox {
    SecretBox::from_key_material(TEST_KEY).expect("test key")
}

fn upstream(name: &str) -> Upstream {
    serde_json::from_value(json!({ "name": name, "targets": [{ "url": "http://127.0.0.1:9001" }] })).unwrap()
}

fn api(name: &str, upstream: &str) -> Api {
    serde_json::from_value(json!({ "name": name, "path_prefix": format!("/{name}"), "upstream": upstream })).unwrap()
}

/// A database for one test; dropped (PostgreSQL) or deleted (SQLite) afterwards.
struct TestDb {
    url: String,
    _dir: Option<tempfile::TempDir>,
    postgres: Option<FreshDatabase>,
}

impl TestDb {
    fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        TestDb { url, _dir: Some(dir), postgres: None }
    }

    /// None (test skipped) when no PostgreSQL is configured outside CI.
    async fn postgres() -> Option<TestDb> {
        let database = FreshDatabase::create("store").await.unwrap_or_else(|e| panic!("{e:#}"))?;
        Some(TestDb { url: database.url.clone(), _dir: None, postgres: Some(database) })
    }

    async fn open(&self) -> Store {
        Store::open(&self.url, secrets()).await.unwrap()
    }
}

/// Each name becomes `sqlite::name` and `postgres::name`, both running `name(&TestDb)`.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let db = super::TestDb::sqlite();
                    super::$name(&db).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(db) = super::TestDb::postgres().await else { return };
                    super::$name(&db).await;
                }
            )*
        }
    };
}

mod sealing;
mod spec_contents;

on_both_stores!(
    open_commits_version_one,
    write_commits_next_version,
    invalid_change_commits_nothing,
    unchanged_config_is_a_no_op,
    closure_error_rolls_back,
    concurrent_writes_get_consecutive_versions,
    subscribers_see_the_latest_version,
    data_planes_upsert_list_purge,
    reopening_keeps_everything,
    two_control_planes_see_each_others_writes,
);

async fn open_commits_version_one(db: &TestDb) {
    let store = db.open().await;
    assert_eq!(store.current_version(), 1);
    assert_eq!(*store.subscribe().borrow(), 1);
    assert_eq!(*store.config().await.unwrap(), Config::default());
    assert_eq!(store.api_key_hmac_key().len(), 32);
    assert_eq!(store.backend(), if db.postgres.is_some() { "postgres" } else { "sqlite" });

    let latest = store.latest_snapshot().await.unwrap();
    assert_eq!(latest.version, 1);
    assert_eq!(latest.api_key_hmac_key, store.api_key_hmac_key());
    assert!(latest.apis.is_empty() && latest.upstreams.is_empty());
    let history = store.list_snapshots(None, 10).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!((history[0].version, history[0].hash.as_str()), (1, latest.hash.as_str()));
    assert_eq!(store.snapshot_config(1).await.unwrap(), Some(Config::default()));
    assert_eq!(store.snapshot(2).await.unwrap(), None);
    if db.postgres.is_none() {
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&store.inner.pool).await.unwrap();
        assert_eq!(mode, "wal");
    }
    store.close().await;
}

async fn write_commits_next_version(db: &TestDb) {
    let store = db.open().await;
    let committed = store
        .write("add shop", |config| {
            config.upstreams.push(upstream("shop-backend"));
            config.apis.push(api("shop", "shop-backend"));
            Ok::<_, Infallible>("done")
        })
        .await
        .unwrap();
    assert_eq!(committed, Committed { value: "done", version: 2, changed: true });

    let config = store.config().await.unwrap();
    assert_eq!(config.upstreams, vec![upstream("shop-backend")]);
    assert_eq!(config.apis, vec![api("shop", "shop-backend")]);
    assert_eq!(store.snapshot_config(2).await.unwrap().as_ref(), Some(&*config));
    assert_eq!(store.snapshot_config(1).await.unwrap(), Some(Config::default()));

    let snapshot = store.snapshot(2).await.unwrap().expect("version 2 stored");
    assert_eq!(snapshot.version, 2);
    assert_eq!(snapshot.apis[0].name, "shop");
    assert_eq!(snapshot.upstreams[0].name, "shop-backend");
    // From memory (this store committed it), equal to what the database holds.
    assert_eq!(*store.latest_snapshot().await.unwrap(), snapshot);

    let history = store.list_snapshots(None, 10).await.unwrap();
    assert_eq!(history.iter().map(|s| s.version).collect::<Vec<_>>(), [2, 1]);
    assert_eq!(history[0].note, "add shop");
    assert_eq!(history[0].hash, snapshot.hash);
    assert_eq!(history[0].size_bytes, prost::Message::encoded_len(&snapshot) as u64);
    assert_ne!(history[0].hash, history[1].hash);
    assert_eq!(store.list_snapshots(Some(2), 10).await.unwrap().len(), 1);
    assert_eq!(store.list_snapshots(None, 1).await.unwrap()[0].version, 2);

    // Removing resources deletes their rows.
    let committed = store
        .write("remove shop", |config| {
            config.apis.clear();
            config.upstreams.clear();
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap();
    assert_eq!((committed.version, committed.changed), (3, true));
    assert_eq!(*store.config().await.unwrap(), Config::default());
    assert_eq!(store.latest_snapshot().await.unwrap().hash, history[1].hash, "same content as version 1");
    store.close().await;
}

async fn invalid_change_commits_nothing(db: &TestDb) {
    let store = db.open().await;
    let error = store
        .write("bad", |config| {
            config.apis.push(api("shop", "missing"));
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap_err();
    let WriteError::Invalid(violations) = error else { panic!("expected Invalid, got {error:?}") };
    assert!(violations.iter().any(|v| v.path == "/apis/shop/upstream"), "{violations:?}");
    assert_eq!(*store.config().await.unwrap(), Config::default());
    assert_eq!(store.list_snapshots(None, 10).await.unwrap().len(), 1);
    assert_eq!(store.current_version(), 1);
    store.close().await;
}

async fn unchanged_config_is_a_no_op(db: &TestDb) {
    let store = db.open().await;
    let add = |config: &mut Config| {
        config.upstreams.retain(|u| u.name != "backend");
        config.upstreams.push(upstream("backend"));
        Ok::<_, Infallible>(())
    };
    assert_eq!(store.write("first", add).await.unwrap().version, 2);
    let again = store.write("again", add).await.unwrap();
    assert_eq!((again.version, again.changed), (2, false));
    let nothing = store.write("nothing", |_| Ok::<_, Infallible>(7)).await.unwrap();
    assert_eq!(nothing, Committed { value: 7, version: 2, changed: false });
    assert_eq!(store.list_snapshots(None, 10).await.unwrap().len(), 2);
    store.close().await;
}

async fn closure_error_rolls_back(db: &TestDb) {
    let store = db.open().await;
    let error = store
        .write("refused", |config| {
            config.upstreams.push(upstream("backend"));
            Err::<(), _>("name taken")
        })
        .await
        .unwrap_err();
    assert!(matches!(error, WriteError::Rejected("name taken")), "{error:?}");
    assert_eq!(*store.config().await.unwrap(), Config::default());
    assert_eq!(store.current_version(), 1);
    // The store is still writable: nothing was left locked.
    let committed = store
        .write("ok", |config| {
            config.upstreams.push(upstream("backend"));
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap();
    assert_eq!(committed.version, 2);
    store.close().await;
}

async fn concurrent_writes_get_consecutive_versions(db: &TestDb) {
    let store = db.open().await;
    let tasks = (0..20)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write(&format!("add u{i:02}"), move |config| {
                        config.upstreams.push(upstream(&format!("u{i:02}")));
                        Ok::<_, Infallible>(())
                    })
                    .await
                    .unwrap()
                    .version
            })
        })
        .collect::<Vec<_>>();
    let mut versions = Vec::new();
    for task in tasks {
        versions.push(task.await.unwrap());
    }
    versions.sort_unstable();
    assert_eq!(versions, (2..=21).collect::<Vec<u64>>());
    let names = store.config().await.unwrap().upstreams.iter().map(|u| u.name.clone()).collect::<BTreeSet<_>>();
    assert_eq!(names, (0..20).map(|i| format!("u{i:02}")).collect());
    assert_eq!(store.current_version(), 21);
    assert_eq!(store.latest_snapshot().await.unwrap().upstreams.len(), 20);
    store.close().await;
}

async fn subscribers_see_the_latest_version(db: &TestDb) {
    let store = db.open().await;
    let mut versions = store.subscribe();
    assert_eq!(*versions.borrow_and_update(), 1);
    let writer = store.clone();
    tokio::spawn(async move {
        writer
            .write("add", |config| {
                config.upstreams.push(upstream("backend"));
                Ok::<_, Infallible>(())
            })
            .await
            .unwrap();
    });
    tokio::time::timeout(Duration::from_secs(10), versions.changed()).await.unwrap().unwrap();
    assert_eq!(*versions.borrow_and_update(), 2);

    // A second store on the same database (another control plane) learns of
    // the first one's writes through refresh_latest.
    let other = db.open().await;
    assert_eq!(other.current_version(), 2);
    store
        .write("more", |config| {
            config.upstreams.push(upstream("second"));
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap();
    {
        // Stores hear of each other's commits by themselves (NOTIFY on PostgreSQL, and a poll).
        let mut others = other.subscribe();
        tokio::time::timeout(Duration::from_secs(5), others.wait_for(|v| *v == 3)).await.unwrap().unwrap();
    }
    assert_eq!(other.refresh_latest().await.unwrap(), 3);
    assert_eq!(*other.subscribe().borrow(), 3);
    other.close().await;
    store.close().await;
}

async fn data_planes_upsert_list_purge(db: &TestDb) {
    let store = db.open().await;
    let node = |id: &str, seen: i64| DataPlaneRecord {
        node_id: id.into(),
        hostname: format!("{id}.local"),
        address: "10.0.0.1:50000".into(),
        software_version: "0.1.0".into(),
        protocol_version: 1,
        applied_version: None,
        applied_hash: None,
        last_ack_version: None,
        last_nack_version: None,
        last_nack_hash: None,
        last_error: None,
        connected: true,
        first_seen: seen,
        last_seen: seen,
    };
    store.upsert_data_plane(&node("b", 5_000)).await.unwrap();
    store.upsert_data_plane(&node("a", 1_000)).await.unwrap();
    let updated = DataPlaneRecord {
        applied_version: Some(2),
        applied_hash: Some("abc".into()),
        last_ack_version: Some(2),
        last_nack_version: Some(3),
        last_nack_hash: None,
        last_error: Some("spec does not compile".into()),
        connected: false,
        first_seen: 2_000,
        last_seen: 2_500,
        ..node("a", 0)
    };
    store.upsert_data_plane(&updated).await.unwrap();

    let listed = store.list_data_planes().await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0], DataPlaneRecord { first_seen: 1_000, ..updated.clone() }, "first_seen kept");
    assert_eq!(listed[1], node("b", 5_000));

    assert_eq!(store.purge_data_planes(3_000).await.unwrap(), 1);
    let listed = store.list_data_planes().await.unwrap();
    assert_eq!(listed.iter().map(|r| r.node_id.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(store.purge_data_planes(3_000).await.unwrap(), 0);

    // A fleet's records, flushed over several statements (the last one partly
    // filled), reach the database whole and each in its own row.
    let fleet: Vec<DataPlaneRecord> = (0..100)
        .map(|i| DataPlaneRecord { applied_version: Some(i), ..node(&format!("fleet-{i:03}"), 9_000 + i as i64) })
        .collect();
    for record in &fleet {
        store.record_data_plane(record.clone());
    }
    assert_eq!(store.flush_data_planes().await.unwrap(), 100);
    assert_eq!(store.flush_data_planes().await.unwrap(), 0, "nothing changed since");
    store.close().await;
    let reopened = db.open().await;
    let listed = reopened.list_data_planes().await.unwrap();
    let flushed: Vec<_> = listed.into_iter().filter(|r| r.node_id.starts_with("fleet-")).collect();
    assert_eq!(flushed, fleet);
    reopened.close().await;
}

async fn reopening_keeps_everything(db: &TestDb) {
    let store = db.open().await;
    store
        .write("add", |config| {
            config.upstreams.push(upstream("backend"));
            config.apis.push(api("shop", "backend"));
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap();
    let key = store.api_key_hmac_key().to_vec();
    let config = store.config().await.unwrap();
    let history = store.list_snapshots(None, 10).await.unwrap();
    store.close().await;
    drop(store);

    let store = db.open().await;
    assert_eq!(store.api_key_hmac_key(), key.as_slice());
    assert_eq!(store.config().await.unwrap(), config);
    assert_eq!(store.current_version(), 2);
    assert_eq!(store.list_snapshots(None, 10).await.unwrap(), history);
    // The same content under the same key hashes the same, so reopening commits nothing.
    let again = store.write("noop", |_| Ok::<_, Infallible>(())).await.unwrap();
    assert_eq!((again.version, again.changed), (2, false));
    store.close().await;
}

#[tokio::test]
async fn in_memory_sqlite_works() {
    let store = Store::open("sqlite::memory:", secrets()).await.unwrap();
    assert_eq!(store.current_version(), 1);
    let committed = store
        .write("add", |config| {
            config.upstreams.push(upstream("backend"));
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap();
    assert_eq!(committed.version, 2);
    assert_eq!(store.config().await.unwrap().upstreams.len(), 1);
}

#[test]
fn unsupported_urls_name_only_the_scheme() {
    let error = Backend::of_url("mysql://root:hunter2@db/x").unwrap_err();
    assert!(matches!(&error, StoreError::UnsupportedUrl { scheme } if scheme == "mysql"));
    assert!(!error.to_string().contains("hunter2"));
}

/// Each store keeps the configuration of the newest version it saw in memory;
/// a write by another control plane on the same database must still be seen
/// by reads and kept by the next write here, never overwritten from a stale copy.
async fn two_control_planes_see_each_others_writes(db: &TestDb) {
    let first = db.open().await;
    let second = db.open().await;
    let add_upstream = |name: &'static str| {
        move |config: &mut Config| {
            config.upstreams.push(upstream(name));
            Ok::<_, Infallible>(())
        }
    };
    first.write("first: a", add_upstream("a")).await.unwrap();
    assert_eq!(first.config().await.unwrap().upstreams, vec![upstream("a")]);

    second.write("second: b", add_upstream("b")).await.unwrap();
    assert_eq!(first.config().await.unwrap().upstreams, vec![upstream("a"), upstream("b")]);
    let latest = first.latest_snapshot().await.unwrap();
    assert_eq!(latest.version, 3);
    assert_eq!(latest.upstreams.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);

    second.write("second: c", add_upstream("c")).await.unwrap();
    let committed = first.write("first: d", add_upstream("d")).await.unwrap();
    assert_eq!(committed.version, 5);
    let everything = vec![upstream("a"), upstream("b"), upstream("c"), upstream("d")];
    assert_eq!(first.config().await.unwrap().upstreams, everything);
    assert_eq!(second.config().await.unwrap().upstreams, everything);
    // What the store wrote is what a fresh reader loads from the rows.
    let fresh = db.open().await;
    assert_eq!(fresh.config().await.unwrap().upstreams, everything);
    assert_eq!(fresh.snapshot_config(5).await.unwrap().map(|c| c.upstreams), Some(everything));
    first.close().await;
    second.close().await;
    fresh.close().await;
}
