//! JWT verification keys, loaded by a data plane when it compiles a `jwt`
//! policy and by the control plane, with the same functions, before it
//! commits a snapshot: a consumer's key and an API's JWKS that the control
//! plane accepts are keys every data plane of its version can load.

use std::str::FromStr as _;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey};

/// A key that cannot be used, with the reason.
#[derive(Debug, thiserror::Error)]
pub enum JwtKeyError {
    #[error("unsupported algorithm `{0}`")]
    Algorithm(String),
    #[error("an HMAC key needs a secret")]
    NoSecret,
    #[error("the key cannot be loaded: {0}")]
    Load(#[source] jsonwebtoken::errors::Error),
    #[error("the JWKS is not a JWK set (RFC 7517): {0}")]
    NotASet(#[source] serde_json::Error),
    #[error("the JWKS lists no keys")]
    NoKeys,
    #[error("JWKS {key}: {reason}")]
    Jwk { key: String, reason: Box<JwtKeyError> },
    #[error("symmetric (`oct`) keys are not accepted in a JWKS; give the consumer a JWT key")]
    Symmetric,
    #[error("algorithm `{0:?}` does not match the key type")]
    Mismatch(Algorithm),
}

/// An algorithm by its JOSE name (`RS256`); `none` is not one.
pub fn algorithm(name: &str) -> Result<Algorithm, JwtKeyError> {
    Algorithm::from_str(name).map_err(|_| JwtKeyError::Algorithm(name.to_owned()))
}

/// A consumer's verification key: its secret for HMAC algorithms, its PEM
/// public key for the others.
pub fn decoding_key(algorithm: Algorithm, secret: &str, public_key_pem: &str) -> Result<DecodingKey, JwtKeyError> {
    let pem = public_key_pem.as_bytes();
    let key = match algorithm.family() {
        AlgorithmFamily::Hmac if secret.is_empty() => return Err(JwtKeyError::NoSecret),
        AlgorithmFamily::Hmac => DecodingKey::from_secret(secret.as_bytes()),
        AlgorithmFamily::Rsa => DecodingKey::from_rsa_pem(pem),
        AlgorithmFamily::Ec => DecodingKey::from_ec_pem(pem),
        AlgorithmFamily::Ed => DecodingKey::from_ed_pem(pem),
    };
    key.map_err(JwtKeyError::Load)
}

/// One usable signature key of a JWKS, with the algorithms it may verify.
pub struct JwksKey {
    pub kid: Option<String>,
    pub key: DecodingKey,
    /// Never empty; every one of the key's own family (fixed by `kty`).
    pub algorithms: Vec<Algorithm>,
}

/// The signature keys of an issuer's JWKS that an API accepting `accepted`
/// (all algorithms when empty) can use. Skipped, so a provider's document
/// works as published: encryption keys (`use: enc`), key types and curves
/// that cannot verify here, keys of algorithms the API does not accept.
/// Refused: a document that is not a JWK set or lists no keys, a symmetric
/// (`oct`) key, since a JWKS is published and a shared secret in it would
/// let anyone who reads it mint tokens, a key whose stated `alg` does not
/// fit its type, and a key that does not load.
pub fn jwks_keys(jwks: &str, accepted: &[Algorithm]) -> Result<Vec<JwksKey>, JwtKeyError> {
    let set: JwkSet = serde_json::from_str(jwks).map_err(JwtKeyError::NotASet)?;
    if set.keys.is_empty() {
        return Err(JwtKeyError::NoKeys);
    }
    let mut keys = Vec::with_capacity(set.keys.len());
    for (i, jwk) in set.keys.iter().enumerate() {
        let at = |reason: JwtKeyError| {
            let key = jwk.common.key_id.as_ref().map_or_else(|| format!("key {i}"), |kid| format!("key `{kid}`"));
            JwtKeyError::Jwk { key, reason: Box::new(reason) }
        };
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let mut algorithms = jwk_algorithms(jwk).map_err(at)?;
        if !accepted.is_empty() {
            algorithms.retain(|a| accepted.contains(a));
        }
        if algorithms.is_empty() {
            continue;
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|e| at(JwtKeyError::Load(e)))?;
        keys.push(JwksKey { kid: jwk.common.key_id.clone(), key, algorithms });
    }
    Ok(keys)
}

/// The algorithms a JWK may verify: its `alg` when it states one, otherwise
/// every algorithm of its key type (and curve). None for a key type or curve
/// that cannot verify here.
fn jwk_algorithms(jwk: &Jwk) -> Result<Vec<Algorithm>, JwtKeyError> {
    let family = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return Ok(Vec::new()),
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => vec![Algorithm::EdDSA],
        AlgorithmParameters::OctetKeyPair(_) => return Ok(Vec::new()),
        AlgorithmParameters::OctetKey(_) => return Err(JwtKeyError::Symmetric),
        _ => return Ok(Vec::new()),
    };
    match jwk.common.key_algorithm {
        None => Ok(family),
        Some(stated) => {
            let stated = Algorithm::try_from(stated).map_err(|_| JwtKeyError::Algorithm(stated.to_string()))?;
            if family.contains(&stated) { Ok(vec![stated]) } else { Err(JwtKeyError::Mismatch(stated)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RSA_N: &str = "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw";

    fn rsa(extra: &str) -> String {
        format!(r#"{{"kty":"RSA","n":"{RSA_N}","e":"AQAB"{extra}}}"#)
    }

    #[test]
    fn a_providers_jwks_with_an_encryption_key_is_usable() {
        let set =
            format!(r#"{{"keys":[{},{}]}}"#, rsa(r#","kid":"sig","use":"sig""#), rsa(r#","kid":"enc","use":"enc""#));
        let keys = jwks_keys(&set, &[]).unwrap();
        assert_eq!(keys.iter().map(|k| k.kid.as_deref()).collect::<Vec<_>>(), [Some("sig")]);
        // A key of algorithms the API does not accept is left out.
        assert!(jwks_keys(&set, &[Algorithm::ES256]).unwrap().is_empty());
    }

    #[test]
    fn unusable_documents_are_refused() {
        for (set, expected) in [
            ("not json".to_owned(), "not a JWK set"),
            (r#"{"keys":[]}"#.to_owned(), "lists no keys"),
            (r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"s"}]}"#.to_owned(), "key `s`: symmetric"),
            (format!(r#"{{"keys":[{}]}}"#, rsa(r#","alg":"ES256""#)), "key 0: algorithm `ES256` does not match"),
        ] {
            let error = jwks_keys(&set, &[]).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains(expected), "{set}: {error}");
        }
    }

    #[test]
    fn consumer_keys_load_by_algorithm() {
        assert!(decoding_key(Algorithm::HS256, "secret", "").is_ok());
        assert!(matches!(decoding_key(Algorithm::HS256, "", ""), Err(JwtKeyError::NoSecret)));
        assert!(matches!(decoding_key(Algorithm::RS256, "", "not a PEM key"), Err(JwtKeyError::Load(_))));
        assert!(matches!(algorithm("none"), Err(JwtKeyError::Algorithm(_))));
    }
}
