//! Test support shared by the workspace's tests: start a real binary, read
//! the JSON address line it prints first, keep its logs, and kill it when the
//! test ends (also when the test fails); wait for a condition; the
//! repository's examples; the shared
//! services (`services`) and a fresh PostgreSQL database per test
//! (`postgres`); an OTLP trace collector (`otlp`); simulated data planes (`sim_node`) for fleet tests and
//! the fleet benchmark; a raw HTTP/1.1 upstream that records what reached
//! it (`raw_upstream`) for the gateway's conformance tests; and a WebDriver
//! client for the browser tests (`webdriver`).

pub mod otlp;
pub mod postgres;
pub mod raw_upstream;
pub mod services;
pub mod sim_node;
pub mod webdriver;

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

/// How long a test waits for a process to start or for a condition to hold.
pub const WAIT: Duration = Duration::from_secs(20);

/// A data plane's (or `sluice standalone`'s) proxy and ops listeners on
/// ephemeral ports; each prints the addresses it got in its first log line.
pub const EPHEMERAL_DATA_PLANE_LISTENERS: [&str; 6] =
    ["--http-addr", "127.0.0.1:0", "--https-addr", "127.0.0.1:0", "--ops-addr", "127.0.0.1:0"];

/// A test's `sluice-cp` flags: its database, the admin API on an ephemeral port, gRPC on `grpc_addr`, and
/// the tokens and secret key given, so that replicas of one database (or a process started again) share
/// them. A test appends flags of its own.
pub fn control_plane_args<'a>(
    database_url: &'a str,
    grpc_addr: &'a str,
    admin_token: &'a str,
    cluster_token: &'a str,
    secret_key: &'a str,
) -> Vec<&'a str> {
    vec![
        "--database-url",
        database_url,
        "--admin-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        grpc_addr,
        "--admin-token",
        admin_token,
        "--cluster-token",
        cluster_token,
        "--secret-key",
        secret_key,
    ]
}

/// The repository's `examples/` folder: the Fruitshop spec and DESIGN.md's example configuration.
pub const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");

/// A file of `examples/`, e.g. `example("fruitshop/config.yaml")`.
pub fn example(path: &str) -> Result<String> {
    let path = format!("{EXAMPLES}/{path}");
    std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))
}

/// A running binary whose stdout (after the address line) and stderr are
/// collected, so a test can assert on logs and a failing test can print them.
pub struct Process {
    pub child: Child,
    pub first_line: Value,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Process {
    /// Starts `program` with `args` and extra environment `env`, and waits
    /// for the address line it prints on stdout once it listens.
    pub async fn spawn(program: impl AsRef<OsStr>, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        let program = program.as_ref();
        let mut child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {} (is the workspace built?)", program.display()))?;
        let stderr = collect(child.stderr.take().context("stderr")?);
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        let read = tokio::time::timeout(WAIT, stdout.read_line(&mut line)).await;
        if !matches!(read, Ok(Ok(n)) if n > 0) {
            // Give the process a moment to write why it stopped.
            tokio::time::sleep(Duration::from_millis(200)).await;
            bail!(
                "{} printed no address line; stderr:\n{}",
                program.display(),
                stderr.lock().map(|s| s.clone()).unwrap_or_default()
            );
        }
        let first_line: Value =
            serde_json::from_str(line.trim()).with_context(|| format!("address line is not JSON: {line:?}"))?;
        let stdout = collect(stdout);
        Ok(Self { child, first_line, stdout, stderr })
    }

    /// An address from the first line, e.g. `addr("http_addr")`.
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
        let logged = eventually(needle, Duration::from_millis(50), || async { self.stderr().contains(needle) }).await;
        logged.with_context(|| format!("no log line containing {needle:?}; stderr:\n{}", self.stderr()))
    }

    /// Sends SIGTERM, as an orchestrator would.
    pub fn terminate(&self) -> Result<()> {
        let pid = self.pid()?;
        let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status()?;
        if !status.success() {
            bail!("kill -TERM {pid} failed");
        }
        Ok(())
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub async fn kill(&mut self) -> Result<()> {
        self.child.kill().await.context("kill")
    }

    pub fn pid(&self) -> Result<u32> {
        self.child.id().context("the process has exited")
    }
}

/// Polls `check` every `interval` until it holds, or fails naming `what`
/// once [`WAIT`] has passed. Tests wait on conditions, never for a fixed time.
pub async fn eventually<F, Fut>(what: &str, interval: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return Ok(());
        }
        tokio::time::sleep(interval).await;
    }
    bail!("timed out waiting for {what}")
}

/// The sum of a metric's series in Prometheus text (every label set), or
/// `None` when it has none.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let values = text.lines().filter_map(|line| {
        let rest = line.strip_prefix(name)?;
        let value = match rest.strip_prefix('{') {
            Some(labelled) => labelled.split_once("} ")?.1,
            None => rest.strip_prefix(' ')?,
        };
        value.trim().parse::<f64>().ok()
    });
    values.fold(None, |sum, value| Some(sum.unwrap_or(0.0) + value))
}

/// Resident memory of a live process in KiB, from `VmRSS` in `/proc/PID/status`.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading /proc status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS line")
}

/// Collects a stream's lines in the background, for later assertions.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_add_every_label_set() {
        let text = "# TYPE a gauge\na{t=\"x\"} 1\na{t=\"y\"} 2\nab 7\nb 3\n";
        assert_eq!(metric_sum(text, "a"), Some(3.0));
        assert_eq!(metric_sum(text, "b"), Some(3.0));
        assert_eq!(metric_sum(text, "ab"), Some(7.0));
        assert_eq!(metric_sum(text, "c"), None);
    }
}
