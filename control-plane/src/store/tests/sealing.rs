//! Secrets at rest in the store: sealed snapshots and HMAC key, the data
//! migration of what an older release stored in clear, the secret key check,
//! retention, and key rotation; on SQLite and PostgreSQL.

use super::*;
use crate::model::{Certificate, Consumer};
use crate::secrets::is_sealed_blob;

const JWT_SECRET: &str = "jwt-secret-that-must-never-be-stored-in-clear";

/// A certificate and its private key, real ones: a snapshot is checked as a
/// data plane would load it.
fn site() -> &'static (String, String) {
    static SITE: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    SITE.get_or_init(|| {
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate =
            rcgen::CertificateParams::new(vec!["site.example".to_string()]).unwrap().self_signed(&key).unwrap();
        (certificate.pem(), key.serialize_pem())
    })
}

/// The private key's first line of base64: what must never be found in clear.
fn private_key_body() -> &'static str {
    site().1.lines().nth(1).unwrap()
}

on_both_stores!(
    snapshots_and_the_hmac_key_are_sealed,
    what_an_older_release_left_in_clear_is_sealed_at_open,
    another_secret_key_is_refused_at_open,
    retention_keeps_the_newest_versions,
    rotation_reseals_everything_in_one_go,
);

/// A consumer with a JWT secret and a certificate with a private key, sealed as the admin API stores them.
fn add_secrets(secrets: &SecretBox) -> impl FnOnce(&mut Config) -> Result<(), Infallible> + Send + use<> {
    let consumer: Consumer = serde_json::from_value(json!({
        "username": "alice",
        "jwt": [{ "key": "alice-key", "algorithm": "HS256", "secret_sealed": secrets.seal(JWT_SECRET.as_bytes()) }],
    }))
    .unwrap();
    let certificate: Certificate = serde_json::from_value(json!({
        "name": "site", "chain": site().0,
        "key_sealed": secrets.seal(site().1.as_bytes()),
    }))
    .unwrap();
    move |config| {
        config.consumers.push(consumer);
        config.certificates.push(certificate);
        Ok(())
    }
}

/// Every needle in clear, and in hex (how PostgreSQL shows bytea as text).
fn needles(store: &Store) -> Vec<Vec<u8>> {
    let hmac_hex = hex::encode(store.api_key_hmac_key());
    let mut needles: Vec<Vec<u8>> = vec![
        JWT_SECRET.into(),
        private_key_body().into(),
        hmac_hex.clone().into_bytes(),
        store.api_key_hmac_key().to_vec(),
    ];
    needles.extend([hex::encode(JWT_SECRET).into_bytes(), hex::encode(&hmac_hex).into_bytes()]);
    needles
}

/// Every row of every table, as bytes (text columns as text, blobs as stored).
async fn dump(store: &Store) -> Vec<u8> {
    let mut out = Vec::new();
    for row in sqlx::query("SELECT kind, name, body FROM resources").fetch_all(&store.inner.pool).await.unwrap() {
        for column in ["kind", "name", "body"] {
            out.extend(row.try_get::<String, _>(column).unwrap().into_bytes());
        }
    }
    for row in sqlx::query("SELECT config, snapshot, note FROM snapshots").fetch_all(&store.inner.pool).await.unwrap() {
        out.extend(row.try_get::<String, _>("config").unwrap().into_bytes());
        out.extend(row.try_get::<Vec<u8>, _>("snapshot").unwrap());
    }
    for row in sqlx::query("SELECT key, value FROM settings").fetch_all(&store.inner.pool).await.unwrap() {
        out.extend(row.try_get::<String, _>("value").unwrap().into_bytes());
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The SQLite file and its WAL, as they are on disk.
fn sqlite_files(db: &TestDb) -> Vec<u8> {
    let path = db.url.trim_start_matches("sqlite://").to_string();
    ["", "-wal", "-shm"]
        .iter()
        .flat_map(|suffix| std::fs::read(format!("{path}{suffix}")).unwrap_or_default())
        .collect()
}

async fn snapshots_and_the_hmac_key_are_sealed(db: &TestDb) {
    let store = db.open().await;
    store.write("secrets", add_secrets(store.secrets())).await.unwrap();
    let needles = needles(&store);
    let rows = dump(&store).await;
    for needle in &needles {
        assert!(!contains(&rows, needle), "{:?} stored in clear", String::from_utf8_lossy(needle));
    }
    for row in sqlx::query("SELECT snapshot FROM snapshots").fetch_all(&store.inner.pool).await.unwrap() {
        assert!(is_sealed_blob(&row.try_get::<Vec<u8>, _>("snapshot").unwrap()));
    }
    // Read back by a store that did not commit it: opened in memory only.
    let other = db.open().await;
    let snapshot = other.snapshot(2).await.unwrap().unwrap();
    assert_eq!(snapshot.consumers[0].jwt_credentials[0].secret, JWT_SECRET);
    assert_eq!(snapshot.certificates[0].private_key_pem, site().1);
    assert_eq!(snapshot.api_key_hmac_key, store.api_key_hmac_key());
    assert_eq!(other.api_key_hmac_key(), store.api_key_hmac_key());
    other.close().await;
    store.close().await;
    if db.postgres.is_none() {
        let files = sqlite_files(db);
        for needle in &needles {
            assert!(!contains(&files, needle), "{:?} in the SQLite files", String::from_utf8_lossy(needle));
        }
        use std::os::unix::fs::PermissionsExt as _;
        let path = db.url.trim_start_matches("sqlite://").to_string();
        for suffix in ["", "-wal", "-shm"] {
            if let Ok(meta) = std::fs::metadata(format!("{path}{suffix}")) {
                assert_eq!(meta.permissions().mode() & 0o777, 0o600, "sluice.db{suffix}");
            }
        }
    }
}

async fn what_an_older_release_left_in_clear_is_sealed_at_open(db: &TestDb) {
    let store = db.open().await;
    store.write("secrets", add_secrets(store.secrets())).await.unwrap();
    let hmac_key = store.api_key_hmac_key().to_vec();
    let needles = needles(&store);
    // Put the tables back the way a release before 0002 left them.
    let pool = &store.inner.pool;
    for row in sqlx::query("SELECT version, snapshot FROM snapshots").fetch_all(pool).await.unwrap() {
        let version: i64 = row.try_get("version").unwrap();
        let plain = store.secrets().open_blob(row.try_get("snapshot").unwrap()).unwrap();
        sqlx::query("UPDATE snapshots SET snapshot = $1 WHERE version = $2")
            .bind(plain)
            .bind(version)
            .execute(pool)
            .await
            .unwrap();
    }
    sqlx::query("DELETE FROM settings WHERE key IN ('api_key_hmac_key_sealed', 'sealed_at_rest', 'secret_key_id')")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO settings (key, value) VALUES ('api_key_hmac_key', $1)")
        .bind(hex::encode(&hmac_key))
        .execute(pool)
        .await
        .unwrap();
    assert!(contains(&dump(&store).await, JWT_SECRET.as_bytes()), "the simulated old tables hold the secret");
    store.close().await;

    let reopened = db.open().await;
    assert_eq!(reopened.api_key_hmac_key(), hmac_key, "the same HMAC key, so API key digests still match");
    let rows = dump(&reopened).await;
    for needle in &needles {
        assert!(!contains(&rows, needle), "{:?} still in clear after the migration", String::from_utf8_lossy(needle));
    }
    assert_eq!(reopened.snapshot(2).await.unwrap().unwrap().consumers[0].jwt_credentials[0].secret, JWT_SECRET);
    reopened.close().await;
    if db.postgres.is_none() {
        // Freed pages zeroed and the WAL emptied: no copy left in the files either.
        let files = sqlite_files(db);
        for needle in &needles {
            assert!(!contains(&files, needle), "{:?} left in the SQLite files", String::from_utf8_lossy(needle));
        }
    }
}

async fn another_secret_key_is_refused_at_open(db: &TestDb) {
    let store = db.open().await;
    store.write("secrets", add_secrets(store.secrets())).await.unwrap();
    store.close().await;
    let other = SecretBox::from_key_material(OTHER_KEY).unwrap();
    let error = Store::open(&db.url, other).await.unwrap_err();
    assert!(matches!(error, StoreError::WrongSecretKey { .. }), "{error}");
    assert!(error.to_string().contains("rotate-secret-key"), "{error}");
}

async fn retention_keeps_the_newest_versions(db: &TestDb) {
    let store = Store::open_with(&db.url, secrets(), StoreOptions { keep_snapshots: 3, ..StoreOptions::default() })
        .await
        .unwrap();
    for i in 0..5 {
        let name = format!("u{i}");
        store
            .write("add", move |config| {
                config.upstreams.push(upstream(&name));
                Ok::<_, Infallible>(())
            })
            .await
            .unwrap();
    }
    let versions: Vec<u64> = store.list_snapshots(None, 10).await.unwrap().iter().map(|s| s.version).collect();
    assert_eq!(versions, [6, 5, 4]);
    assert_eq!(store.lookup_snapshot(3).await.unwrap(), SnapshotLookup::Pruned { oldest_kept: 4 });
    assert_eq!(store.lookup_snapshot(1).await.unwrap(), SnapshotLookup::Pruned { oldest_kept: 4 });
    assert_eq!(store.lookup_snapshot(4).await.unwrap(), SnapshotLookup::Kept);
    assert_eq!(store.lookup_snapshot(7).await.unwrap(), SnapshotLookup::Unknown);
    assert_eq!(store.lookup_snapshot(0).await.unwrap(), SnapshotLookup::Unknown);
    assert_eq!(store.snapshot_config(3).await.unwrap(), None);
    store.close().await;
}

async fn rotation_reseals_everything_in_one_go(db: &TestDb) {
    let store = db.open().await;
    store.write("secrets", add_secrets(store.secrets())).await.unwrap();
    let hmac_key = store.api_key_hmac_key().to_vec();
    let before = dump(&store).await;
    let new = SecretBox::from_key_material(OTHER_KEY).unwrap();
    let rotated = store.rotate_secret_key(&new).await.unwrap();
    assert_eq!(rotated, Rotated { resources: 2, snapshots: 2 });
    assert_ne!(dump(&store).await, before);

    // The store still holding the old key keeps reading what it has, but may not write.
    let refused = store.write("after rotation", |config| {
        config.upstreams.push(upstream("late"));
        Ok::<_, Infallible>(())
    });
    assert!(matches!(refused.await, Err(WriteError::Store(StoreError::SecretKeyRotated { .. }))));
    store.close().await;

    assert!(matches!(Store::open(&db.url, secrets()).await, Err(StoreError::WrongSecretKey { .. })));
    let reopened = Store::open(&db.url, new).await.unwrap();
    assert_eq!(reopened.api_key_hmac_key(), hmac_key);
    let snapshot = reopened.snapshot(2).await.unwrap().unwrap();
    assert_eq!(snapshot.consumers[0].jwt_credentials[0].secret, JWT_SECRET);
    assert_eq!(snapshot.certificates[0].private_key_pem, site().1);
    // The configuration's sealed fields open with the new key too: a write rebuilds the snapshot from them.
    let committed = reopened
        .write("after restart", |config| {
            config.upstreams.push(upstream("late"));
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap();
    assert_eq!(committed.version, 3);
    assert_eq!(reopened.latest_snapshot().await.unwrap().consumers[0].jwt_credentials[0].secret, JWT_SECRET);
    reopened.close().await;
}
