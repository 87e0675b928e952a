//! Admin and cluster tokens. A token given by flag or env is used as is; with
//! none, one is generated at first start, printed once, and only its SHA-256
//! digest is stored, so later starts (and other replicas on the same
//! database) accept it without the plaintext ever being kept.

use sha2::{Digest, Sha256};

use crate::credentials::{constant_time_eq, generate_token};
use crate::store::{Store, StoreError};

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
    let token = generate_token();
    let digest = TokenDigest::of(&token);
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
}
