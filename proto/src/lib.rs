//! The contract between Sluice's control plane and data planes: the snapshot
//! types and the sync service (generated from `proto/sluice.proto`), the hash
//! that identifies a snapshot's content, the structural validation both
//! planes run before they accept a snapshot, the request-path rules
//! (canonical form, percent-decoding) both planes apply, and the rules both
//! apply when they read a snapshot (routes, CIDRs, TLS material, JWT keys, the
//! OpenAPI specs APIs validate with): the control plane checks a write with the code a data
//! plane compiles it with ([`check_compilable`]), so it refuses what they
//! would refuse; and how heartbeats summarise traffic and target health
//! ([`telemetry`]).

mod canonical;
mod cidr;
mod compilable;
pub mod host;
pub mod jwt;
pub mod openapi;
pub mod password;
pub mod path;
pub mod policy;
pub mod routes;
pub mod telemetry;
pub mod text;
pub mod tls;
mod validate;

/// Generated types and the `ConfigSync` service.
pub mod v1 {
    #![allow(clippy::all, clippy::unwrap_used, clippy::expect_used, missing_docs)]
    tonic::include_proto!("sluice.v1");
}

pub use canonical::{canonicalize, content_hash};
pub use cidr::{Cidr, CidrError};
pub use compilable::check_compilable;
pub use password::check_password_hash;
pub use validate::{MAX_NAME_LEN, NAME_PATTERN, Violation, check_name, policy_name, validate};

/// Version of the sync protocol. A data plane whose Hello carries another
/// version is refused with a reason, so that a mixed-version cluster fails
/// loudly instead of misreading snapshots.
pub const PROTOCOL_VERSION: u32 = 1;

/// An upstream's retry budget when its `retry_budget` is unset: retries may
/// add a fifth of its requests (as Envoy's and Finagle's budgets)...
pub const DEFAULT_RETRY_RATIO: f64 = 0.2;
/// ...plus ten per second whatever the traffic (Finagle's and Linkerd's
/// minimum), so that a quiet upstream can always retry.
pub const DEFAULT_MIN_RETRIES_PER_SECOND: u32 = 10;
/// The most `min_retries_per_second` may be.
pub const MAX_MIN_RETRIES_PER_SECOND: u32 = 1_000;

/// Metadata key carrying `Bearer <cluster token>` on the sync stream.
pub const AUTHORIZATION_METADATA: &str = "authorization";
