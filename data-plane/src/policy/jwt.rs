//! `jwt`, one of the authentication steps of the policy chain: a bearer token
//! verified against the key of the consumer it names (by `kid`, or by the key
//! claim, `iss` by default), or, when it names no consumer key, against the
//! API's JWKS document (by `kid`, or its only key). Decoding keys and
//! validation rules are built once per snapshot; a request costs one
//! signature check, or a map lookup when the same token verified recently.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use http::HeaderValue;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use sluice_proto::{jwt as jwt_keys, v1};

use super::remote_jwks::{RemoteJwks, RemoteJwksSources};

struct ConsumerKey {
    consumer: Arc<str>,
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for ConsumerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerKey")
            .field("consumer", &self.consumer)
            .field("algorithms", &self.validation.algorithms)
            .finish_non_exhaustive()
    }
}

/// One verification key of the JWKS.
struct IssuerKey {
    kid: Option<String>,
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for IssuerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuerKey")
            .field("kid", &self.kid)
            .field("algorithms", &self.validation.algorithms)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub struct JwtAuth {
    key_claim: String,
    keys: HashMap<String, ConsumerKey>,
    /// A JWKS holds a handful of keys: a scan is as cheap as a map here.
    jwks: Vec<IssuerKey>,
    /// `jwks_url`: the fetched document, and the keys read from it for this policy.
    remote: Option<RemoteKeys>,
    consumer_claim: String,
    challenge: HeaderValue,
    leeway: u64,
    recently_verified: VerifiedTokens,
}

/// Tokens that verified recently. Clients send the same token until it
/// expires, and verifying it again (base64, two JSON parses, the signature:
/// for HS256 more work than the rest of the proxied request) gives the
/// same answer, except for its time window, which is checked on every hit.
/// Keyed by the whole token, so only identical bytes hit. It lives in the
/// compiled policy: a new snapshot (keys, issuer, audiences) starts empty.
#[derive(Default)]
struct VerifiedTokens {
    entries: Mutex<CachedTokens>,
}

#[derive(Default)]
struct CachedTokens {
    map: HashMap<Box<str>, VerifiedToken>,
    /// The tokens' bytes, which the entry count alone does not bound.
    bytes: usize,
}

struct VerifiedToken {
    verified: Verified,
    expires: i64,
    not_before: Option<i64>,
}

/// Bound the cache's memory, in entries and in token bytes (tokens are
/// usually a few hundred bytes, but a client chooses their size); when
/// either is reached it is emptied, the cheapest eviction that keeps it
/// bounded.
const VERIFIED_TOKENS_MAX: usize = 1_024;
const VERIFIED_TOKENS_MAX_BYTES: usize = 1024 * 1024;

/// A longer token is refused before it is decoded or looked up: real tokens
/// are far shorter, and every byte of a token is decoded, parsed and hashed.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

// Tokens are bearer secrets: never print them.
impl std::fmt::Debug for VerifiedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = self.entries.lock().map(|e| e.map.len()).unwrap_or_default();
        f.debug_struct("VerifiedTokens").field("len", &len).finish()
    }
}

impl VerifiedTokens {
    /// The cached answer while `now` is inside the token's window (with the
    /// same leeway as a full check); outside it the entry goes and the caller
    /// verifies in full, which names the reason.
    fn get(&self, token: &str, now: i64, leeway: i64) -> Option<Verified> {
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = entries.map.get(token)?;
        let in_window = entry.expires >= now - leeway && entry.not_before.is_none_or(|nbf| nbf <= now + leeway);
        if in_window {
            return Some(entry.verified.clone());
        }
        if entries.map.remove(token).is_some() {
            entries.bytes -= token.len();
        }
        None
    }

    fn insert(&self, token: &str, verified: &Verified, claims: &serde_json::Value) {
        // `exp` is required, so a verified token has one; a non-integer one is just not cached.
        let Some(expires) = claims.get("exp").and_then(serde_json::Value::as_i64) else { return };
        let not_before = match claims.get("nbf").map(serde_json::Value::as_i64) {
            None => None,
            Some(Some(nbf)) => Some(nbf),
            Some(None) => return,
        };
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if entries.map.len() >= VERIFIED_TOKENS_MAX || entries.bytes + token.len() > VERIFIED_TOKENS_MAX_BYTES {
            *entries = CachedTokens::default();
        }
        let entry = VerifiedToken { verified: verified.clone(), expires, not_before };
        if entries.map.insert(token.into(), entry).is_none() {
            entries.bytes += token.len();
        }
    }
}

/// Why a token was refused; the text goes to the client (no secrets in it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtRejection {
    #[error("the token is longer than {MAX_TOKEN_BYTES} bytes")]
    TooLong,
    #[error("the token is malformed or uses an unsupported algorithm")]
    Malformed,
    #[error("the token names no known key (by `kid` or the `{0}` claim)")]
    UnknownKey(String),
    #[error("the token's consumer claim `{0}` is missing or not a string")]
    NoConsumer(String),
    #[error("the token's algorithm is not accepted for its key")]
    Algorithm,
    #[error("the token's signature is invalid")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token's audience is not accepted")]
    Audience,
    #[error("the token's issuer is not accepted")]
    Issuer,
    #[error("the token lacks the required claim `{0}`")]
    MissingClaim(String),
    #[error("the token is invalid")]
    Invalid,
}

/// The keys of a `jwks_url` document as this policy reads them (its algorithms, issuer, audiences), re-read
/// whenever the source holds a newer document.
struct RemoteKeys {
    source: Arc<RemoteJwks>,
    spec: v1::JwtAuth,
    accepted: Vec<Algorithm>,
    keys: ArcSwap<(u64, Vec<IssuerKey>)>,
}

impl std::fmt::Debug for RemoteKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteKeys").field("url", &self.source.url()).finish_non_exhaustive()
    }
}

impl RemoteKeys {
    /// The keys of the newest document; empty before the first fetch succeeds.
    fn current(&self) -> Arc<(u64, Vec<IssuerKey>)> {
        let held = self.keys.load_full();
        let Some(document) = self.source.document() else { return held };
        if document.generation == held.0 {
            return held;
        }
        // The document was checked when fetched; keys of algorithms this policy does not accept are left out.
        let keys = issuer_keys(&self.spec, &document.text, &self.accepted).unwrap_or_default();
        let fresh = Arc::new((document.generation, keys));
        self.keys.store(fresh.clone());
        fresh
    }
}

impl JwtAuth {
    pub fn compile(
        spec: &v1::JwtAuth,
        api: &str,
        consumers: &[v1::Consumer],
        sources: &RemoteJwksSources,
    ) -> Result<Self, String> {
        let accepted = spec
            .algorithms
            .iter()
            .map(|a| jwt_keys::algorithm(a).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut keys = HashMap::new();
        for consumer in consumers {
            for credential in &consumer.jwt_credentials {
                let at = || format!("consumer `{}` JWT key `{}`", consumer.username, credential.key);
                let algorithm = jwt_keys::algorithm(&credential.algorithm).map_err(|e| format!("{}: {e}", at()))?;
                // A key whose algorithm this API does not accept can never
                // verify here; leaving it out keeps the lookup honest.
                if !accepted.is_empty() && !accepted.contains(&algorithm) {
                    continue;
                }
                let key = jwt_keys::decoding_key(algorithm, &credential.secret, &credential.public_key_pem)
                    .map_err(|e| format!("{}: {e}", at()))?;
                let validation = validation(spec, algorithm);
                let consumer = consumer.username.as_str().into();
                keys.insert(credential.key.clone(), ConsumerKey { consumer, key, validation });
            }
        }
        let challenge = HeaderValue::from_str(&format!("Bearer realm=\"{}\"", api.replace('"', "'")))
            .map_err(|_| format!("API name `{api}` cannot be sent in a header"))?;
        let key_claim = if spec.key_claim.is_empty() { "iss".to_string() } else { spec.key_claim.clone() };
        let jwks = if spec.jwks.trim().is_empty() { Vec::new() } else { issuer_keys(spec, &spec.jwks, &accepted)? };
        let remote = (!spec.jwks_url.is_empty()).then(|| RemoteKeys {
            source: sources.source(&spec.jwks_url),
            spec: spec.clone(),
            accepted: accepted.clone(),
            keys: ArcSwap::from_pointee((0, Vec::new())),
        });
        let consumer_claim =
            if spec.consumer_claim.is_empty() { "sub".to_string() } else { spec.consumer_claim.clone() };
        Ok(JwtAuth {
            key_claim,
            keys,
            jwks,
            remote,
            consumer_claim,
            challenge,
            leeway: spec.leeway_seconds,
            recently_verified: VerifiedTokens::default(),
        })
    }

    pub fn challenge(&self) -> &HeaderValue {
        &self.challenge
    }

    /// The token of an `Authorization: Bearer` header; `None` for any other scheme.
    pub fn presented(authorization: &HeaderValue) -> Option<&str> {
        let text = authorization.to_str().ok()?.trim();
        let (scheme, token) = text.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    }

    /// The consumer the token names: a configured consumer when one of its keys
    /// verified the token, else (see [`Self::verify_with_jwks`]) a claim's value.
    pub fn verify(&self, token: &str) -> Result<Verified, JwtRejection> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(JwtRejection::TooLong);
        }
        let now = i64::try_from(jsonwebtoken::get_current_timestamp()).unwrap_or(i64::MAX);
        let leeway = i64::try_from(self.leeway).unwrap_or(i64::MAX);
        if let Some(verified) = self.recently_verified.get(token, now, leeway) {
            return Ok(verified);
        }
        let (verified, claims) = self.verify_in_full(token)?;
        self.recently_verified.insert(token, &verified, &claims);
        Ok(verified)
    }

    /// [`Self::verify`] without the cache; also returns the verified claims.
    fn verify_in_full(&self, token: &str) -> Result<(Verified, serde_json::Value), JwtRejection> {
        // `alg: none` and unknown algorithms fail here: jsonwebtoken's
        // Algorithm has no `none`, so such a header does not parse.
        let header = jsonwebtoken::decode_header(token).map_err(|_| JwtRejection::Malformed)?;
        let by_kid = header.kid.as_deref().and_then(|kid| self.keys.get(kid));
        let key = match by_kid {
            Some(key) => key,
            None => {
                // Reading the claim before verifying is only for choosing the
                // key; the claims are trusted after `decode` below.
                let claims: serde_json::Value =
                    jsonwebtoken::dangerous::insecure_decode_claims(token).map_err(|_| JwtRejection::Malformed)?;
                let by_claim = claims
                    .get(&self.key_claim)
                    .and_then(serde_json::Value::as_str)
                    .and_then(|name| self.keys.get(name));
                match by_claim {
                    Some(key) => key,
                    None => return self.verify_with_jwks(token, header.kid.as_deref()),
                }
            }
        };
        jsonwebtoken::decode::<serde_json::Value>(token, &key.key, &key.validation)
            .map(|data| (Verified::Consumer(key.consumer.clone()), data.claims))
            .map_err(|e| rejection(&e))
    }

    /// A JWKS identifies an external issuer (an identity provider), not a
    /// consumer: its subjects need not be configured consumers, so the
    /// consumer is whatever the verified `consumer_claim` says. Configuring
    /// every subject as a consumer would defeat the point of delegating
    /// identity to the issuer.
    fn verify_with_jwks(&self, token: &str, kid: Option<&str>) -> Result<(Verified, serde_json::Value), JwtRejection> {
        let remote = self.remote.as_ref().map(RemoteKeys::current);
        let keys = remote.as_ref().map_or(self.jwks.as_slice(), |held| held.1.as_slice());
        let key = match kid {
            Some(kid) => keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
            // Without a `kid` only a one-key set is unambiguous.
            None => match keys {
                [only] => Some(only),
                _ => None,
            },
        };
        let Some(key) = key else {
            if let (Some(remote), Some(_)) = (&self.remote, kid) {
                // The issuer may have rotated its keys since the last fetch.
                remote.source.refresh_early();
            }
            return Err(JwtRejection::UnknownKey(self.key_claim.clone()));
        };
        let data =
            jsonwebtoken::decode::<serde_json::Value>(token, &key.key, &key.validation).map_err(|e| rejection(&e))?;
        let subject = data
            .claims
            .get(&self.consumer_claim)
            .and_then(serde_json::Value::as_str)
            .filter(|consumer| !consumer.is_empty())
            .map(|subject| Verified::Subject(Arc::from(subject)))
            .ok_or_else(|| JwtRejection::NoConsumer(self.consumer_claim.clone()))?;
        Ok((subject, data.claims))
    }
}

/// Who a verified token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// A consumer of the snapshot, whose own key verified the token.
    Consumer(Arc<str>),
    /// The `consumer_claim` of a token verified by a JWKS key: any value the
    /// issuer hands out, so unbounded (never a metric label).
    Subject(Arc<str>),
}

#[cfg(test)]
impl Verified {
    fn name(&self) -> &Arc<str> {
        match self {
            Verified::Consumer(name) | Verified::Subject(name) => name,
        }
    }
}

fn rejection(e: &jsonwebtoken::errors::Error) -> JwtRejection {
    match e.kind() {
        ErrorKind::InvalidAlgorithm => JwtRejection::Algorithm,
        ErrorKind::InvalidSignature => JwtRejection::Signature,
        ErrorKind::ExpiredSignature => JwtRejection::Expired,
        ErrorKind::ImmatureSignature => JwtRejection::NotYetValid,
        ErrorKind::InvalidAudience => JwtRejection::Audience,
        ErrorKind::InvalidIssuer => JwtRejection::Issuer,
        ErrorKind::MissingRequiredClaim(claim) => JwtRejection::MissingClaim(claim.clone()),
        ErrorKind::InvalidToken | ErrorKind::Base64(_) | ErrorKind::Json(_) | ErrorKind::Utf8(_) => {
            JwtRejection::Malformed
        }
        _ => JwtRejection::Invalid,
    }
}

/// Decoding keys of the policy's JWKS, as `sluice_proto::jwt::jwks_keys`
/// accepts them (the control plane refuses what it refuses).
fn issuer_keys(spec: &v1::JwtAuth, jwks: &str, accepted: &[Algorithm]) -> Result<Vec<IssuerKey>, String> {
    let keys = jwt_keys::jwks_keys(jwks, accepted).map_err(|e| e.to_string())?;
    Ok(keys
        .into_iter()
        .filter_map(|found| {
            let mut validation = validation(spec, *found.algorithms.first()?);
            // Every algorithm here is of the key's own family (fixed by `kty`), so
            // allowing several cannot turn the public key into an HMAC secret.
            validation.algorithms = found.algorithms;
            Some(IssuerKey { kid: found.kid, key: found.key, validation })
        })
        .collect())
}

/// One algorithm per key, never a family: accepting the family would let a
/// token choose, e.g., HS256 with an RSA public key as the HMAC secret.
fn validation(spec: &v1::JwtAuth, algorithm: Algorithm) -> Validation {
    let mut validation = Validation::new(algorithm);
    validation.leeway = spec.leeway_seconds;
    validation.validate_exp = true;
    validation.validate_nbf = true;
    let mut required = vec!["exp"];
    if !spec.issuer.is_empty() {
        validation.set_issuer(&[spec.issuer.as_str()]);
        required.push("iss");
    }
    if spec.audiences.is_empty() {
        // Without configured audiences a token's `aud` is the upstream's business.
        validation.validate_aud = false;
    } else {
        validation.set_audience(&spec.audiences);
        required.push("aud");
    }
    validation.set_required_spec_claims(&required);
    validation
}

#[cfg(test)]
#[allow(clippy::type_complexity)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    use super::*;

    fn now() -> i64 {
        i64::try_from(jsonwebtoken::get_current_timestamp()).unwrap()
    }

    fn credential(key: &str, algorithm: &str, secret: &str, public_key_pem: &str) -> v1::JwtCredential {
        v1::JwtCredential {
            key: key.into(),
            algorithm: algorithm.into(),
            secret: secret.into(),
            public_key_pem: public_key_pem.into(),
        }
    }

    fn sign(alg: Algorithm, kid: Option<&str>, claims: &serde_json::Value, key: &EncodingKey) -> String {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_string);
        encode(&header, claims, key).unwrap()
    }

    #[test]
    fn verified_tokens_are_reused_only_inside_their_window() {
        let consumers = vec![v1::Consumer {
            username: "ann".into(),
            jwt_credentials: vec![credential("ann-iss", "HS256", "ann-secret", "")],
            ..Default::default()
        }];
        let auth =
            JwtAuth::compile(&v1::JwtAuth::default(), "shop", &consumers, &RemoteJwksSources::default()).unwrap();
        let hs = EncodingKey::from_secret(b"ann-secret").unwrap();
        let ann = Verified::Consumer("ann".into());
        let t = now();
        let token = sign(Algorithm::HS256, None, &json!({"iss": "ann-iss", "exp": t + 60, "nbf": t - 10}), &hs);
        assert_eq!(auth.verify(&token), Ok(ann.clone()));
        let cache = &auth.recently_verified;
        assert_eq!(cache.get(&token, t, 0), Some(ann.clone()), "a verified token is remembered");
        assert_eq!(cache.get(&token, t + 60, 0), Some(ann.clone()));
        assert_eq!(cache.get(&token, t + 61, 0), None, "not past its exp");
        assert_eq!(cache.get(&token, t, 0), None, "an entry out of its window is dropped");

        assert_eq!(auth.verify(&token), Ok(ann.clone()));
        assert_eq!(cache.get(&token, t - 11, 0), None, "not before its nbf");
        assert_eq!(auth.verify(&token), Ok(ann.clone()));
        assert_eq!(cache.get(&token, t + 61, 5), Some(ann.clone()), "the leeway applies as in a full check");

        // Only the identical token hits: another signature is checked in full.
        let mut forged = token.clone().into_bytes();
        let i = forged.len() - 10;
        forged[i] = if forged[i] == b'A' { b'B' } else { b'A' };
        let forged = String::from_utf8(forged).unwrap();
        assert_eq!(auth.verify(&forged), Err(JwtRejection::Signature));

        // A token not yet valid is refused, and never cached.
        let early = sign(Algorithm::HS256, None, &json!({"iss": "ann-iss", "exp": t + 60, "nbf": t + 30}), &hs);
        assert_eq!(auth.verify(&early), Err(JwtRejection::NotYetValid));
        assert_eq!(cache.get(&early, t + 40, 0), None);

        // Bounded: a flood of distinct tokens does not grow it past the limit.
        for n in 0..VERIFIED_TOKENS_MAX + 10 {
            cache.insert(&format!("token-{n}"), &ann, &json!({"exp": t + 60}));
        }
        assert!(cache.entries.lock().unwrap().map.len() <= VERIFIED_TOKENS_MAX);
        assert!(!format!("{auth:?}").contains("token-"), "tokens never appear in Debug output");

        // And in bytes: large tokens (up to the size limit) fill it by size first.
        let large = "x".repeat(MAX_TOKEN_BYTES);
        for n in 0..VERIFIED_TOKENS_MAX {
            cache.insert(&format!("{large}{n}"), &ann, &json!({"exp": t + 60}));
            let entries = cache.entries.lock().unwrap();
            assert!(entries.bytes <= VERIFIED_TOKENS_MAX_BYTES, "{} bytes after {n}", entries.bytes);
            assert_eq!(entries.bytes, entries.map.keys().map(|k| k.len()).sum::<usize>());
        }

        // A token over the size limit is refused before anything reads it.
        assert_eq!(auth.verify(&format!("{token}{}", "A".repeat(MAX_TOKEN_BYTES))), Err(JwtRejection::TooLong));
    }

    #[test]
    fn verify_table() {
        let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let consumers = vec![
            v1::Consumer {
                username: "ann".into(),
                jwt_credentials: vec![credential("ann-iss", "HS256", "ann-secret", "")],
                ..Default::default()
            },
            v1::Consumer {
                username: "bob".into(),
                jwt_credentials: vec![
                    credential("bob-ec", "ES256", "", &ec.public_key_pem()),
                    credential("bob-ed", "EdDSA", "", &ed.public_key_pem()),
                ],
                ..Default::default()
            },
        ];
        let spec = v1::JwtAuth { audiences: vec!["shop".into()], leeway_seconds: 30, ..Default::default() };
        let auth = JwtAuth::compile(&spec, "shop", &consumers, &RemoteJwksSources::default()).unwrap();

        let hs = EncodingKey::from_secret(b"ann-secret").unwrap();
        let ec_key = EncodingKey::from_ec_pem(ec.serialize_pem().as_bytes()).unwrap();
        let ed_key = EncodingKey::from_ed_pem(ed.serialize_pem().as_bytes()).unwrap();
        let t = now();
        let good = json!({"iss": "ann-iss", "aud": "shop", "exp": t + 60});
        let none_token = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
            URL_SAFE_NO_PAD.encode(good.to_string())
        );
        // The public key used as an HMAC secret: the classic algorithm-confusion attack.
        let confusion = EncodingKey::from_secret(ec.public_key_pem().as_bytes()).unwrap();

        let cases: Vec<(&str, String, Result<&str, JwtRejection>)> = vec![
            ("HS256 by iss", sign(Algorithm::HS256, None, &good, &hs), Ok("ann")),
            (
                "ES256 by kid",
                sign(Algorithm::ES256, Some("bob-ec"), &json!({"aud": "shop", "exp": t + 60}), &ec_key),
                Ok("bob"),
            ),
            (
                "EdDSA by kid",
                sign(Algorithm::EdDSA, Some("bob-ed"), &json!({"aud": ["x", "shop"], "exp": t + 60}), &ed_key),
                Ok("bob"),
            ),
            (
                "expired inside leeway",
                sign(Algorithm::HS256, None, &json!({"iss": "ann-iss", "aud": "shop", "exp": t - 10}), &hs),
                Ok("ann"),
            ),
            (
                "expired",
                sign(Algorithm::HS256, None, &json!({"iss": "ann-iss", "aud": "shop", "exp": t - 300}), &hs),
                Err(JwtRejection::Expired),
            ),
            (
                "not yet valid",
                sign(
                    Algorithm::HS256,
                    None,
                    &json!({"iss": "ann-iss", "aud": "shop", "exp": t + 900, "nbf": t + 300}),
                    &hs,
                ),
                Err(JwtRejection::NotYetValid),
            ),
            (
                "wrong signature",
                sign(Algorithm::HS256, None, &good, &EncodingKey::from_secret(b"other").unwrap()),
                Err(JwtRejection::Signature),
            ),
            (
                "wrong audience",
                sign(Algorithm::HS256, None, &json!({"iss": "ann-iss", "aud": "admin", "exp": t + 60}), &hs),
                Err(JwtRejection::Audience),
            ),
            (
                "no audience",
                sign(Algorithm::HS256, None, &json!({"iss": "ann-iss", "exp": t + 60}), &hs),
                Err(JwtRejection::MissingClaim("aud".into())),
            ),
            (
                "no exp",
                sign(Algorithm::HS256, None, &json!({"iss": "ann-iss", "aud": "shop"}), &hs),
                Err(JwtRejection::MissingClaim("exp".into())),
            ),
            ("alg none", none_token, Err(JwtRejection::Malformed)),
            (
                "algorithm confusion",
                sign(Algorithm::HS256, Some("bob-ec"), &json!({"aud": "shop", "exp": t + 60}), &confusion),
                Err(JwtRejection::Algorithm),
            ),
            (
                "unknown key",
                sign(Algorithm::HS256, None, &json!({"iss": "nobody", "aud": "shop", "exp": t + 60}), &hs),
                Err(JwtRejection::UnknownKey("iss".into())),
            ),
            ("garbage", "not-a-token".into(), Err(JwtRejection::Malformed)),
        ];
        for (name, token, want) in cases {
            let got = auth.verify(&token);
            assert_eq!(got.as_ref().map(|v| &**v.name()).map_err(Clone::clone), want, "{name}");
        }
    }

    #[test]
    fn issuer_and_key_claim() {
        let consumers = vec![v1::Consumer {
            username: "ann".into(),
            jwt_credentials: vec![credential("ann-sub", "HS384", "s", "")],
            ..Default::default()
        }];
        let spec = v1::JwtAuth { issuer: "https://idp.example".into(), key_claim: "sub".into(), ..Default::default() };
        let auth = JwtAuth::compile(&spec, "shop", &consumers, &RemoteJwksSources::default()).unwrap();
        let key = EncodingKey::from_secret(b"s").unwrap();
        let exp = now() + 60;
        let ok =
            sign(Algorithm::HS384, None, &json!({"sub": "ann-sub", "iss": "https://idp.example", "exp": exp}), &key);
        assert_eq!(auth.verify(&ok).unwrap(), Verified::Consumer("ann".into()));
        let wrong_iss =
            sign(Algorithm::HS384, None, &json!({"sub": "ann-sub", "iss": "https://evil", "exp": exp}), &key);
        assert_eq!(auth.verify(&wrong_iss).unwrap_err(), JwtRejection::Issuer);
    }

    #[test]
    fn compile_table() {
        let with = |c: v1::JwtCredential| {
            vec![v1::Consumer { username: "u".into(), jwt_credentials: vec![c], ..Default::default() }]
        };
        let ok = JwtAuth::compile(
            &v1::JwtAuth::default(),
            "a",
            &with(credential("k", "HS256", "s", "")),
            &RemoteJwksSources::default(),
        )
        .unwrap();
        assert_eq!(ok.keys.len(), 1);
        // A key of an algorithm the API does not accept is left out, not an error.
        let spec = v1::JwtAuth { algorithms: vec!["RS256".into()], ..Default::default() };
        assert!(
            JwtAuth::compile(&spec, "a", &with(credential("k", "HS256", "s", "")), &RemoteJwksSources::default())
                .unwrap()
                .keys
                .is_empty()
        );
        let err = JwtAuth::compile(
            &v1::JwtAuth::default(),
            "a",
            &with(credential("k", "RS256", "", "junk")),
            &RemoteJwksSources::default(),
        )
        .unwrap_err();
        assert!(err.contains("consumer `u` JWT key `k`"), "{err}");
        let err = JwtAuth::compile(
            &v1::JwtAuth::default(),
            "a",
            &with(credential("k", "none", "", "")),
            &RemoteJwksSources::default(),
        )
        .unwrap_err();
        assert!(err.contains("unsupported algorithm"), "{err}");
    }

    /// A JWKS of an RS256 key (`rsa-1`, stated `alg`) and an Ed25519 key
    /// (`ed-1`, no `alg`), both public halves only, as an issuer publishes it.
    fn jwks() -> (String, EncodingKey, EncodingKey) {
        let rsa = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap();
        let rsa_key = EncodingKey::from_rsa_pem(rsa.serialize_pem().as_bytes()).unwrap();
        let public = DecodingKey::from_rsa_der(rsa.public_key_raw());
        let mut rsa_jwk = jsonwebtoken::jwk::Jwk::from_decoding_key(&public, Some(Algorithm::RS256)).unwrap();
        rsa_jwk.common.key_id = Some("rsa-1".into());
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let ed_key = EncodingKey::from_ed_pem(ed.serialize_pem().as_bytes()).unwrap();
        let ed_jwk =
            json!({"kty": "OKP", "crv": "Ed25519", "kid": "ed-1", "x": URL_SAFE_NO_PAD.encode(ed.public_key_raw())});
        let set = json!({"keys": [serde_json::to_value(&rsa_jwk).unwrap(), ed_jwk]});
        (set.to_string(), rsa_key, ed_key)
    }

    #[test]
    fn jwks_table() {
        let (set, rsa, ed) = jwks();
        // Ann has her own key; the issuer's subjects are not configured consumers.
        let consumers = vec![v1::Consumer {
            username: "ann".into(),
            jwt_credentials: vec![credential("ann-iss", "HS256", "ann-secret", "")],
            ..Default::default()
        }];
        let spec = v1::JwtAuth {
            issuer: "https://idp.example".into(),
            audiences: vec!["shop".into()],
            jwks: set,
            ..Default::default()
        };
        let auth = JwtAuth::compile(&spec, "shop", &consumers, &RemoteJwksSources::default()).unwrap();
        assert_eq!(auth.jwks.len(), 2);
        let t = now();
        let claims = |sub: &str, exp: i64| json!({"sub": sub, "iss": "https://idp.example", "aud": "shop", "exp": exp});
        let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let other = EncodingKey::from_ed_pem(other.serialize_pem().as_bytes()).unwrap();
        let cases: Vec<(&str, String, Result<&str, JwtRejection>)> = vec![
            ("RS256 by kid", sign(Algorithm::RS256, Some("rsa-1"), &claims("carol", t + 60), &rsa), Ok("carol")),
            ("EdDSA by kid", sign(Algorithm::EdDSA, Some("ed-1"), &claims("dave", t + 60), &ed), Ok("dave")),
            (
                "a consumer key wins over the JWKS",
                sign(
                    Algorithm::HS256,
                    Some("ann-iss"),
                    &claims("someone-else", t + 60),
                    &EncodingKey::from_secret(b"ann-secret").unwrap(),
                ),
                Ok("ann"),
            ),
            (
                "wrong kid",
                sign(Algorithm::RS256, Some("rsa-2"), &claims("carol", t + 60), &rsa),
                Err(JwtRejection::UnknownKey("iss".into())),
            ),
            (
                "no kid with two keys",
                sign(Algorithm::RS256, None, &claims("carol", t + 60), &rsa),
                Err(JwtRejection::UnknownKey("iss".into())),
            ),
            (
                "wrong signature",
                sign(Algorithm::EdDSA, Some("ed-1"), &claims("dave", t + 60), &other),
                Err(JwtRejection::Signature),
            ),
            (
                "alg other than the key's stated one",
                sign(Algorithm::PS256, Some("rsa-1"), &claims("carol", t + 60), &rsa),
                Err(JwtRejection::Algorithm),
            ),
            (
                "expired",
                sign(Algorithm::RS256, Some("rsa-1"), &claims("carol", t - 300), &rsa),
                Err(JwtRejection::Expired),
            ),
            (
                "wrong issuer",
                sign(
                    Algorithm::RS256,
                    Some("rsa-1"),
                    &json!({"sub": "carol", "iss": "https://evil", "aud": "shop", "exp": t + 60}),
                    &rsa,
                ),
                Err(JwtRejection::Issuer),
            ),
            (
                "no subject",
                sign(
                    Algorithm::RS256,
                    Some("rsa-1"),
                    &json!({"iss": "https://idp.example", "aud": "shop", "exp": t + 60}),
                    &rsa,
                ),
                Err(JwtRejection::NoConsumer("sub".into())),
            ),
        ];
        for (name, token, want) in cases {
            let got = auth.verify(&token);
            assert_eq!(got.as_ref().map(|v| &**v.name()).map_err(Clone::clone), want, "{name}");
        }
    }

    #[test]
    fn jwks_single_key_and_consumer_claim() {
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let key = EncodingKey::from_ed_pem(ed.serialize_pem().as_bytes()).unwrap();
        let set = json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(ed.public_key_raw())}]});
        let spec = v1::JwtAuth { jwks: set.to_string(), consumer_claim: "email".into(), ..Default::default() };
        let auth = JwtAuth::compile(&spec, "shop", &[], &RemoteJwksSources::default()).unwrap();
        let token = sign(Algorithm::EdDSA, None, &json!({"email": "eve@example.com", "exp": now() + 60}), &key);
        assert_eq!(auth.verify(&token).unwrap(), Verified::Subject("eve@example.com".into()));
        // An API accepting only RS256 leaves the Ed25519 key out.
        let only_rs = v1::JwtAuth { algorithms: vec!["RS256".into()], ..spec.clone() };
        assert!(JwtAuth::compile(&only_rs, "shop", &[], &RemoteJwksSources::default()).unwrap().jwks.is_empty());
    }

    #[test]
    fn jwks_compile_errors() {
        let cases = [
            ("not json", "the JWKS is not a JWK set"),
            (r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#, "symmetric"),
            (r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k", "x": "!!"}]}"#, "JWKS key `k`"),
            (r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "alg": "RS256", "x": "AA"}]}"#, "does not match"),
        ];
        for (jwks, want) in cases {
            let spec = v1::JwtAuth { jwks: jwks.into(), ..Default::default() };
            let err = JwtAuth::compile(&spec, "a", &[], &RemoteJwksSources::default()).unwrap_err();
            assert!(err.contains(want), "{jwks}: {err}");
        }
    }

    #[test]
    fn presented_table() {
        let cases = [
            ("Bearer abc.def.ghi", Some("abc.def.ghi")),
            ("bearer  x ", Some("x")),
            ("Basic abc", None),
            ("Bearer", None),
        ];
        for (value, want) in cases {
            assert_eq!(JwtAuth::presented(&HeaderValue::from_static(value)), want, "{value}");
        }
    }
}
