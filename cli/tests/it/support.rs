//! Starts the workspace's binaries, reads the JSON address line each prints,
//! and kills them when the test ends.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

pub use sluice_testkit::{
    EPHEMERAL_DATA_PLANE_LISTENERS, Process, WAIT, eventually as eventually_every, metric_sum, rss_kib,
};
use sluice_testkit::{EXAMPLES, example};
pub const ADMIN_TOKEN: &str = "e2e-admin-token";
pub const CLUSTER_TOKEN: &str = "e2e-cluster-token";

/// The other workspace binaries sit next to this package's own `sluice`.
pub fn binary(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sluice")).with_file_name(name)
}

/// Starts one of the workspace's binaries by name.
pub async fn spawn(name: &str, args: &[&str]) -> Result<Process> {
    Process::spawn(binary(name), args, &[]).await
}

/// DESIGN.md's example config (`examples/fruitshop/config.yaml`) in `dir/config.yaml`, the Fruitshop spec
/// copied beside it, proxying to `backend` alone with a per-consumer limit of `rate` an hour.
pub fn design_example(dir: &Path, backend: &str, rate: u64) -> Result<PathBuf> {
    std::fs::copy(Path::new(EXAMPLES).join("fruitshop/fruitshop-v2-2-0.oas.yml"), dir.join("fruitshop-v2-2-0.oas.yml"))
        .context("the fruitshop fixture")?;
    let example = example("fruitshop/config.yaml")?;
    let targets = r#"targets: [{ url: "http://127.0.0.1:9001" }, { url: "http://127.0.0.1:9002" }]"#;
    let limit = "rate_limit: { requests: 2000000,";
    if !example.contains(targets) || !example.contains(limit) {
        bail!("examples/fruitshop/config.yaml no longer has the targets and the rate limit this replaces");
    }
    let config = example
        .replace(targets, &format!(r#"targets: [{{ url: "http://{backend}" }}]"#))
        .replace(limit, &format!("rate_limit: {{ requests: {rate},"));
    let path = dir.join("config.yaml");
    std::fs::write(&path, config)?;
    Ok(path)
}

/// A `sluice-test-upstream`, optionally on a fixed port (to bring one back).
pub async fn upstream(name: &str, addr: &str) -> Result<(Process, SocketAddr)> {
    let process = spawn("sluice-test-upstream", &["--addr", addr, "--name", name]).await?;
    let addr = process.addr("addr")?;
    Ok((process, addr))
}

/// What most end-to-end tests begin with: a control plane keeping its state
/// in `dir`, a test upstream named `u1` and one data plane syncing from it.
pub struct Cluster {
    pub cp: Process,
    pub admin: Admin,
    pub upstream: Process,
    pub backend: SocketAddr,
    pub dp: Process,
}

impl Cluster {
    pub async fn start(dir: &Path, node_id: &str) -> Result<Self> {
        let cp = control_plane(dir).await?;
        let admin = Admin::new(cp.addr("admin_addr")?);
        let (upstream, backend) = upstream("u1", "127.0.0.1:0").await?;
        let dp = data_plane(cp.addr("grpc_addr")?, node_id).await?;
        Ok(Self { cp, admin, upstream, backend, dp })
    }
}

pub async fn control_plane(dir: &std::path::Path) -> Result<Process> {
    control_plane_on(dir, "127.0.0.1:0").await
}

/// A control plane on a given gRPC address, so a test can bring one back
/// where its data planes look for it (same `dir`, so the same SQLite file).
pub async fn control_plane_on(dir: &std::path::Path, grpc_addr: &str) -> Result<Process> {
    control_plane_with(dir, &["--grpc-addr", grpc_addr]).await
}

/// A control plane with its state in `dir` and extra flags, which replace
/// the defaults of the same name.
pub async fn control_plane_with(dir: &std::path::Path, extra: &[&str]) -> Result<Process> {
    let db = format!("sqlite://{}", dir.join("sluice.db").display());
    let key = dir.join("secret.key");
    let key = key.to_str().context("temp path")?;
    let defaults = [
        ("--database-url", db.as_str()),
        ("--admin-addr", "127.0.0.1:0"),
        ("--grpc-addr", "127.0.0.1:0"),
        ("--admin-token", ADMIN_TOKEN),
        ("--cluster-token", CLUSTER_TOKEN),
        ("--secret-key-file", key),
    ];
    let mut args: Vec<&str> =
        defaults.iter().filter(|(flag, _)| !extra.contains(flag)).flat_map(|(flag, value)| [*flag, *value]).collect();
    args.extend_from_slice(extra);
    spawn("sluice-cp", &args).await
}

/// `sluice standalone` on ephemeral ports, keeping its state in `dir`.
pub async fn standalone(dir: &std::path::Path) -> Result<Process> {
    standalone_with(dir, &[]).await
}

/// `sluice standalone` as [`standalone`], with extra flags appended.
pub async fn standalone_with(dir: &std::path::Path, extra: &[&str]) -> Result<Process> {
    let db = format!("sqlite://{}", dir.join("sluice.db").display());
    let key = dir.join("secret.key").display().to_string();
    let mut args = vec!["standalone", "--database-url", &db, "--admin-addr", "127.0.0.1:0"];
    args.extend(EPHEMERAL_DATA_PLANE_LISTENERS);
    args.extend(["--token", ADMIN_TOKEN, "--secret-key-file", &key, "--no-access-log"]);
    args.extend_from_slice(extra);
    spawn("sluice", &args).await
}

pub async fn data_plane(grpc: SocketAddr, node_id: &str) -> Result<Process> {
    data_plane_with(grpc, node_id, &[]).await
}

/// A data plane with extra flags, such as `--snapshot-cache FILE`.
pub async fn data_plane_with(grpc: SocketAddr, node_id: &str, extra: &[&str]) -> Result<Process> {
    data_plane_at(&format!("http://{grpc}"), node_id, extra).await
}

/// A data plane syncing from `control_plane` (a URL), with extra flags.
pub async fn data_plane_at(control_plane: &str, node_id: &str, extra: &[&str]) -> Result<Process> {
    let mut args = vec!["--control-plane", control_plane, "--cluster-token", CLUSTER_TOKEN];
    args.extend(EPHEMERAL_DATA_PLANE_LISTENERS);
    args.extend(["--node-id", node_id, "--heartbeat-ms", "300", "--access-log", "off"]);
    args.extend_from_slice(extra);
    spawn("sluice-dp", &args).await
}

/// The admin API, with the test token unless told another.
pub struct Admin {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Admin {
    pub fn new(addr: SocketAddr) -> Self {
        Self::with_token(addr, ADMIN_TOKEN)
    }

    pub fn with_token(addr: SocketAddr, token: &str) -> Self {
        Self { base: format!("http://{addr}"), token: token.to_owned(), http: reqwest::Client::new() }
    }

    pub async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<(u16, Value)> {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    /// Version of the newest snapshot.
    pub async fn latest_version(&self) -> Result<u64> {
        let page = self.ok(reqwest::Method::GET, "/v1/snapshots?limit=1", None).await?;
        page["items"][0]["version"].as_u64().with_context(|| format!("no snapshot version in {page}"))
    }

    /// The rows of `/v1/data-planes`, by node id.
    pub async fn data_planes(&self) -> Result<Vec<Value>> {
        let page = self.ok(reqwest::Method::GET, "/v1/data-planes", None).await?;
        Ok(page["items"].as_array().cloned().unwrap_or_default())
    }

    /// Creates an upstream with one plain-HTTP target.
    pub async fn create_upstream(&self, name: &str, target: SocketAddr) -> Result<Value> {
        let body = serde_json::json!({ "name": name, "targets": [{ "url": format!("http://{target}") }] });
        self.ok(reqwest::Method::POST, "/v1/upstreams", Some(body)).await
    }

    /// Creates an API routing `path_prefix` to `upstream`, without policies.
    pub async fn create_api(&self, name: &str, path_prefix: &str, upstream: &str) -> Result<Value> {
        let body = serde_json::json!({ "name": name, "path_prefix": path_prefix, "upstream": upstream });
        self.ok(reqwest::Method::POST, "/v1/apis", Some(body)).await
    }

    /// Sends and insists on a 2xx answer.
    pub async fn ok(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
        let (status, body) = self.send(method, path, body).await?;
        if !(200..300).contains(&status) {
            bail!("{path}: {status} {body}");
        }
        Ok(body)
    }
}

/// Polls `check` every 50 ms until it holds or `WAIT` passes.
pub async fn eventually<F, Fut>(what: &str, check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually_every(what, Duration::from_millis(50), check).await
}

/// The `server` name the test upstream put in its echo, or the status on failure.
pub async fn served_by(client: &reqwest::Client, url: &str) -> Result<String, u16> {
    match client.get(url).send().await {
        Ok(response) if response.status().is_success() => {
            let body: Value = response.json().await.map_err(|_| 0u16)?;
            Ok(body["server"].as_str().unwrap_or_default().to_string())
        }
        Ok(response) => Err(response.status().as_u16()),
        Err(_) => Err(0),
    }
}

/// Whether exactly `count` data planes are connected and run `version`.
pub async fn all_applied(admin: &Admin, version: u64, count: usize) -> bool {
    let nodes = admin.data_planes().await.unwrap_or_default();
    nodes.len() == count
        && nodes.iter().all(|n| n["applied_version"].as_u64() == Some(version) && n["connected"] == true)
}
