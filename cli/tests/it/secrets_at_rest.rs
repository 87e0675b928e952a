//! Secrets at rest, as an operator with a copy of the files would look for
//! them: a control plane and a data plane with a snapshot cache hold a JWT
//! secret, a basic-auth password, an API key, a TLS private key and the
//! API-key HMAC key, and the data plane uses them; then every byte of the
//! SQLite file, its WAL and shared memory (or every row of every PostgreSQL
//! table), the snapshot cache and the processes' logs is searched for each
//! secret, in clear and hex-encoded. Also: file modes, retention with
//! rollback to a pruned version, and secret-key rotation under a running
//! control plane.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use reqwest::Method;
use serde_json::{Value, json};
use sluice_control_plane::secrets::SecretBox;
use sluice_control_plane::store::Store;
use sqlx::{Connection, Row};

use crate::support::{
    ADMIN_TOKEN, Admin, CLUSTER_TOKEN, all_applied, binary, control_plane_with, data_plane_with, eventually, upstream,
};
use sluice_testkit::postgres::FreshDatabase;

const JWT_SECRET: &str = "jwt-hmac-secret-4f1d9c7a2b8e";
const PASSWORD: &str = "basic-password-9b2c7e1f";
const API_KEY: &str = "api-key-7c3e9a1d5f";

struct Secrets {
    /// Each secret by name, in clear.
    needles: Vec<(&'static str, Vec<u8>)>,
    private_key_pem: String,
    chain_pem: String,
}

fn secrets() -> Result<Secrets> {
    let generated = rcgen::generate_simple_self_signed(vec!["site.example".to_string()])?;
    let private_key_pem = generated.signing_key.serialize_pem();
    // A line of the key's base64 body: what a leaked PEM would show.
    let body_line = private_key_pem.lines().nth(1).context("PEM body")?.to_string();
    Ok(Secrets {
        needles: vec![
            ("JWT secret", JWT_SECRET.into()),
            ("basic-auth password", PASSWORD.into()),
            ("API key", API_KEY.into()),
            ("TLS private key", body_line.into_bytes()),
            ("cluster token", CLUSTER_TOKEN.into()),
            ("admin token", ADMIN_TOKEN.into()),
        ],
        private_key_pem,
        chain_pem: generated.cert.pem(),
    })
}

/// The names of the needles found in `haystack`, in clear or as lowercase hex.
fn found(haystack: &[u8], needles: &[(&'static str, Vec<u8>)]) -> Vec<&'static str> {
    let contains = |needle: &[u8]| haystack.windows(needle.len()).any(|w| w == needle);
    needles
        .iter()
        .filter(|(_, needle)| contains(needle) || contains(hex::encode(needle).as_bytes()))
        .map(|(name, _)| *name)
        .collect()
}

async fn configure(admin: &Admin, secrets: &Secrets, backend: std::net::SocketAddr) -> Result<()> {
    admin
        .ok(
            Method::POST,
            "/v1/certificates",
            Some(json!({ "name": "site", "chain": secrets.chain_pem, "key": secrets.private_key_pem })),
        )
        .await?;
    admin
        .ok(
            Method::POST,
            "/v1/consumers",
            Some(json!({
                "username": "alice",
                "basic_auth": { "password": PASSWORD },
                "api_keys": [{ "key": API_KEY }],
                "jwt": [{ "key": "alice-issuer", "algorithm": "HS256", "secret": JWT_SECRET }],
            })),
        )
        .await?;
    admin.create_upstream("backend", backend).await?;
    admin
        .ok(
            Method::POST,
            "/v1/apis",
            Some(json!({ "name": "jwt", "path_prefix": "/jwt", "upstream": "backend", "policies": [{ "jwt": {} }] })),
        )
        .await?;
    Ok(())
}

/// A request the data plane can only authenticate with the JWT secret it was sent.
async fn jwt_request_passes(proxy: std::net::SocketAddr) -> Result<bool> {
    let claims = json!({ "iss": "alice-issuer", "exp": 4_102_444_800u64 });
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes())?,
    )?;
    let response = reqwest::Client::new().get(format!("http://{proxy}/jwt/x")).bearer_auth(token).send().await?;
    Ok(response.status() == 200)
}

fn mode(path: &Path) -> Result<u32> {
    Ok(std::fs::metadata(path).with_context(|| path.display().to_string())?.permissions().mode() & 0o777)
}

/// Every row of every table of the database, as text (bytea as `\x` hex).
async fn postgres_rows(url: &str) -> Result<Vec<u8>> {
    let mut connection = sqlx::PgConnection::connect(url).await?;
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'")
            .fetch_all(&mut connection)
            .await?;
    ensure!(tables.iter().any(|t| t == "snapshots"), "tables: {tables:?}");
    let mut rows = Vec::new();
    for table in &tables {
        let query = format!("SELECT t::text AS row FROM \"{table}\" t");
        for row in sqlx::query(sqlx::AssertSqlSafe(query)).fetch_all(&mut connection).await? {
            rows.extend(row.try_get::<String, _>("row")?.into_bytes());
            rows.push(b'\n');
        }
    }
    connection.close().await?;
    Ok(rows)
}

async fn nothing_in_clear(postgres: Option<&str>) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let secrets = secrets()?;
    // The search finds what it looks for: the key's PEM holds its body line.
    ensure!(found(secrets.private_key_pem.as_bytes(), &secrets.needles) == ["TLS private key"], "needles");
    let mut flags = Vec::new();
    if let Some(url) = postgres {
        flags.extend(["--database-url", url]);
    }
    let mut cp = control_plane_with(dir.path(), &flags).await?;
    let admin = Admin::new(cp.addr("admin_addr")?);
    let (_backend, backend_addr) = upstream("backend", "127.0.0.1:0").await?;
    configure(&admin, &secrets, backend_addr).await?;
    let version = admin.latest_version().await?;
    let cache = dir.path().join("snapshot.cache");
    let cache_arg = cache.display().to_string();
    let mut dp = data_plane_with(cp.addr("grpc_addr")?, "dp-secrets", &["--snapshot-cache", &cache_arg]).await?;
    eventually("the data plane to apply the secrets", || all_applied(&admin, version, 1)).await?;
    let proxy = dp.addr("http_addr")?;
    // The secrets reached the data plane whole: it verifies a token signed with the JWT secret.
    eventually("a JWT signed with the secret to pass", || async { jwt_request_passes(proxy).await.unwrap_or(false) })
        .await?;
    eventually("the cache to be written", || async { cache.exists() }).await?;

    let logs = format!("{}{}{}{}", cp.stderr(), cp.stdout(), dp.stderr(), dp.stdout());
    dp.kill().await?;
    cp.kill().await?;
    // Copied as the killed control plane left them (opening the store below checkpoints the WAL away).
    let mut files = Vec::new();
    for file in ["sluice.db", "sluice.db-wal", "sluice.db-shm"] {
        let path = dir.path().join(file);
        if let Ok(bytes) = std::fs::read(&path) {
            files.push((file, mode(&path)?, bytes));
        }
    }

    // The HMAC key lives only in the database, sealed: read it the way the control plane does.
    let url = postgres.map_or_else(|| format!("sqlite://{}", dir.path().join("sluice.db").display()), str::to_owned);
    let store = Store::open(&url, SecretBox::load_or_create(&dir.path().join("secret.key"))?).await?;
    let mut needles = secrets.needles;
    needles.push(("API-key HMAC key", store.api_key_hmac_key().to_vec()));
    needles.push(("API-key HMAC key (hex)", hex::encode(store.api_key_hmac_key()).into_bytes()));
    store.close().await;

    let cache_bytes = std::fs::read(&cache)?;
    ensure!(found(&cache_bytes, &needles).is_empty(), "in the snapshot cache: {:?}", found(&cache_bytes, &needles));
    ensure!(mode(&cache)? == 0o600, "snapshot cache mode {:o}", mode(&cache)?);
    ensure!(found(logs.as_bytes(), &needles).is_empty(), "in the logs: {:?}", found(logs.as_bytes(), &needles));
    ensure!(mode(&dir.path().join("secret.key"))? == 0o600, "secret key file mode");
    match postgres {
        Some(url) => {
            let rows = postgres_rows(url).await?;
            ensure!(found(&rows, &needles).is_empty(), "in PostgreSQL rows: {:?}", found(&rows, &needles));
        }
        None => {
            ensure!(files.len() == 3, "the database file, its WAL and shared memory: {}", files.len());
            for (file, mode, bytes) in &files {
                ensure!(found(bytes, &needles).is_empty(), "in {file}: {:?}", found(bytes, &needles));
                ensure!(*mode == 0o600, "{file} mode {mode:o}");
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn no_secret_is_stored_or_cached_in_clear_on_sqlite() -> Result<()> {
    nothing_in_clear(None).await
}

#[tokio::test]
async fn no_secret_is_stored_or_cached_in_clear_on_postgres() -> Result<()> {
    let Some(database) = FreshDatabase::create("secrets_at_rest").await? else { return Ok(()) };
    nothing_in_clear(Some(&database.url)).await
}

async fn retention(postgres: Option<&str>) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut flags = vec!["--keep-snapshots", "3"];
    if let Some(url) = postgres {
        flags.extend(["--database-url", url]);
    }
    let cp = control_plane_with(dir.path(), &flags).await?;
    let admin = Admin::new(cp.addr("admin_addr")?);
    for i in 0..4 {
        let target: std::net::SocketAddr = format!("127.0.0.1:{}", 9001 + i).parse()?;
        admin.create_upstream(&format!("u{i}"), target).await?;
    }
    // Versions 1 (empty) to 5; the newest 3 are kept.
    let history = admin.ok(Method::GET, "/v1/snapshots", None).await?;
    let versions: Vec<u64> =
        history["items"].as_array().into_iter().flatten().filter_map(|s| s["version"].as_u64()).collect();
    ensure!(versions == [5, 4, 3], "history: {history}");
    for request in [(Method::POST, "/v1/snapshots/2/rollback"), (Method::GET, "/v1/snapshots/2")] {
        let (status, body) = admin.send(request.0, request.1, None).await?;
        ensure!(status == 404, "{}: {status} {body}", request.1);
        let detail = body["detail"].as_str().unwrap_or_default();
        ensure!(
            detail.contains("deleted by retention")
                && detail.contains("newest 3")
                && detail.contains("oldest kept is 3"),
            "{body}"
        );
    }
    let (status, body) = admin.send(Method::POST, "/v1/snapshots/99/rollback", None).await?;
    ensure!(status == 404 && body["type"].as_str().is_some_and(|t| t.ends_with("/not-found")), "{status} {body}");
    let rolled: Value = admin.ok(Method::POST, "/v1/snapshots/3/rollback", None).await?;
    ensure!(rolled["version"] == 6, "{rolled}");
    drop(cp);
    Ok(())
}

#[tokio::test]
async fn retention_prunes_and_a_pruned_version_is_404_on_sqlite() -> Result<()> {
    retention(None).await
}

#[tokio::test]
async fn retention_prunes_and_a_pruned_version_is_404_on_postgres() -> Result<()> {
    let Some(database) = FreshDatabase::create("retention").await? else { return Ok(()) };
    retention(Some(&database.url)).await
}

#[tokio::test]
async fn rotating_the_secret_key_under_a_running_control_plane() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let secrets = secrets()?;
    let key_file = dir.path().join("secret.key");
    let cp = control_plane_with(dir.path(), &[]).await?;
    let admin = Admin::new(cp.addr("admin_addr")?);
    let (_backend, backend_addr) = upstream("backend", "127.0.0.1:0").await?;
    configure(&admin, &secrets, backend_addr).await?;
    let old_key = std::fs::read_to_string(&key_file)?;

    let new_key = "5a".repeat(32);
    let db = format!("sqlite://{}", dir.path().join("sluice.db").display());
    let rotate = std::process::Command::new(binary("sluice-cp"))
        .args(["--database-url", &db, "--secret-key-file"])
        .arg(&key_file)
        .args(["rotate-secret-key", "--new-key", &new_key])
        .output()?;
    let said = String::from_utf8_lossy(&rotate.stdout);
    ensure!(rotate.status.success(), "rotate: {said}{}", String::from_utf8_lossy(&rotate.stderr));
    ensure!(said.contains("re-sealed 2 resources"), "{said}");
    ensure!(std::fs::read_to_string(&key_file)?.trim() == new_key, "the key file holds the new key");
    ensure!(mode(&key_file)? == 0o600, "key file mode {:o}", mode(&key_file)?);

    // The running control plane still has the old key: it keeps reading, but refuses to write.
    ensure!(admin.ok(Method::GET, "/v1/consumers/alice", None).await.is_ok(), "reads go on");
    let (status, body) = admin
        .send(
            Method::POST,
            "/v1/upstreams",
            Some(json!({ "name": "late", "targets": [{ "url": "http://127.0.0.1:1" }] })),
        )
        .await?;
    ensure!(
        status == 503 && body["detail"].as_str().is_some_and(|d| d.contains("restart this control plane")),
        "{status} {body}"
    );
    drop(cp);

    // The old key no longer opens the database; the new one does, with every secret intact.
    let old_key_file = dir.path().join("old.key");
    std::fs::write(&old_key_file, &old_key)?;
    let refused = control_plane_with(dir.path(), &["--secret-key-file", &old_key_file.display().to_string()]).await;
    let error = format!("{:#}", refused.err().context("a control plane with the old key started")?);
    ensure!(error.contains("sealed with another secret key"), "{error}");
    let cp = control_plane_with(dir.path(), &[]).await?;
    let admin = Admin::new(cp.addr("admin_addr")?);
    admin.create_upstream("late", "127.0.0.1:1".parse()?).await?;
    let version = admin.latest_version().await?;
    let dp = data_plane_with(cp.addr("grpc_addr")?, "dp-rotated", &[]).await?;
    eventually("the data plane to apply", || all_applied(&admin, version, 1)).await?;
    let proxy = dp.addr("http_addr")?;
    eventually("a JWT signed with the secret to pass after rotation", || async {
        jwt_request_passes(proxy).await.unwrap_or(false)
    })
    .await?;
    Ok(())
}
