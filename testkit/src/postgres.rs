//! A fresh PostgreSQL database per test on the server `SLUICE_TEST_DATABASE_URL`
//! names (skipped or failed by the rule of [`crate::services`]), dropped when
//! the test is done, also when it panicked.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

use crate::services::service_url;

pub const DATABASE_URL_VAR: &str = "SLUICE_TEST_DATABASE_URL";

/// A database of its own for one test; dropped (connections and all) with this value.
#[derive(Debug)]
pub struct FreshDatabase {
    server_url: String,
    name: String,
    /// Connection URL of the fresh database.
    pub url: String,
}

impl FreshDatabase {
    /// Creates `sluice_<label>_<unique>`. `Ok(None)` means skip: no server
    /// configured outside CI. `label` only helps tell databases apart.
    pub async fn create(label: &str) -> Result<Option<Self>> {
        let Some(server_url) = service_url(DATABASE_URL_VAR, "postgres://postgres@127.0.0.1:5432/test")? else {
            return Ok(None);
        };
        let name = unique_name(label);
        let mut connection = PgConnection::connect(&server_url)
            .await
            .with_context(|| format!("connecting to {DATABASE_URL_VAR} ({server_url})"))?;
        // The name is made here from a fixed prefix, the label's letters and numbers: nothing outside.
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\""))).execute(&mut connection).await?;
        connection.close().await?;
        let url = with_database(&server_url, &name);
        Ok(Some(FreshDatabase { server_url, name, url }))
    }
}

/// Drops the database from a thread of its own, because `Drop` cannot await
/// and may run while a test panics. FORCE (PostgreSQL 13+) ends the
/// connections the test's stores and processes left open.
impl Drop for FreshDatabase {
    fn drop(&mut self) {
        let (server_url, name) = (self.server_url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let mut connection = PgConnection::connect(&server_url).await?;
                sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")))
                    .execute(&mut connection)
                    .await?;
                connection.close().await?;
                anyhow::Ok(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop the test database {}", self.name);
        }
    }
}

/// `sluice_<label>_<pid>_<clock>_<count>`, within PostgreSQL's 63 bytes.
fn unique_name(label: &str) -> String {
    static COUNT: AtomicU32 = AtomicU32::new(0);
    let label: String =
        label.chars().filter(char::is_ascii_alphanumeric).take(20).collect::<String>().to_ascii_lowercase();
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or_default();
    format!("sluice_{label}_{}_{nanos}_{}", std::process::id(), COUNT.fetch_add(1, Ordering::Relaxed))
}

/// `postgres://user@host:port/db?opts` with the database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{name}?{query}"),
        None => format!("{base}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_urls() {
        let name = unique_name("Compose-Stack 1");
        assert!(name.starts_with("sluice_composestack1_"), "{name}");
        assert!(name.len() <= 63);
        assert_ne!(unique_name("x"), unique_name("x"));
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/test", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(with_database("postgres://u:p@h/test?sslmode=disable", "x"), "postgres://u:p@h/x?sslmode=disable");
        assert_eq!(with_database("postgres://h:5432", "x"), "postgres://h:5432/x");
    }
}
