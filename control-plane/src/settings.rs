//! Start-up settings of `sluice-cp`: flags, each also read from a `SLUICE_*`
//! environment variable, with DESIGN.md's defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::tls::TlsFiles;

#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// `sqlite://FILE` (created if missing) or `postgres://USER@HOST:PORT/DB`.
    #[arg(long, env = "SLUICE_DATABASE_URL", default_value = "sqlite://sluice.db")]
    pub database_url: String,

    /// Longest wait for a database connection. While the database is
    /// unreachable, admin requests answer 503 (with `Retry-After`) after this
    /// long instead of hanging, and `/readyz` says why.
    #[arg(long, env = "SLUICE_DATABASE_ACQUIRE_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub database_acquire_timeout: Duration,

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

    /// Versions kept in the snapshot history; every write deletes older ones
    /// (rollback reaches only the versions kept).
    #[arg(long, env = "SLUICE_KEEP_SNAPSHOTS", default_value_t = crate::store::DEFAULT_KEEP_SNAPSHOTS, value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_snapshots: u64,

    /// Largest OpenAPI spec an upload may carry, in bytes; a larger one is refused (422).
    #[arg(long, env = "SLUICE_MAX_SPEC_BYTES", default_value_t = crate::specs::DEFAULT_MAX_SPEC_BYTES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_spec_bytes: usize,

    /// PEM certificate chain the sync server presents: data planes then
    /// connect with `https://`. Reloaded when the file changes.
    #[arg(long, env = "SLUICE_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    pub grpc_tls_cert: Option<PathBuf>,

    /// PEM private key of `--grpc-tls-cert`. Reloaded when the file changes.
    #[arg(long, env = "SLUICE_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,

    /// PEM CA bundle: a data plane must present a client certificate that
    /// chains to it, or its connection is refused at the TLS handshake
    /// (mutual TLS; the cluster token is still checked).
    #[arg(long, env = "SLUICE_GRPC_CLIENT_CA", requires = "grpc_tls_cert")]
    pub grpc_client_ca: Option<PathBuf>,

    /// PEM certificate chain the admin API presents (HTTPS). Reloaded when the file changes.
    #[arg(long, env = "SLUICE_ADMIN_TLS_CERT", requires = "admin_tls_key")]
    pub admin_tls_cert: Option<PathBuf>,

    /// PEM private key of `--admin-tls-cert`.
    #[arg(long, env = "SLUICE_ADMIN_TLS_KEY", requires = "admin_tls_cert")]
    pub admin_tls_key: Option<PathBuf>,
}

impl Settings {
    /// The sync server's TLS files, when it serves TLS.
    pub fn grpc_tls(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.grpc_tls_cert.clone()?,
            key: self.grpc_tls_key.clone()?,
            client_ca: self.grpc_client_ca.clone(),
        })
    }

    /// The admin API's TLS files, when it serves HTTPS.
    pub fn admin_tls(&self) -> Option<TlsFiles> {
        Some(TlsFiles { cert: self.admin_tls_cert.clone()?, key: self.admin_tls_key.clone()?, client_ca: None })
    }
}
