//! First step of every sync stream: the cluster token check, before anything
//! of the stream is read.

use tonic::metadata::{Ascii, MetadataValue};

use crate::tokens::TokenDigest;

/// Why a stream was refused. The text goes back to the data plane, so it says
/// what to fix and never echoes what was presented.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("missing cluster token: send `authorization: Bearer <cluster token>` metadata")]
    Missing,
    #[error("malformed authorization metadata: expected `Bearer <cluster token>`")]
    Malformed,
    #[error("invalid cluster token")]
    Invalid,
}

/// Checks `Bearer <token>` against the cluster token.
pub fn check(header: Option<&MetadataValue<Ascii>>, cluster_token: &TokenDigest) -> Result<(), AuthError> {
    let header = header.ok_or(AuthError::Missing)?;
    let text = header.to_str().map_err(|_| AuthError::Malformed)?;
    let (scheme, presented) = text.split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::Malformed);
    }
    if cluster_token.matches(presented.trim()) { Ok(()) } else { Err(AuthError::Invalid) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> MetadataValue<Ascii> {
        MetadataValue::try_from(text).unwrap()
    }

    #[test]
    fn checks_bearer_token() {
        let cases: &[(Option<&str>, Result<(), AuthError>)] = &[
            (Some("Bearer s3cret"), Ok(())),
            (Some("bearer s3cret"), Ok(())),
            (Some("Bearer s3cret "), Ok(())),
            (None, Err(AuthError::Missing)),
            (Some("s3cret"), Err(AuthError::Malformed)),
            (Some("Basic s3cret"), Err(AuthError::Malformed)),
            (Some("Bearer wrong"), Err(AuthError::Invalid)),
            (Some("Bearer s3cre"), Err(AuthError::Invalid)),
            (Some("Bearer "), Err(AuthError::Invalid)),
        ];
        for (header, expected) in cases {
            let header = header.map(value);
            assert_eq!(&check(header.as_ref(), &TokenDigest::of("s3cret")), expected, "{header:?}");
        }
    }
}
