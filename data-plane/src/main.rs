//! `sluice-dp`: parses settings, sets up logging, builds the data plane and
//! runs it until SIGTERM/SIGINT. Everything else lives in the library.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use sluice_data_plane::app::App;
use sluice_data_plane::settings::Settings;
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<()> {
    let settings = Settings::parse();
    // Traffic is served by the proxy's own worker threads (`proxy::workers`);
    // this runtime runs the control work beside them (sync, ops, health
    // checks) on this thread, snapshot compiles on its blocking pool. Not a
    // work-stealing runtime: its worker thread and the code that thread runs
    // were memory an idle data plane held for nothing (bench/README.md).
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    runtime.context("starting the async runtime")?.block_on(run(settings))
}

async fn run(settings: Settings) -> anyhow::Result<()> {
    if settings.check_ready {
        // A probe's failure is an answer, not a crash: one line, exit 1.
        if let Err(e) = check_ready(&settings).await {
            eprintln!("{e:#}");
            std::process::exit(1);
        }
        return Ok(());
    }
    // Logs go to stderr as JSON: stdout carries the access log and the
    // address line tests and scripts read.
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();

    let app = App::build(settings).await.context("starting the data plane")?;
    let bound = app.bound().clone();
    tracing::info!(
        http_addr = %bound.http_addr,
        https_addr = %bound.https_addr,
        ops_addr = %bound.ops_addr,
        node_id = %bound.node_id,
        "listening"
    );
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}", serde_json::to_string(&bound)?)?;
        stdout.flush()?;
    }
    app.run_until_stopped().await?;
    Ok(())
}

/// `--check-ready`: one `GET /readyz` on the ops listener over a bare TCP
/// socket. Container images carry no curl or wget, so the binary probes
/// itself; the answer's status line is all that matters.
async fn check_ready(settings: &Settings) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let addr = settings.ops_probe_addr();
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut head = [0u8; 64];
        let mut read = 0;
        // The status line fits in the first bytes; stop once it is complete.
        while read < head.len() && !head[..read].contains(&b'\n') {
            let n = stream.read(&mut head[read..]).await?;
            if n == 0 {
                break;
            }
            read += n;
        }
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&head[..read]).into_owned())
    };
    let status_line = tokio::time::timeout(std::time::Duration::from_secs(3), probe)
        .await
        .with_context(|| format!("no answer from http://{addr}/readyz within 3s"))?
        .with_context(|| format!("cannot reach http://{addr}/readyz"))?;
    let line = status_line.lines().next().unwrap_or_default();
    anyhow::ensure!(line.split_whitespace().nth(1) == Some("200"), "not ready: http://{addr}/readyz answered {line:?}");
    println!("ready: http://{addr}/readyz");
    Ok(())
}
