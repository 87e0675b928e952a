//! The data plane's binaries in integration tests, on ephemeral ports: the
//! process handling itself is `sluice-testkit`, shared with the CLI's tests.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use sluice_proto::v1;
use sluice_proto::v1::policy::Kind;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

pub use sluice_testkit::{EPHEMERAL_DATA_PLANE_LISTENERS, Process, WAIT, eventually, metric_sum};

/// Data-plane tests read its debug logs.
const LOG_LEVEL: (&str, &str) = ("RUST_LOG", "info,sluice_data_plane=debug");

/// A `sluice-test-upstream` process.
pub struct Upstream {
    pub process: Process,
    pub addr: SocketAddr,
}

impl Upstream {
    pub async fn start(name: &str) -> Result<Self> {
        let process = Process::spawn(
            env!("CARGO_BIN_EXE_sluice-test-upstream"),
            &["--addr", "127.0.0.1:0", "--name", name],
            &[LOG_LEVEL],
        )
        .await?;
        let addr = process.addr("addr")?;
        Ok(Self { process, addr })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A `sluice-dp` process on ephemeral ports.
pub struct DataPlane {
    pub process: Process,
    pub http_addr: SocketAddr,
    pub https_addr: SocketAddr,
    pub ops_addr: SocketAddr,
    pub node_id: String,
}

impl DataPlane {
    /// Starts a data plane against `control_plane` with fast heartbeats; extra
    /// flags are appended.
    pub async fn start(control_plane: &str, extra: &[&str]) -> Result<Self> {
        let mut args = vec!["--control-plane", control_plane];
        args.extend(EPHEMERAL_DATA_PLANE_LISTENERS);
        args.extend(["--heartbeat-ms", "200", "--shutdown-grace-secs", "5"]);
        args.extend_from_slice(extra);
        let process = Process::spawn(env!("CARGO_BIN_EXE_sluice-dp"), &args, &[LOG_LEVEL]).await?;
        let http_addr = process.addr("http_addr")?;
        let https_addr = process.addr("https_addr")?;
        let ops_addr = process.addr("ops_addr")?;
        let node_id = process.first_line["node_id"].as_str().context("node_id")?.to_owned();
        Ok(Self { process, http_addr, https_addr, ops_addr, node_id })
    }

    /// A data plane, with extra flags, running `snapshot` from a fake control
    /// plane whose stream stays open for the test's length (the control plane
    /// is returned so that it lives as long).
    pub async fn running(
        snapshot: sluice_proto::v1::Snapshot,
        extra: &[&str],
    ) -> Result<(crate::fake_cp::FakeControlPlane, DataPlane)> {
        let mut cp = crate::fake_cp::FakeControlPlane::start().await?;
        let dp = DataPlane::start(&cp.url(), extra).await?;
        let mut conn = cp.accept().await?;
        conn.push(crate::fake_cp::seal(snapshot)).await?;
        conn.ack().await?;
        // Dropping the stream would only log.
        std::mem::forget(conn);
        Ok((cp, dp))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http_addr)
    }

    pub fn ops_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.ops_addr)
    }

    pub async fn ready_status(&self) -> Result<u16> {
        Ok(client().get(self.ops_url("/readyz")).send().await?.status().as_u16())
    }

    /// Waits until `/readyz` answers `status`.
    pub async fn wait_ready_status(&self, status: u16) -> Result<()> {
        let ready = || async { self.ready_status().await.ok() == Some(status) };
        let waited = eventually("/readyz", Duration::from_millis(50), ready).await;
        waited.with_context(|| format!("/readyz never answered {status}; stderr:\n{}", self.process.stderr()))
    }

    /// The value of a metric on `/metrics` (summed over its series), if present.
    pub async fn metric(&self, name: &str) -> Result<Option<f64>> {
        let text = client().get(self.ops_url("/metrics")).send().await?.text().await?;
        Ok(metric_sum(&text, name))
    }

    /// Waits until a metric has `value`.
    pub async fn wait_metric(&self, name: &str, value: f64) -> Result<()> {
        let reached = || async { self.metric(name).await.ok().flatten() == Some(value) };
        let waited = eventually(name, Duration::from_millis(50), reached).await;
        waited.with_context(|| format!("{name} is not {value}"))
    }
}

/// A client that ignores any proxy set in the environment: tests talk to 127.0.0.1 directly.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap_or_default()
}

/// Sends `request`: (status, headers, JSON body or Null).
pub async fn send(request: reqwest::RequestBuilder) -> Result<(u16, reqwest::header::HeaderMap, serde_json::Value)> {
    let response = request.send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await?;
    Ok((status, headers, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)))
}

/// An address nothing listens on (bound, then released).
pub async fn unused_addr() -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    Ok(listener.local_addr()?)
}

/// Serves HTTP/1.1 (upgrades allowed) on `listener`, each request answered by `handle`: the in-process
/// upstreams of the proxy, policy, OpenAPI and rate-limit tests. The connections live in a JoinSet owned by
/// the returned task, so aborting it closes them too: a killed upstream really goes away.
pub fn serve_http1<F, Fut>(listener: TcpListener, handle: F) -> JoinHandle<()>
where
    F: Fn(http::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<http::Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            let handle = handle.clone();
            connections.spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(handle))
                    .with_upgrades()
                    .await;
            });
        }
    })
}

/// An API routing `prefix` to `upstream` through `policies`, everything else as default.
pub fn api(name: &str, prefix: &str, upstream: &str, policies: Vec<Kind>) -> v1::Api {
    v1::Api {
        name: name.into(),
        path_prefix: prefix.into(),
        upstream: upstream.into(),
        policies: policies.into_iter().map(|kind| v1::Policy { kind: Some(kind) }).collect(),
        ..Default::default()
    }
}
