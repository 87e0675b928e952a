//! The control plane and its PostgreSQL database coming and going: the
//! version watcher's LISTEN connection is opened again after any loss, and
//! while the database is unreachable admin requests answer 503 problem
//! details with `Retry-After` (after `--database-acquire-timeout`, not the
//! driver's 30 s) and `/readyz` says why. A real `sluice-cp` process; the
//! outage is a TCP proxy in front of PostgreSQL that the test stops.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sluice_testkit::postgres::FreshDatabase;
use sluice_testkit::{Process, control_plane_args, eventually, metric_sum};
use sqlx::Connection;
use sqlx::postgres::PgConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinSet;

const ADMIN_TOKEN: &str = "database-test-admin-token";
const POLL: Duration = Duration::from_millis(50);

async fn control_plane(database_url: &str) -> Result<(Process, String)> {
    let secret = "3c".repeat(32);
    let mut args = control_plane_args(database_url, "127.0.0.1:0", ADMIN_TOKEN, "database-test-cluster-token", &secret);
    // Short, so each request during the outage fails fast; long enough for a busy test machine's PostgreSQL
    // to hand out connections.
    args.extend(["--database-acquire-timeout", "3s"]);
    let process = Process::spawn(env!("CARGO_BIN_EXE_sluice-cp"), &args, &[("RUST_LOG", "info")]).await?;
    let admin = format!("http://{}", process.addr("admin_addr")?);
    Ok((process, admin))
}

async fn metrics(http: &reqwest::Client, admin: &str) -> Result<String> {
    Ok(http.get(format!("{admin}/metrics")).send().await?.error_for_status()?.text().await?)
}

/// The mode `sluice_cp_config_watch_mode` shows as current.
fn watch_mode(text: &str) -> Option<&str> {
    text.lines()
        .filter_map(|line| line.strip_prefix("sluice_cp_config_watch_mode{mode=\""))
        .find_map(|rest| rest.strip_suffix("\"} 1"))
}

/// PIDs of the backends whose last statement was the watcher's LISTEN.
async fn listen_backends(connection: &mut PgConnection) -> Result<Vec<i32>> {
    let rows: Vec<(i32,)> = sqlx::query_as(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %' \
         AND pid <> pg_backend_pid()",
    )
    .fetch_all(connection)
    .await?;
    Ok(rows.into_iter().map(|(pid,)| pid).collect())
}

#[tokio::test]
async fn the_watcher_listens_again_after_its_backend_is_terminated() -> Result<()> {
    let Some(db) = FreshDatabase::create("watch").await? else { return Ok(()) };
    let (cp, admin) = control_plane(&db.url).await?;
    let http = reqwest::Client::new();
    eventually("listen mode", POLL, || async {
        metrics(&http, &admin).await.is_ok_and(|m| watch_mode(&m) == Some("listen"))
    })
    .await?;
    let text = metrics(&http, &admin).await?;
    ensure!(metric_sum(&text, "sluice_cp_config_watch_listens_total") == Some(1.0), "{text}");

    let mut connection = PgConnection::connect(&db.url).await?;
    let before = listen_backends(&mut connection).await?;
    ensure!(before.len() == 1, "one LISTEN backend expected: {before:?}");
    let (terminated,): (bool,) =
        sqlx::query_as("SELECT pg_terminate_backend($1)").bind(before[0]).fetch_one(&mut connection).await?;
    ensure!(terminated, "pg_terminate_backend({}) refused", before[0]);

    cp.wait_for_log("config watch mode: poll").await?;
    eventually("a second LISTEN connection, in listen mode", POLL, || async {
        metrics(&http, &admin).await.is_ok_and(|m| {
            metric_sum(&m, "sluice_cp_config_watch_listens_total") == Some(2.0) && watch_mode(&m) == Some("listen")
        })
    })
    .await?;
    let after = listen_backends(&mut connection).await?;
    ensure!(after.len() == 1 && after != before, "LISTEN backends before {before:?}, after {after:?}");
    connection.close().await?;
    Ok(())
}

/// A TCP proxy to PostgreSQL that can be stopped (every connection cut, new
/// ones refused) and started again on the same port.
struct Outage {
    addr: SocketAddr,
    target: SocketAddr,
    tasks: Arc<Mutex<JoinSet<()>>>,
}

impl Outage {
    async fn start(target: SocketAddr) -> Result<Outage> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let outage = Outage { addr: listener.local_addr()?, target, tasks: Arc::default() };
        outage.serve(listener).await;
        Ok(outage)
    }

    async fn serve(&self, listener: TcpListener) {
        let (tasks, target) = (self.tasks.clone(), self.target);
        let accept_tasks = tasks.clone();
        tasks.lock().await.spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                accept_tasks.lock().await.spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
    }

    /// The database becomes unreachable: connections are cut, new ones refused.
    async fn stop(&self) {
        self.tasks.lock().await.shutdown().await;
    }

    async fn resume(&self) -> Result<()> {
        let listener = TcpListener::bind(self.addr).await.context("binding the proxy's port again")?;
        self.serve(listener).await;
        Ok(())
    }
}

async fn call(
    http: &reqwest::Client,
    admin: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<(StatusCode, Option<String>, Value)> {
    let mut request = http.request(method, format!("{admin}{path}")).bearer_auth(ADMIN_TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await?;
    let status = response.status();
    let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = response.json().await.unwrap_or(Value::Null);
    Ok((status, retry_after, body))
}

#[tokio::test]
async fn an_unreachable_database_answers_503_with_retry_after_and_readyz_says_why() -> Result<()> {
    let Some(db) = FreshDatabase::create("outage").await? else { return Ok(()) };
    let url: reqwest::Url = db.url.parse()?;
    let target = SocketAddr::new(url.host_str().context("host")?.parse()?, url.port().unwrap_or(5432));
    let outage = Outage::start(target).await?;
    let mut proxied = url.clone();
    proxied.set_port(Some(outage.addr.port())).map_err(|()| anyhow::anyhow!("cannot set the port"))?;
    let (_cp, admin) = control_plane(proxied.as_str()).await?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build()?;

    let upstream = |name: &str| json!({ "name": name, "targets": [{ "url": "http://127.0.0.1:9" }] });
    let (status, _, _) = call(&http, &admin, Method::POST, "/v1/upstreams", Some(upstream("before"))).await?;
    ensure!(status == StatusCode::CREATED, "write before the outage: {status}");

    outage.stop().await;
    for (method, path, body) in [
        (Method::GET, "/v1/upstreams", None),
        (Method::POST, "/v1/upstreams", Some(upstream("during"))),
        (Method::GET, "/readyz", None),
    ] {
        let (status, retry_after, problem) = call(&http, &admin, method.clone(), path, body).await?;
        ensure!(status == StatusCode::SERVICE_UNAVAILABLE, "{method} {path}: {status} {problem}");
        ensure!(retry_after.is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s > 0)), "{method} {path}: no Retry-After");
        ensure!(problem["type"] == "https://sluice.dev/problems/unavailable", "{method} {path}: {problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        ensure!(detail.contains("database"), "{method} {path} does not say why: {problem}");
    }

    outage.resume().await?;
    eventually("ready again", POLL, || async {
        call(&http, &admin, Method::GET, "/readyz", None).await.is_ok_and(|(status, _, _)| status == StatusCode::OK)
    })
    .await?;
    let (status, _, _) = call(&http, &admin, Method::POST, "/v1/upstreams", Some(upstream("after"))).await?;
    ensure!(status == StatusCode::CREATED, "write after the outage: {status}");
    let (_, _, page) = call(&http, &admin, Method::GET, "/v1/upstreams", None).await?;
    let names: Vec<&str> = page["items"].as_array().into_iter().flatten().filter_map(|u| u["name"].as_str()).collect();
    ensure!(names == ["after", "before"], "the refused write was not committed, the others were: {names:?}");
    Ok(())
}
