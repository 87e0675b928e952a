//! `sluice standalone`: a control plane (SQLite by default) and one data plane
//! in one process, wired over loopback gRPC with a cluster token made for this
//! run. The quickest way to a working gateway on a fresh machine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use sluice_control_plane::app::{self as cp, App as ControlPlane};
use sluice_control_plane::credentials::generate_token;
use sluice_data_plane::app::App as DataPlane;

#[derive(Debug, Args)]
pub struct StandaloneArgs {
    /// `sqlite://FILE` or `postgres://...`.
    #[arg(long, env = "SLUICE_DATABASE_URL", default_value = "sqlite://sluice.db")]
    database_url: String,
    #[arg(long, env = "SLUICE_ADMIN_ADDR", default_value = "127.0.0.1:9080")]
    admin_addr: SocketAddr,
    /// Where the gateway proxies traffic.
    #[arg(long, env = "SLUICE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// Where the gateway terminates TLS (certificates come from the admin API).
    #[arg(long, env = "SLUICE_HTTPS_ADDR", default_value = "0.0.0.0:8443")]
    https_addr: SocketAddr,
    #[arg(long, env = "SLUICE_OPS_ADDR", default_value = "127.0.0.1:9100")]
    ops_addr: SocketAddr,
    /// Admin API token; generated and printed once at first start if absent.
    #[arg(long = "token", env = "SLUICE_ADMIN_TOKEN", hide_env_values = true, allow_hyphen_values = true)]
    admin_token: Option<String>,
    #[arg(long, env = "SLUICE_SECRET_KEY", hide_env_values = true)]
    secret_key: Option<String>,
    #[arg(long, env = "SLUICE_SECRET_KEY_FILE", default_value = "sluice-secret.key")]
    secret_key_file: PathBuf,
    /// Versions kept in the snapshot history.
    #[arg(long, env = "SLUICE_KEEP_SNAPSHOTS", default_value_t = sluice_control_plane::store::DEFAULT_KEEP_SNAPSHOTS, value_parser = clap::value_parser!(u64).range(1..))]
    keep_snapshots: u64,
    /// Largest OpenAPI spec an upload may carry, in bytes.
    #[arg(long, env = "SLUICE_MAX_SPEC_BYTES", default_value_t = sluice_control_plane::specs::DEFAULT_MAX_SPEC_BYTES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_spec_bytes: usize,
    /// PEM certificate chain the admin API presents (HTTPS).
    #[arg(long, env = "SLUICE_ADMIN_TLS_CERT", requires = "admin_tls_key")]
    admin_tls_cert: Option<PathBuf>,
    /// PEM private key of `--admin-tls-cert`.
    #[arg(long, env = "SLUICE_ADMIN_TLS_KEY", requires = "admin_tls_cert")]
    admin_tls_key: Option<PathBuf>,
    /// Turn the per-request JSON access log on stdout off.
    #[arg(long)]
    no_access_log: bool,
    /// The data plane's tracing flags, defined once in its settings.
    #[command(flatten)]
    trace: sluice_data_plane::settings::TraceFlags,
}

pub async fn run(args: StandaloneArgs) -> anyhow::Result<()> {
    cp::init_tracing();
    // The data plane lives in this process, so the cluster token never has to
    // leave it: a fresh one per run, never stored.
    let cluster_token = generate_token();
    let control_plane = ControlPlane::build(sluice_control_plane::settings::Settings {
        database_url: args.database_url,
        database_acquire_timeout: sluice_control_plane::store::DEFAULT_ACQUIRE_TIMEOUT,
        admin_addr: args.admin_addr,
        grpc_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin_token: args.admin_token,
        cluster_token: Some(cluster_token.clone()),
        secret_key: args.secret_key,
        secret_key_file: args.secret_key_file,
        stale_after: Duration::from_secs(30),
        purge_after: Duration::from_secs(3600),
        ack_timeout: Duration::from_secs(30),
        keep_snapshots: args.keep_snapshots,
        max_spec_bytes: args.max_spec_bytes,
        // Loopback inside one process: nothing crosses a network.
        grpc_tls_cert: None,
        grpc_tls_key: None,
        grpc_client_ca: None,
        admin_tls_cert: args.admin_tls_cert,
        admin_tls_key: args.admin_tls_key,
    })
    .await?;

    let mut dp_settings = sluice_data_plane::settings::Settings::with_defaults();
    dp_settings.control_plane = format!("http://{}", control_plane.grpc_addr());
    dp_settings.cluster_token = Some(cluster_token);
    dp_settings.http_addr = args.http_addr;
    dp_settings.https_addr = args.https_addr;
    dp_settings.ops_addr = args.ops_addr;
    dp_settings.node_id = Some("standalone".into());
    dp_settings.heartbeat_ms = 1_000;
    dp_settings.trace = args.trace;
    if args.no_access_log {
        dp_settings.access_log = sluice_data_plane::settings::Switch::Off;
    }
    let data_plane = DataPlane::build(dp_settings).await.context("starting the data plane")?;

    let admin_url = control_plane.admin_url();
    let proxy_url = format!("http://{}", data_plane.bound().http_addr);
    let (generated_admin_token, _) = control_plane.generated_tokens();
    let line = serde_json::json!({
        "admin_url": admin_url,
        "proxy_url": proxy_url,
        "https_addr": data_plane.bound().https_addr.to_string(),
        "ops_addr": data_plane.bound().ops_addr.to_string(),
        "grpc_addr": control_plane.grpc_addr().to_string(),
    });
    println!("{line}");
    eprintln!("Sluice is running.");
    eprintln!("  admin API:  {admin_url}   (OpenAPI UI at {admin_url}/docs)");
    eprintln!("  dashboard:  {admin_url}/ui   (sign in with the admin token)");
    eprintln!("  proxy:      {proxy_url}");
    match generated_admin_token {
        Some(token) => eprintln!("  admin token (shown once, only its digest is stored): {token}"),
        None => eprintln!("  admin token: the one given, or the one printed at first start"),
    }
    tracing::info!(%admin_url, %proxy_url, "standalone gateway listening");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let cp_task = tokio::spawn(control_plane.run_until_stopped(stopped()));
    let dp_task = tokio::spawn(data_plane.run_until(stopped()));
    cp::shutdown_signal().await;
    let _ = stop_tx.send(true);
    // Data plane first finishes in-flight traffic; the control plane can go any time.
    dp_task.await.context("data plane task")?.context("data plane")?;
    cp_task.await.context("control plane task")??;
    Ok(())
}
