//! Secrets at rest in the store's own tables, beside the sealed fields of the
//! resources: which key seals them (its id, checked at open and by every
//! write), the API-key HMAC key, and every stored snapshot, sealed whole.
//! At open, [`prepare`] checks the key and seals, once and in one
//! transaction, what a release before 0002 kept in clear; `rotate` re-seals
//! everything under a new key, also in one transaction.

use sqlx::{AnyConnection, AnyPool, Row};

use super::{Backend, StoreError, begin_write, insert_setting_if_absent, setting_in};
use crate::model::{Certificate, Config, Consumer};
use crate::secrets::{SecretBox, SecretError, is_sealed_blob};

/// The [`SecretBox::key_id`] of the key everything is sealed with.
pub(super) const KEY_ID_SETTING: &str = "secret_key_id";
/// The API-key HMAC key (hex), sealed.
const HMAC_KEY_SETTING: &str = "api_key_hmac_key_sealed";
/// Where releases before 0002 kept the HMAC key, in clear.
const LEGACY_HMAC_KEY_SETTING: &str = "api_key_hmac_key";
/// Present once the snapshots and the HMAC key of an older release are sealed.
const SEALED_SETTING: &str = "sealed_at_rest";

/// What a rotation re-sealed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rotated {
    pub resources: u64,
    pub snapshots: u64,
}

/// Checks `secrets` against the database's key, seals what an older release
/// left in clear, and returns the API-key HMAC key (created on first open).
pub(super) async fn prepare(pool: &AnyPool, backend: Backend, secrets: &SecretBox) -> Result<Vec<u8>, StoreError> {
    // One connection at a time: an in-memory SQLite database has only one.
    match setting(pool, KEY_ID_SETTING).await? {
        Some(id) if id != secrets.key_id() => return Err(StoreError::WrongSecretKey { stored: id }),
        Some(_) => {}
        None => {
            // First open by a release that records the key: make sure it is the one the sealed fields were made with.
            check_opens_resources(&mut *pool.acquire().await?, secrets).await?;
            let stored = insert_setting_if_absent(pool, KEY_ID_SETTING, secrets.key_id()).await?;
            if stored != secrets.key_id() {
                return Err(StoreError::WrongSecretKey { stored });
            }
        }
    }
    if setting(pool, SEALED_SETTING).await?.is_none() {
        seal_legacy(pool, backend, secrets).await?;
    }

    let fresh = secrets.seal(hex::encode(crate::credentials::random_bytes::<32>()).as_bytes());
    let sealed = insert_setting_if_absent(pool, HMAC_KEY_SETTING, &fresh).await?;
    let corrupt = |reason: String| StoreError::CorruptSetting { key: HMAC_KEY_SETTING.into(), reason };
    let text = secrets.open(&sealed).map_err(|e| corrupt(e.to_string()))?;
    let key = hex::decode(text.trim_ascii()).map_err(|e| corrupt(format!("not hex: {e}")))?;
    if key.len() < 16 {
        return Err(corrupt("shorter than 16 bytes".into()));
    }
    Ok(key)
}

async fn setting(pool: &AnyPool, key: &str) -> Result<Option<String>, StoreError> {
    let mut conn = pool.acquire().await?;
    setting_in(&mut conn, key).await
}

/// Opens one sealed field of the stored resources, if there is any, with `secrets`.
async fn check_opens_resources(conn: &mut AnyConnection, secrets: &SecretBox) -> Result<(), StoreError> {
    let rows = sqlx::query("SELECT kind, body FROM resources WHERE kind IN ('certificate', 'consumer')")
        .fetch_all(&mut *conn)
        .await?;
    for row in &rows {
        let kind: String = row.try_get("kind")?;
        let body: String = row.try_get("body")?;
        let sealed = if kind == "certificate" {
            serde_json::from_str::<Certificate>(&body).ok().and_then(|c| c.key_sealed)
        } else {
            serde_json::from_str::<Consumer>(&body).ok().and_then(|c| c.jwt.into_iter().find_map(|j| j.secret_sealed))
        };
        if let Some(sealed) = sealed {
            return match secrets.open(&sealed) {
                Ok(_) => Ok(()),
                Err(_) => Err(StoreError::WrongSecretKey { stored: "(not recorded)".into() }),
            };
        }
    }
    Ok(())
}

/// Seals the snapshots and the HMAC key that a release before 0002 stored in
/// clear. One transaction under the write lock, so a concurrent start of
/// another control plane either does it or finds it done. On SQLite the
/// freed pages are zeroed and the WAL emptied, so the clear copies do not
/// linger in the files.
async fn seal_legacy(pool: &AnyPool, backend: Backend, secrets: &SecretBox) -> Result<(), StoreError> {
    let (_writer, mut tx) = begin_write(pool, backend).await?;
    if setting_in(&mut tx, SEALED_SETTING).await?.is_some() {
        return Ok(());
    }
    if backend == Backend::Sqlite {
        // Pages freed from here on are zeroed, not left holding what they held.
        sqlx::query("PRAGMA secure_delete = ON").execute(&mut *tx).await?;
    }
    let versions = snapshot_versions(&mut tx).await?;
    let mut sealed = 0;
    for version in versions {
        let row =
            sqlx::query("SELECT snapshot FROM snapshots WHERE version = $1").bind(version).fetch_one(&mut *tx).await?;
        let bytes: Vec<u8> = row.try_get("snapshot")?;
        if is_sealed_blob(&bytes) {
            continue;
        }
        let blob = secrets.seal_blob(bytes.len(), |buf| buf.extend_from_slice(&bytes));
        sqlx::query("UPDATE snapshots SET snapshot = $1 WHERE version = $2")
            .bind(blob)
            .bind(version)
            .execute(&mut *tx)
            .await?;
        sealed += 1;
    }
    if let Some(legacy) = setting_in(&mut tx, LEGACY_HMAC_KEY_SETTING).await? {
        sqlx::query("INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
            .bind(HMAC_KEY_SETTING)
            .bind(secrets.seal(legacy.trim().as_bytes()))
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM settings WHERE key = $1").bind(LEGACY_HMAC_KEY_SETTING).execute(&mut *tx).await?;
    }
    sqlx::query("INSERT INTO settings (key, value) VALUES ($1, 'v1')").bind(SEALED_SETTING).execute(&mut *tx).await?;
    if backend == Backend::Sqlite {
        sqlx::query("PRAGMA secure_delete = OFF").execute(&mut *tx).await?;
    }
    tx.commit().await?;
    if backend == Backend::Sqlite {
        // Until checkpointed, the WAL still holds the pages as they were.
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(pool).await?;
    }
    if sealed > 0 {
        tracing::info!(snapshots = sealed, "sealed the snapshots an older release stored in clear");
    }
    Ok(())
}

/// Re-seals every sealed value (resource fields, snapshot configurations and
/// blobs, the HMAC key) from `old` to `new` and records `new`'s id, in one
/// transaction under the write lock: until it commits every reader still
/// opens everything with `old`, and a failure leaves everything as it was.
pub(super) async fn rotate(
    pool: &AnyPool,
    backend: Backend,
    old: &SecretBox,
    new: &SecretBox,
) -> Result<Rotated, StoreError> {
    let (_writer, mut tx) = begin_write(pool, backend).await?;
    if let Some(stored) = setting_in(&mut tx, KEY_ID_SETTING).await?
        && stored != old.key_id()
    {
        return Err(StoreError::WrongSecretKey { stored });
    }
    let mut rotated = Rotated::default();
    let rows = sqlx::query("SELECT kind, name, body FROM resources WHERE kind IN ('certificate', 'consumer')")
        .fetch_all(&mut *tx)
        .await?;
    for row in &rows {
        let (kind, name, body): (String, String, String) =
            (row.try_get("kind")?, row.try_get("name")?, row.try_get("body")?);
        let corrupt = |reason: String| StoreError::CorruptResource { kind: kind.clone(), name: name.clone(), reason };
        let body = if kind == "certificate" {
            let mut certificate: Certificate = serde_json::from_str(&body).map_err(|e| corrupt(e.to_string()))?;
            reseal_certificate(&mut certificate, old, new).map_err(|e| corrupt(e.to_string()))?;
            serde_json::to_string(&certificate)
        } else {
            let mut consumer: Consumer = serde_json::from_str(&body).map_err(|e| corrupt(e.to_string()))?;
            reseal_consumer(&mut consumer, old, new).map_err(|e| corrupt(e.to_string()))?;
            serde_json::to_string(&consumer)
        }
        .map_err(|e| corrupt(e.to_string()))?;
        sqlx::query("UPDATE resources SET body = $1 WHERE kind = $2 AND name = $3")
            .bind(body)
            .bind(&kind)
            .bind(&name)
            .execute(&mut *tx)
            .await?;
        rotated.resources += 1;
    }

    let versions = snapshot_versions(&mut tx).await?;
    for version in versions {
        let corrupt = |reason: String| StoreError::CorruptSnapshot { version, reason };
        let row = sqlx::query("SELECT config, snapshot FROM snapshots WHERE version = $1")
            .bind(version)
            .fetch_one(&mut *tx)
            .await?;
        let mut config: Config =
            serde_json::from_str(&row.try_get::<String, _>("config")?).map_err(|e| corrupt(format!("config: {e}")))?;
        for certificate in &mut config.certificates {
            reseal_certificate(certificate, old, new).map_err(|e| corrupt(e.to_string()))?;
        }
        for consumer in &mut config.consumers {
            reseal_consumer(consumer, old, new).map_err(|e| corrupt(e.to_string()))?;
        }
        let config = serde_json::to_string(&config).map_err(|e| corrupt(e.to_string()))?;
        let plain = old.open_blob(row.try_get("snapshot")?).map_err(|e| corrupt(format!("snapshot: {e}")))?;
        let blob = new.seal_blob(plain.len(), |buf| buf.extend_from_slice(&plain));
        sqlx::query("UPDATE snapshots SET config = $1, snapshot = $2 WHERE version = $3")
            .bind(config)
            .bind(blob)
            .bind(version)
            .execute(&mut *tx)
            .await?;
        rotated.snapshots += 1;
    }

    if let Some(sealed) = setting_in(&mut tx, HMAC_KEY_SETTING).await? {
        let corrupt = |reason: String| StoreError::CorruptSetting { key: HMAC_KEY_SETTING.into(), reason };
        let resealed = reseal(&sealed, old, new).map_err(|e| corrupt(e.to_string()))?;
        update_setting(&mut tx, HMAC_KEY_SETTING, &resealed).await?;
    }
    update_setting(&mut tx, KEY_ID_SETTING, new.key_id()).await?;
    tx.commit().await?;
    Ok(rotated)
}

/// Every stored snapshot's version: the snapshots themselves are then read
/// one at a time, so a history of big snapshots never sits in memory at once.
async fn snapshot_versions(conn: &mut AnyConnection) -> Result<Vec<i64>, StoreError> {
    let rows = sqlx::query("SELECT version FROM snapshots").fetch_all(conn).await?;
    Ok(rows.iter().map(|row| row.try_get("version")).collect::<Result<_, _>>()?)
}

async fn update_setting(conn: &mut AnyConnection, key: &str, value: &str) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )
    .bind(key)
    .bind(value)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

fn reseal(sealed: &str, old: &SecretBox, new: &SecretBox) -> Result<String, SecretError> {
    Ok(new.seal(&old.open(sealed)?))
}

fn reseal_certificate(certificate: &mut Certificate, old: &SecretBox, new: &SecretBox) -> Result<(), SecretError> {
    if let Some(sealed) = &mut certificate.key_sealed {
        *sealed = reseal(sealed, old, new)?;
    }
    Ok(())
}

fn reseal_consumer(consumer: &mut Consumer, old: &SecretBox, new: &SecretBox) -> Result<(), SecretError> {
    for sealed in consumer.jwt.iter_mut().filter_map(|jwt| jwt.secret_sealed.as_mut()) {
        *sealed = reseal(sealed, old, new)?;
    }
    Ok(())
}
