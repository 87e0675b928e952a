//! The contract between Sluice's control plane and data planes: the snapshot
//! types and the sync service (generated from `proto/sluice.proto`), the hash
//! that identifies a snapshot's content, the structural validation both
//! planes run before they accept a snapshot, and the request-path rules
//! (canonical form, percent-decoding) both planes apply.

mod canonical;
pub mod host;
pub mod password;
pub mod path;
pub mod tls;
mod validate;

/// Generated types and the `ConfigSync` service.
pub mod v1 {
    #![allow(clippy::all, clippy::unwrap_used, clippy::expect_used, missing_docs)]
    tonic::include_proto!("sluice.v1");
}

pub use canonical::{canonicalize, content_hash};
pub use password::check_password_hash;
pub use validate::{MAX_NAME_LEN, NAME_PATTERN, Violation, check_name, parse_cidr, policy_name, validate};

/// Version of the sync protocol. A data plane whose Hello carries another
/// version is refused with a reason, so that a mixed-version cluster fails
/// loudly instead of misreading snapshots.
pub const PROTOCOL_VERSION: u32 = 1;

/// Metadata key carrying `Bearer <cluster token>` on the sync stream.
pub const AUTHORIZATION_METADATA: &str = "authorization";
