//! `sluice-dp`: parses settings, sets up logging, builds the data plane and
//! runs it until SIGTERM/SIGINT. Everything else lives in the library.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use sluice_data_plane::app::App;
use sluice_data_plane::settings::Settings;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = Settings::parse();
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
