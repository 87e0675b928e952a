//! Start-up settings of `sluice-cp`: flags, each also read from a `SLUICE_*`
//! environment variable, with DESIGN.md's defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// `sqlite://FILE` (created if missing) or `postgres://USER@HOST:PORT/DB`.
    #[arg(long, env = "SLUICE_DATABASE_URL", default_value = "sqlite://sluice.db")]
    pub database_url: String,

    /// Where the admin REST API listens.
    #[arg(long, env = "SLUICE_ADMIN_ADDR", default_value = "127.0.0.1:9080")]
    pub admin_addr: SocketAddr,

    /// Where data planes connect for snapshots (gRPC).
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = "127.0.0.1:9090")]
    pub grpc_addr: SocketAddr,

    /// Bearer token of the admin API. If absent, one is generated at first
    /// start, printed once, and only its digest is stored.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Token data planes present on the sync stream. Generated and printed
    /// once, like the admin token, if absent.
    #[arg(long, env = "SLUICE_CLUSTER_TOKEN", hide_env_values = true)]
    pub cluster_token: Option<String>,

    /// 32-byte key (base64 or hex) that encrypts private keys and JWT secrets
    /// at rest. If absent, a key file is used (and created at first start).
    #[arg(long, env = "SLUICE_SECRET_KEY", hide_env_values = true)]
    pub secret_key: Option<String>,

    /// Key file used when no secret key is given.
    #[arg(long, env = "SLUICE_SECRET_KEY_FILE", default_value = "sluice-secret.key")]
    pub secret_key_file: PathBuf,

    /// A data plane silent for this long is shown as stale.
    #[arg(long, env = "SLUICE_STALE_AFTER", default_value = "30s", value_parser = humantime::parse_duration)]
    pub stale_after: Duration,

    /// A snapshot pushed to a data plane and not answered (ACK or NACK)
    /// within this long is taken as lost, and the node's target is sent again.
    #[arg(long, env = "SLUICE_ACK_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub ack_timeout: Duration,

    /// A data plane silent for this long is forgotten.
    #[arg(long, env = "SLUICE_PURGE_AFTER", default_value = "1h", value_parser = humantime::parse_duration)]
    pub purge_after: Duration,
}
