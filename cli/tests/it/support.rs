//! Starts the workspace's binaries, reads the JSON address line each prints,
//! and kills them when the test ends.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

pub const WAIT: Duration = Duration::from_secs(20);
pub const ADMIN_TOKEN: &str = "e2e-admin-token";
pub const CLUSTER_TOKEN: &str = "e2e-cluster-token";

/// The other workspace binaries sit next to this package's own `sluice`.
pub fn binary(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sluice")).with_file_name(name)
}

pub struct Process {
    pub child: Child,
    pub first_line: Value,
}

impl Process {
    pub async fn spawn(name: &str, args: &[&str]) -> Result<Self> {
        let program = binary(name);
        let mut child = Command::new(&program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {} (build the workspace first)", program.display()))?;
        let stderr = collect(child.stderr.take().context("stderr")?);
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        let read = tokio::time::timeout(WAIT, stdout.read_line(&mut line)).await;
        if !matches!(read, Ok(Ok(n)) if n > 0) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            bail!("{name} printed no address line; stderr:\n{}", stderr.lock().map(|s| s.clone()).unwrap_or_default());
        }
        let first_line = serde_json::from_str(line.trim()).with_context(|| format!("not JSON: {line:?}"))?;
        collect(stdout);
        Ok(Self { child, first_line })
    }

    pub fn addr(&self, key: &str) -> Result<SocketAddr> {
        self.first_line[key]
            .as_str()
            .with_context(|| format!("no {key} in {}", self.first_line))?
            .parse()
            .context("address")
    }

    pub async fn kill(&mut self) -> Result<()> {
        self.child.kill().await.context("kill")
    }
}

fn collect(reader: impl AsyncRead + Unpin + Send + 'static) -> Arc<Mutex<String>> {
    let buffer = Arc::new(Mutex::new(String::new()));
    let sink = buffer.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(mut buffer) = sink.lock() {
                buffer.push_str(&line);
                buffer.push('\n');
            }
        }
    });
    buffer
}

/// A `sluice-test-upstream`, optionally on a fixed port (to bring one back).
pub async fn upstream(name: &str, addr: &str) -> Result<(Process, SocketAddr)> {
    let process = Process::spawn("sluice-test-upstream", &["--addr", addr, "--name", name]).await?;
    let addr = process.addr("addr")?;
    Ok((process, addr))
}

pub async fn control_plane(dir: &std::path::Path) -> Result<Process> {
    let db = format!("sqlite://{}", dir.join("sluice.db").display());
    let key = dir.join("secret.key");
    let key = key.to_str().context("temp path")?;
    Process::spawn(
        "sluice-cp",
        &[
            "--database-url",
            &db,
            "--admin-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-token",
            ADMIN_TOKEN,
            "--cluster-token",
            CLUSTER_TOKEN,
            "--secret-key-file",
            key,
        ],
    )
    .await
}

pub async fn data_plane(grpc: SocketAddr, node_id: &str) -> Result<Process> {
    let control_plane = format!("http://{grpc}");
    Process::spawn(
        "sluice-dp",
        &[
            "--control-plane",
            &control_plane,
            "--cluster-token",
            CLUSTER_TOKEN,
            "--http-addr",
            "127.0.0.1:0",
            "--https-addr",
            "127.0.0.1:0",
            "--ops-addr",
            "127.0.0.1:0",
            "--node-id",
            node_id,
            "--heartbeat-ms",
            "300",
            "--access-log",
            "off",
        ],
    )
    .await
}

/// The admin API with the test token.
pub struct Admin {
    base: String,
    http: reqwest::Client,
}

impl Admin {
    pub fn new(addr: SocketAddr) -> Self {
        Self { base: format!("http://{addr}"), http: reqwest::Client::new() }
    }

    pub async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<(u16, Value)> {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
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

/// Polls `check` until it holds or `WAIT` passes.
pub async fn eventually<F, Fut>(what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("timed out waiting for {what}")
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
