//! Process helpers shared by the integration tests: start the real binaries on
//! ephemeral ports, read the address line they print, keep their logs.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

pub const WAIT: Duration = Duration::from_secs(20);

/// A running binary whose stdout (after the address line) and stderr are
/// collected, so a test can assert on logs and a failing test can print them.
pub struct Process {
    pub child: Child,
    pub first_line: Value,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Process {
    pub async fn spawn(program: &str, args: &[&str]) -> Result<Self> {
        let mut child = Command::new(program)
            .args(args)
            .env("RUST_LOG", "info,sluice_data_plane=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {program}"))?;
        let stderr = collect(child.stderr.take().context("stderr")?);
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        let read = tokio::time::timeout(WAIT, stdout.read_line(&mut line)).await;
        if !matches!(read, Ok(Ok(n)) if n > 0) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            bail!(
                "{program} printed no address line; stderr:\n{}",
                stderr.lock().map(|s| s.clone()).unwrap_or_default()
            );
        }
        let first_line: Value =
            serde_json::from_str(line.trim()).with_context(|| format!("address line is not JSON: {line:?}"))?;
        let stdout = collect(stdout);
        Ok(Self { child, first_line, stdout, stderr })
    }

    pub fn addr(&self, key: &str) -> Result<SocketAddr> {
        self.first_line[key]
            .as_str()
            .with_context(|| format!("no {key} in {}", self.first_line))?
            .parse()
            .context(key.to_owned())
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits until the process logged a line containing `needle`.
    pub async fn wait_for_log(&self, needle: &str) -> Result<()> {
        let deadline = tokio::time::Instant::now() + WAIT;
        while tokio::time::Instant::now() < deadline {
            if self.stderr().contains(needle) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("no log line containing {needle:?}; stderr:\n{}", self.stderr())
    }

    /// Sends SIGTERM, as an orchestrator would.
    pub fn terminate(&self) -> Result<()> {
        let pid = self.child.id().context("process already reaped")?;
        let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status()?;
        if !status.success() {
            bail!("kill -TERM {pid} failed");
        }
        Ok(())
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

/// A `sluice-test-upstream` process.
pub struct Upstream {
    pub process: Process,
    pub addr: SocketAddr,
}

impl Upstream {
    pub async fn start(name: &str) -> Result<Self> {
        let process =
            Process::spawn(env!("CARGO_BIN_EXE_sluice-test-upstream"), &["--addr", "127.0.0.1:0", "--name", name])
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
        let mut args = vec![
            "--control-plane",
            control_plane,
            "--http-addr",
            "127.0.0.1:0",
            "--https-addr",
            "127.0.0.1:0",
            "--ops-addr",
            "127.0.0.1:0",
            "--heartbeat-ms",
            "200",
            "--shutdown-grace-secs",
            "5",
        ];
        args.extend_from_slice(extra);
        let process = Process::spawn(env!("CARGO_BIN_EXE_sluice-dp"), &args).await?;
        let http_addr = process.addr("http_addr")?;
        let https_addr = process.addr("https_addr")?;
        let ops_addr = process.addr("ops_addr")?;
        let node_id = process.first_line["node_id"].as_str().context("node_id")?.to_owned();
        Ok(Self { process, http_addr, https_addr, ops_addr, node_id })
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
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if self.ready_status().await.ok() == Some(status) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("/readyz never answered {status}; stderr:\n{}", self.process.stderr());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The value of an unlabelled series on `/metrics`, if present.
    pub async fn metric(&self, name: &str) -> Result<Option<f64>> {
        let text = client().get(self.ops_url("/metrics")).send().await?.text().await?;
        Ok(metric_value(&text, name))
    }

    /// Waits until an unlabelled metric has `value`.
    pub async fn wait_metric(&self, name: &str, value: f64) -> Result<()> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let current = self.metric(name).await?;
            if current == Some(value) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("{name} is {current:?}, expected {value}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// A client that ignores any proxy set in the environment: tests talk to 127.0.0.1 directly.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap_or_default()
}

/// An address nothing listens on (bound, then released).
pub async fn unused_addr() -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    Ok(listener.local_addr()?)
}
