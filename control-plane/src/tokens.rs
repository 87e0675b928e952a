//! Admin and cluster tokens. A token given by flag or env is used as is; with
//! none, one is generated at first start, printed once, and only its SHA-256
//! digest is stored, so later starts (and other replicas on the same
//! database) accept it without the plaintext ever being kept. Beside that
//! startup token, named admin tokens carry a [`Role`] (`sluice-cp tokens`,
//! `/v1/tokens`); their digests live in the store's `admin_tokens` table.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use crate::credentials::{constant_time_eq, generate_token};
use crate::store::{Store, StoreError};

/// The name the startup admin token (`--admin-token`, or the one generated at
/// first start) goes by in the history; no named token may take it.
pub const STARTUP_TOKEN_NAME: &str = "admin-token";

/// What an admin token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Everything, including managing tokens.
    Admin,
    /// Reading only (GET): dashboards, CI checks, `sluice status`.
    ReadOnly,
}

impl Role {
    /// The `role` column's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::ReadOnly => "read-only",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        [Role::Admin, Role::ReadOnly].into_iter().find(|role| role.as_str() == text)
    }
}

/// A named token's name: the alphabet of resource names, and not the startup token's.
pub fn check_token_name(name: &str) -> Result<(), String> {
    sluice_proto::check_name(name)?;
    if name == STARTUP_TOKEN_NAME {
        return Err(format!("`{STARTUP_TOKEN_NAME}` names the startup token (--admin-token)"));
    }
    Ok(())
}

/// Who made an admin request: the token's name and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub role: Role,
}

/// A named admin token as listed; the token itself is never kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AdminToken {
    #[schema(example = "ci")]
    pub name: String,
    pub role: Role,
    /// Unix milliseconds.
    pub created_at: i64,
    /// The token (or `sluice-cp tokens`) that created it.
    pub created_by: String,
}

/// What a presented bearer token is checked against.
#[derive(Clone)]
pub struct TokenDigest([u8; 32]);

impl TokenDigest {
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Constant-time over the digests, so response timing reveals nothing about the token.
    pub fn matches(&self, presented: &str) -> bool {
        constant_time_eq(&Self::of(presented).0, &self.0)
    }

    fn from_hex(text: &str) -> Option<Self> {
        hex::decode(text).ok()?.try_into().ok().map(Self)
    }

    /// How the digest is stored and looked up.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// A fresh random token and its digest: the token is shown once, the digest stored.
pub fn new_token() -> (String, TokenDigest) {
    let token = generate_token();
    let digest = TokenDigest::of(&token);
    (token, digest)
}

impl std::fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenDigest(..)")
    }
}

/// A resolved token; `generated` holds the plaintext only when it was created
/// by this start, for printing once.
pub struct ResolvedToken {
    pub digest: TokenDigest,
    pub generated: Option<String>,
}

/// `setting` names the stored digest, e.g. `admin_token_sha256`.
pub async fn resolve_token(store: &Store, setting: &str, given: Option<&str>) -> Result<ResolvedToken, StoreError> {
    if let Some(token) = given.filter(|t| !t.is_empty()) {
        return Ok(ResolvedToken { digest: TokenDigest::of(token), generated: None });
    }
    if let Some(digest) = store.setting(setting).await?.as_deref().and_then(TokenDigest::from_hex) {
        return Ok(ResolvedToken { digest, generated: None });
    }
    let (token, digest) = new_token();
    // Another replica may have raced us to it: keep whichever digest landed first.
    let stored = store.insert_setting_if_absent(setting, &hex::encode(digest.0)).await?;
    match TokenDigest::from_hex(&stored) {
        Some(existing) if existing.0 != digest.0 => Ok(ResolvedToken { digest: existing, generated: None }),
        _ => Ok(ResolvedToken { digest, generated: Some(token) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_matches_only_its_token() {
        let digest = TokenDigest::of("s3cret-token");
        assert!(digest.matches("s3cret-token"));
        assert!(!digest.matches("s3cret-tokem"));
        assert!(!digest.matches(""));
        assert_eq!(format!("{digest:?}"), "TokenDigest(..)");
    }

    #[test]
    fn roles_round_trip_by_name() {
        for role in [Role::Admin, Role::ReadOnly] {
            assert_eq!(Role::parse(role.as_str()), Some(role));
            assert_eq!(serde_json::to_value(role).unwrap(), role.as_str());
        }
        assert_eq!(Role::parse("root"), None);
    }
}
