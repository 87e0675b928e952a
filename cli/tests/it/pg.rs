//! A fresh PostgreSQL database per test on the machine's server
//! (`SLUICE_TEST_DATABASE_URL`), dropped when the test is done. Without that
//! variable the PostgreSQL tests are skipped with a message, except in CI
//! (`CI=true`), where a missing or unreachable server fails them: CI must
//! never pass by skipping what it is there to prove.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
// The name is made here from a fixed prefix, the pid and a clock reading: nothing outside.
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

pub struct TestDatabase {
    server_url: String,
    name: String,
    /// Connection URL of the fresh database.
    pub url: String,
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

impl TestDatabase {
    /// `Ok(None)` means skip: no server configured (or reachable) outside CI.
    pub async fn create(test: &str) -> Result<Option<Self>> {
        let Ok(server_url) = std::env::var("SLUICE_TEST_DATABASE_URL") else {
            if in_ci() {
                bail!("SLUICE_TEST_DATABASE_URL is not set, and CI=true: PostgreSQL tests must run in CI");
            }
            eprintln!("skipping {test}: set SLUICE_TEST_DATABASE_URL=postgres://USER@HOST:PORT/DB to run it");
            return Ok(None);
        };
        let mut connection = match PgConnection::connect(&server_url).await {
            Ok(connection) => connection,
            Err(e) if !in_ci() => {
                eprintln!("skipping {test}: PostgreSQL at SLUICE_TEST_DATABASE_URL is unreachable: {e}");
                return Ok(None);
            }
            Err(e) => return Err(e).context("connecting to SLUICE_TEST_DATABASE_URL (CI=true: not skipping)"),
        };
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or_default();
        let name = format!("sluice_{test}_{}_{nanos}", std::process::id());
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\""))).execute(&mut connection).await?;
        connection.close().await?;
        let url = with_database(&server_url, &name)?;
        Ok(Some(Self { server_url, name, url }))
    }

    /// Drops the database, closing whatever connections the test's processes
    /// left behind (PostgreSQL 13+ `FORCE`).
    pub async fn drop_database(self) -> Result<()> {
        let mut connection = PgConnection::connect(&self.server_url).await?;
        sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name)))
            .execute(&mut connection)
            .await?;
        connection.close().await?;
        Ok(())
    }
}

/// `postgres://u@h:5432/test?sslmode=disable` with the database swapped.
fn with_database(server_url: &str, name: &str) -> Result<String> {
    let (head, tail) = server_url
        .split_once("://")
        .and_then(|(scheme, rest)| {
            rest.split_once('/').map(|(authority, path)| (format!("{scheme}://{authority}"), path))
        })
        .context("SLUICE_TEST_DATABASE_URL is not postgres://USER@HOST:PORT/DB")?;
    Ok(match tail.split_once('?') {
        Some((_, query)) => format!("{head}/{name}?{query}"),
        None => format!("{head}/{name}"),
    })
}

/// Runs `test` against a fresh database and drops it afterwards, pass or fail.
pub async fn with_fresh_database<F, Fut>(test: &str, body: F) -> Result<()>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let Some(database) = TestDatabase::create(test).await? else { return Ok(()) };
    let outcome = body(database.url.clone()).await;
    let dropped = database.drop_database().await;
    outcome?;
    dropped
}
