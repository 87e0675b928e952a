//! Start-up settings of `sluice-dp`: parsed once in `main` from flags or
//! `SLUICE_*` environment variables, then handed to [`crate::app::App::build`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};
use http::HeaderName;

use crate::policy::auth_failures::{DEFAULT_AUTH_FAILURE_LIMIT, DEFAULT_AUTH_FAILURE_WINDOW};
use crate::policy::rate_limit::{Cidr, CidrError};
use crate::policy::remote_jwks::DEFAULT_MIN_REFRESH_INTERVAL;
use crate::proxy::{
    DEFAULT_CLIENT_BODY_TIMEOUT, DEFAULT_HEADER_LIMITS, DEFAULT_IDLE_TIMEOUT, DEFAULT_REQUEST_ID_HEADER, HeaderLimits,
};
use crate::sync::SyncTls;
use crate::trace::{DEFAULT_SERVICE_NAME, TraceSettings};

/// An on/off switch spelled the way operators write it in env files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

impl Switch {
    pub fn is_on(self) -> bool {
        self == Switch::On
    }
}

// Tracing's flags, one definition for `sluice-dp` and `sluice standalone`
// (which flattens it into its own arguments), so the two cannot drift. Not a
// doc comment: clap would take it as the help text of the command it joins.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct TraceFlags {
    /// OTLP/gRPC endpoint of a trace collector (`http://collector:4317`, or
    /// `https://` verified against the system's CAs). Unset (the default):
    /// no tracing, and `traceparent`/`tracestate` pass as any other header.
    #[arg(long, env = "SLUICE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Share of new traces sampled, 0 to 1. A client's `traceparent` decides
    /// for the traces it started (its sampled flag).
    #[arg(long, env = "SLUICE_TRACE_SAMPLING_RATIO", default_value_t = 1.0, value_parser = parse_ratio)]
    pub trace_sampling_ratio: f64,

    /// `service.name` of the exported spans.
    #[arg(long, env = "SLUICE_SERVICE_NAME", default_value = DEFAULT_SERVICE_NAME)]
    pub service_name: String,
}

impl Default for TraceFlags {
    fn default() -> Self {
        Self { otlp_endpoint: None, trace_sampling_ratio: 1.0, service_name: DEFAULT_SERVICE_NAME.into() }
    }
}

/// Everything a data plane needs to start: where the control plane is, how to
/// authenticate to it, and where to listen. The data plane holds no other state.
#[derive(Debug, Clone, Parser)]
#[command(name = "sluice-dp", version, about = "Sluice data plane: proxies traffic by the control plane's snapshots")]
pub struct Settings {
    /// gRPC address of the control plane's sync service.
    #[arg(long, env = "SLUICE_CONTROL_PLANE", default_value = "http://127.0.0.1:9090")]
    pub control_plane: String,

    /// PEM CA bundle the control plane's certificate must chain to, for an
    /// `https://` control plane (default: the system's CAs). Read again at
    /// every connection.
    #[arg(long, env = "SLUICE_CONTROL_PLANE_CA")]
    pub control_plane_ca: Option<PathBuf>,

    /// PEM client certificate presented to a control plane that requires
    /// mutual TLS (`sluice-cp --grpc-client-ca`). Read again at every connection.
    #[arg(long, env = "SLUICE_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,

    /// PEM private key of `--client-cert`.
    #[arg(long, env = "SLUICE_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,

    /// Shared secret presented to the control plane as `Bearer <token>`.
    /// A token may start with `-` (one in 64 generated ones does).
    #[arg(long, env = "SLUICE_CLUSTER_TOKEN", hide_env_values = true, allow_hyphen_values = true)]
    pub cluster_token: Option<String>,

    /// Plain-HTTP proxy listener (HTTP/1.1 and h2c). Port 0 picks a free port.
    #[arg(long, env = "SLUICE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,

    /// TLS proxy listener (HTTP/1.1 and HTTP/2 by ALPN); certificates come
    /// from the snapshot, picked by SNI. Port 0 picks a free port.
    #[arg(long, env = "SLUICE_HTTPS_ADDR", default_value = "0.0.0.0:8443")]
    pub https_addr: SocketAddr,

    /// Ops listener: /healthz, /readyz, /metrics. Loopback by default because
    /// metrics reveal the configuration.
    #[arg(long, env = "SLUICE_OPS_ADDR", default_value = "127.0.0.1:9100")]
    pub ops_addr: SocketAddr,

    /// Name shown on the control plane; defaults to the hostname plus a random
    /// suffix so that two nodes on one host stay distinct.
    #[arg(long, env = "SLUICE_NODE_ID")]
    pub node_id: Option<String>,

    /// File keeping the last applied snapshot, loaded at start so that a node
    /// restarted while the control plane is down still serves traffic.
    #[arg(long, env = "SLUICE_SNAPSHOT_CACHE")]
    pub snapshot_cache: Option<PathBuf>,

    /// One JSON line per request on stdout.
    #[arg(long, env = "SLUICE_ACCESS_LOG", value_enum, default_value = "on")]
    pub access_log: Switch,

    /// The header carrying the request ID: a client's well-formed one is
    /// kept, else the data plane makes one; it goes upstream, back to the
    /// client, into the access log and every problem body.
    #[arg(long, env = "SLUICE_REQUEST_ID_HEADER", default_value = DEFAULT_REQUEST_ID_HEADER, value_parser = parse_request_id_header)]
    pub request_id_header: HeaderName,

    /// Redis for cluster-wide rate limits (`redis://host:6379`). Without it,
    /// `cluster_wide` limits are enforced per node.
    #[arg(long, env = "SLUICE_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,

    /// Comma-separated CIDRs of proxies in front of this data plane (load
    /// balancers). Only from these peers is `X-Forwarded-For` believed when
    /// rate limits key by client address; empty trusts nobody.
    // The full `Vec` path makes clap parse the whole list at once, so an
    // empty `SLUICE_TRUSTED_PROXIES=` means none rather than an error.
    #[arg(long, env = "SLUICE_TRUSTED_PROXIES", default_value = "", value_parser = parse_cidr_list)]
    pub trusted_proxies: ::std::vec::Vec<Cidr>,

    /// Failed authentications (any method) allowed per client address, and
    /// failed basic-auth passwords per username, within
    /// `--auth-failure-window-secs`; past it the client gets 429 before any
    /// credential is checked, until the window ends. 0 turns the limit off.
    #[arg(long, env = "SLUICE_AUTH_FAILURE_LIMIT", default_value_t = DEFAULT_AUTH_FAILURE_LIMIT)]
    pub auth_failure_limit: u32,

    /// The window of `--auth-failure-limit`, in seconds.
    #[arg(long, env = "SLUICE_AUTH_FAILURE_WINDOW_SECS", default_value_t = DEFAULT_AUTH_FAILURE_WINDOW.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub auth_failure_window_secs: u64,

    /// Least time between two early fetches of a `jwt.jwks_url` document, in
    /// seconds: a token naming a `kid` the document lacks makes the data plane
    /// fetch it again (the issuer may have rotated its keys), at most this often.
    #[arg(long, env = "SLUICE_JWKS_MIN_REFRESH_INTERVAL_SECS", default_value_t = DEFAULT_MIN_REFRESH_INTERVAL.as_secs())]
    pub jwks_min_refresh_interval_secs: u64,

    /// Interval of heartbeats to the control plane, in milliseconds.
    #[arg(long, env = "SLUICE_HEARTBEAT_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub heartbeat_ms: u64,

    /// How long in-flight requests may run after SIGTERM/SIGINT, in seconds.
    #[arg(long, env = "SLUICE_SHUTDOWN_GRACE_SECS", default_value_t = 30)]
    pub shutdown_grace_secs: u64,

    /// Seconds a client connection may stay open with no request in flight
    /// (kept alive between requests, or sending its request head) before
    /// the data plane closes it.
    #[arg(long, env = "SLUICE_CLIENT_IDLE_TIMEOUT_SECS", default_value_t = DEFAULT_IDLE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub client_idle_timeout_secs: u64,

    /// Largest request head a client may send, all header lines together, in
    /// bytes; a larger one is answered 431.
    #[arg(long, env = "SLUICE_MAX_REQUEST_HEADER_BYTES", default_value_t = DEFAULT_HEADER_LIMITS.total, value_parser = clap::value_parser!(u32).range(8192..))]
    pub max_request_header_bytes: u32,

    /// Largest single request header (name and value), in bytes; a larger one is answered 431.
    #[arg(long, env = "SLUICE_MAX_REQUEST_HEADER_FIELD_BYTES", default_value_t = DEFAULT_HEADER_LIMITS.field, value_parser = clap::value_parser!(u32).range(256..))]
    pub max_request_header_field_bytes: u32,

    /// Pass client headers whose names hold `_` (nginx's
    /// `underscores_in_headers`). Off by default: many upstreams (CGI, WSGI)
    /// read `X_Consumer_Username` as `X-Consumer-Username`, a header only the
    /// gateway may set, so such headers are dropped.
    #[arg(long, env = "SLUICE_UNDERSCORES_IN_HEADERS", value_enum, default_value = "off")]
    pub underscores_in_headers: Switch,
    /// Seconds a client may take to send a request's whole body, counted
    /// from its head, on every route (streamed upstream or buffered for
    /// OpenAPI validation); a slower one gets 408 and the upstream never
    /// gets a complete request.
    #[arg(long, env = "SLUICE_CLIENT_BODY_TIMEOUT_SECS", default_value_t = DEFAULT_CLIENT_BODY_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub client_body_timeout_secs: u64,

    /// Threads serving traffic (each runs its own event loop, see
    /// `proxy::workers`); 0 (the default) means one per CPU core the process
    /// may use. Fewer leave cores to other processes on the host.
    #[arg(long, env = "SLUICE_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,

    #[command(flatten)]
    pub trace: TraceFlags,

    /// Do not start: ask the `/readyz` of the data plane already running with
    /// these settings (its `--ops-addr`) and exit 0 if it is ready, 1 if not.
    /// A container healthcheck that needs no curl in the image.
    #[arg(long)]
    pub check_ready: bool,
}

impl Settings {
    /// Settings with every default, for tests and embedding (`sluice standalone`).
    pub fn with_defaults() -> Self {
        Self {
            control_plane: "http://127.0.0.1:9090".into(),
            control_plane_ca: None,
            client_cert: None,
            client_key: None,
            cluster_token: None,
            http_addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
            https_addr: SocketAddr::from(([0, 0, 0, 0], 8443)),
            ops_addr: SocketAddr::from(([127, 0, 0, 1], 9100)),
            node_id: None,
            snapshot_cache: None,
            access_log: Switch::On,
            request_id_header: HeaderName::from_static(DEFAULT_REQUEST_ID_HEADER),
            redis_url: None,
            trusted_proxies: Vec::new(),
            auth_failure_limit: DEFAULT_AUTH_FAILURE_LIMIT,
            auth_failure_window_secs: DEFAULT_AUTH_FAILURE_WINDOW.as_secs(),
            jwks_min_refresh_interval_secs: DEFAULT_MIN_REFRESH_INTERVAL.as_secs(),
            heartbeat_ms: 5_000,
            shutdown_grace_secs: 30,
            client_idle_timeout_secs: DEFAULT_IDLE_TIMEOUT.as_secs(),
            max_request_header_bytes: DEFAULT_HEADER_LIMITS.total,
            max_request_header_field_bytes: DEFAULT_HEADER_LIMITS.field,
            underscores_in_headers: Switch::Off,
            client_body_timeout_secs: DEFAULT_CLIENT_BODY_TIMEOUT.as_secs(),
            worker_threads: 0,
            trace: TraceFlags::default(),
            check_ready: false,
        }
    }

    /// The sync channel's TLS files.
    pub fn sync_tls(&self) -> SyncTls {
        SyncTls {
            control_plane_ca: self.control_plane_ca.clone(),
            client_identity: self.client_cert.clone().zip(self.client_key.clone()),
        }
    }

    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms.max(1))
    }

    /// Where a local probe reaches the ops listener: a wildcard bind address
    /// is not connectable, so it becomes the loopback of the same family.
    pub fn ops_probe_addr(&self) -> SocketAddr {
        let mut addr = self.ops_addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        addr
    }

    pub fn client_idle_timeout(&self) -> Duration {
        Duration::from_secs(self.client_idle_timeout_secs)
    }

    /// What the proxy accepts of a client's request headers.
    pub fn header_limits(&self) -> HeaderLimits {
        HeaderLimits {
            total: self.max_request_header_bytes,
            field: self.max_request_header_field_bytes,
            underscores: self.underscores_in_headers.is_on(),
        }
    }

    pub fn auth_failure_window(&self) -> Duration {
        Duration::from_secs(self.auth_failure_window_secs)
    }

    pub fn client_body_timeout(&self) -> Duration {
        Duration::from_secs(self.client_body_timeout_secs)
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }

    /// Tracing's settings, `None` without `--otlp-endpoint` (tracing off).
    pub fn tracing(&self, node_id: &str) -> Option<TraceSettings> {
        let flags = &self.trace;
        let endpoint = flags.otlp_endpoint.as_deref().map(str::trim).filter(|url| !url.is_empty())?;
        Some(TraceSettings {
            endpoint: endpoint.to_owned(),
            sampling_ratio: flags.trace_sampling_ratio,
            service_name: flags.service_name.clone(),
            node_id: node_id.to_owned(),
        })
    }

    /// The configured node id, or `<hostname>-<6 hex chars>`.
    pub fn resolved_node_id(&self) -> String {
        match &self.node_id {
            Some(id) if !id.trim().is_empty() => id.trim().to_owned(),
            _ => format!("{}-{:06x}", hostname(), rand::random::<u32>() & 0x00ff_ffff),
        }
    }
}

/// A header name for request IDs; not one that frames or routes the message,
/// describes one hop, or that the gateway sets itself.
fn parse_request_id_header(text: &str) -> Result<HeaderName, String> {
    const RESERVED: [&str; 16] = [
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "via",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "x-consumer-username",
    ];
    let name = HeaderName::try_from(text.trim()).map_err(|e| format!("`{text}` is not a header name: {e}"))?;
    if RESERVED.contains(&name.as_str()) || name.as_str().starts_with("ratelimit") {
        return Err(format!("`{name}` is set or read by the gateway for another purpose"));
    }
    Ok(name)
}

/// A number from 0 to 1.
fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(format!("`{text}` is not a number from 0 to 1")),
    }
}

/// `10.0.0.0/8, 192.168.1.1` -> CIDRs; blank entries are skipped.
fn parse_cidr_list(text: &str) -> Result<Vec<Cidr>, CidrError> {
    text.split(',').map(str::trim).filter(|c| !c.is_empty()).map(str::parse).collect()
}

/// The machine's hostname without pulling in a crate for it: the kernel's
/// value on Linux, then `$HOSTNAME`, then a fixed name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "sluice-dp".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_design() {
        let parsed = Settings::try_parse_from(["sluice-dp"]).unwrap();
        let built = Settings::with_defaults();
        assert_eq!(parsed.control_plane, built.control_plane);
        assert_eq!(parsed.http_addr, built.http_addr);
        assert_eq!(parsed.https_addr, built.https_addr);
        assert_eq!(parsed.ops_addr, built.ops_addr);
        assert_eq!(parsed.access_log, Switch::On);
        assert_eq!(parsed.heartbeat_ms, built.heartbeat_ms);
        assert_eq!(parsed.header_limits(), built.header_limits());
        assert_eq!(parsed.header_limits(), crate::proxy::DEFAULT_HEADER_LIMITS);
        assert_eq!(parsed.request_id_header, built.request_id_header);
    }

    #[test]
    fn a_token_may_start_with_a_hyphen() {
        let parsed = Settings::try_parse_from(["sluice-dp", "--cluster-token", "-iX_9", "--node-id", "n1"]).unwrap();
        assert_eq!(parsed.cluster_token.as_deref(), Some("-iX_9"));
    }

    #[test]
    fn request_id_header_names() {
        let parse = |name: &str| Settings::try_parse_from(["sluice-dp", "--request-id-header", name]);
        assert_eq!(parse("X-Correlation-ID").unwrap().request_id_header, "x-correlation-id");
        for refused in ["host", "Connection", "x-consumer-username", "x-forwarded-for", "bad name", ""] {
            assert!(parse(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn flags_parse() {
        let s = Settings::try_parse_from([
            "sluice-dp",
            "--http-addr",
            "127.0.0.1:0",
            "--access-log",
            "off",
            "--node-id",
            "n1",
            "--snapshot-cache",
            "/tmp/x.pb",
        ])
        .unwrap();
        assert_eq!(s.http_addr.port(), 0);
        assert!(!s.access_log.is_on());
        assert_eq!(s.resolved_node_id(), "n1");
        assert_eq!(s.snapshot_cache, Some(PathBuf::from("/tmp/x.pb")));
    }

    #[test]
    fn trusted_proxies_parse_as_a_list() {
        let s = Settings::try_parse_from(["sluice-dp", "--trusted-proxies", "10.0.0.0/8, 192.168.1.1,::1"]).unwrap();
        let shown: Vec<String> = s.trusted_proxies.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.0.0.0/8", "192.168.1.1/32", "::1/128"]);
        assert!(Settings::try_parse_from(["sluice-dp", "--trusted-proxies", "10.0.0.0/33"]).is_err());
        assert!(Settings::try_parse_from(["sluice-dp"]).unwrap().trusted_proxies.is_empty());
        assert!(Settings::try_parse_from(["sluice-dp", "--trusted-proxies", ""]).unwrap().trusted_proxies.is_empty());
    }

    #[test]
    fn the_ready_probe_dials_loopback_for_a_wildcard_bind() {
        let s = Settings::try_parse_from(["sluice-dp", "--check-ready", "--ops-addr", "0.0.0.0:9100"]).unwrap();
        assert!(s.check_ready);
        assert_eq!(s.ops_probe_addr(), "127.0.0.1:9100".parse::<SocketAddr>().unwrap());
        let s = Settings::try_parse_from(["sluice-dp", "--ops-addr", "10.1.2.3:9100"]).unwrap();
        assert_eq!(s.ops_probe_addr(), "10.1.2.3:9100".parse::<SocketAddr>().unwrap());
    }

    #[test]
    fn tracing_is_off_unless_an_endpoint_is_set() {
        assert!(Settings::try_parse_from(["sluice-dp"]).unwrap().tracing("n").is_none());
        assert!(Settings::try_parse_from(["sluice-dp", "--otlp-endpoint", " "]).unwrap().tracing("n").is_none());
        let s = Settings::try_parse_from([
            "sluice-dp",
            "--otlp-endpoint",
            "http://collector:4317",
            "--trace-sampling-ratio",
            "0.25",
            "--service-name",
            "edge",
        ])
        .unwrap();
        let tracing = s.tracing("n1").unwrap();
        assert_eq!(
            (
                tracing.endpoint.as_str(),
                tracing.sampling_ratio,
                tracing.service_name.as_str(),
                tracing.node_id.as_str()
            ),
            ("http://collector:4317", 0.25, "edge", "n1")
        );
        assert_eq!(Settings::try_parse_from(["sluice-dp"]).unwrap().trace, TraceFlags::default());
        for bad in ["1.5", "-0.1", "x", "NaN"] {
            assert!(Settings::try_parse_from(["sluice-dp", "--trace-sampling-ratio", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn generated_node_ids_differ() {
        let s = Settings::with_defaults();
        assert_ne!(s.resolved_node_id(), s.resolved_node_id());
    }
}
