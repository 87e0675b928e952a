//! Turns what a user sent into what is stored: passwords become Argon2id
//! hashes, API keys keyed digests, JWT secrets and private keys sealed values;
//! specs and certificates are parsed and checked here, at upload, so a bad one
//! is rejected with the parser's reason before anything is written.
//!
//! Each function takes the currently stored resource of the same name so that
//! re-sending an unchanged secret (or an exported file) keeps the stored form
//! byte for byte: re-applying the same config is then a no-op, not a new
//! snapshot with fresh salts.

use base64::Engine;
use sluice_proto::Violation;

use crate::certificates::{self, ParsedCertificate};
use crate::credentials::{api_key_digest, hash_password, verify_password};
use crate::model::{Certificate, Config, Consumer, Spec};
use crate::secrets::SecretBox;
use crate::specs::{SpecCache, check_spec_size};

pub use crate::diff::{ConfigDiff, KindDiff, diff_config};

/// Prepares every consumer, spec and certificate of a whole document. Paths
/// are prefixed with the collection and name (`/consumers/alice/...`).
pub fn prepare_config(
    config: Config,
    previous: &Config,
    secrets: &SecretBox,
    api_key_hmac_key: &[u8],
    specs: &SpecCache,
    max_spec_bytes: usize,
) -> Result<Config, Vec<Violation>> {
    let mut violations = Vec::new();
    let mut prefixed = |collection: &str, name: &str, found: Vec<Violation>| {
        violations.extend(
            found
                .into_iter()
                .map(|v| Violation { path: format!("/{collection}/{name}{}", v.path), message: v.message }),
        );
    };
    let mut prepared = Config { upstreams: config.upstreams, apis: config.apis, ..Config::default() };
    for consumer in config.consumers {
        let old = previous.consumers.iter().find(|c| c.username == consumer.username);
        let name = consumer.username.clone();
        match prepare_consumer(consumer, old, secrets, api_key_hmac_key) {
            Ok(c) => prepared.consumers.push(c),
            Err(found) => prefixed("consumers", &name, found),
        }
    }
    for spec in config.specs {
        let name = spec.name.clone();
        match prepare_spec(spec, specs, max_spec_bytes) {
            Ok(s) => prepared.specs.push(s),
            Err(found) => prefixed("specs", &name, found),
        }
    }
    for cert in config.certificates {
        let old = previous.certificates.iter().find(|c| c.name == cert.name);
        let name = cert.name.clone();
        match prepare_certificate(cert, old, secrets) {
            Ok(c) => prepared.certificates.push(c),
            Err(found) => prefixed("certificates", &name, found),
        }
    }
    if violations.is_empty() { Ok(prepared) } else { Err(violations) }
}

fn violation(path: &str, message: impl Into<String>) -> Violation {
    Violation { path: path.into(), message: message.into() }
}

/// Hashes the password, digests API keys and seals JWT secrets.
pub fn prepare_consumer(
    mut consumer: Consumer,
    previous: Option<&Consumer>,
    secrets: &SecretBox,
    api_key_hmac_key: &[u8],
) -> Result<Consumer, Vec<Violation>> {
    let mut violations = Vec::new();
    if let Some(basic) = &mut consumer.basic_auth {
        match (basic.password.take(), &basic.password_hash) {
            (Some(password), _) if password.is_empty() => {
                violations.push(violation("/basic_auth/password", "must not be empty"));
            }
            (Some(password), _) => {
                let kept = previous
                    .and_then(|p| p.basic_auth.as_ref())
                    .and_then(|b| b.password_hash.clone())
                    .filter(|hash| verify_password(&password, hash));
                match kept.map_or_else(|| hash_password(&password).map_err(|e| e.to_string()), Ok) {
                    Ok(hash) => basic.password_hash = Some(hash),
                    Err(e) => violations.push(violation("/basic_auth/password", e)),
                }
            }
            (None, Some(hash)) if !hash.starts_with("$argon2") => {
                violations.push(violation("/basic_auth/password_hash", "must be an Argon2 PHC string as exported"));
            }
            (None, Some(_)) => {}
            (None, None) => violations.push(violation("/basic_auth", "needs `password`")),
        }
    }
    for (i, credential) in consumer.api_keys.iter_mut().enumerate() {
        match credential.key.take() {
            Some(key) if key.len() < 8 => {
                violations.push(violation(&format!("/api_keys/{i}/key"), "must be at least 8 characters"));
            }
            Some(key) => credential.key_digest = Some(api_key_digest(api_key_hmac_key, &key)),
            None => match &credential.key_digest {
                Some(d) if d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()) => {}
                Some(_) => violations
                    .push(violation(&format!("/api_keys/{i}/key_digest"), "must be 64 hex digits as exported")),
                None => violations.push(violation(&format!("/api_keys/{i}"), "needs `key`")),
            },
        }
    }
    for (i, credential) in consumer.jwt.iter_mut().enumerate() {
        let at = format!("/jwt/{i}");
        match credential.secret.take() {
            Some(secret) if secret.is_empty() => {
                violations.push(violation(&format!("{at}/secret"), "must not be empty"))
            }
            Some(secret) => {
                let kept = previous
                    .and_then(|p| p.jwt.iter().find(|j| j.key == credential.key))
                    .and_then(|j| j.secret_sealed.clone())
                    .filter(|sealed| secrets.open(sealed).is_ok_and(|s| s == secret.as_bytes()));
                credential.secret_sealed = Some(kept.unwrap_or_else(|| secrets.seal(secret.as_bytes())));
            }
            None => {
                if let Some(sealed) = &credential.secret_sealed
                    && secrets.open(sealed).is_err()
                {
                    violations.push(violation(
                        &format!("{at}/secret_sealed"),
                        "cannot be decrypted with this control plane's secret key; send `secret` instead",
                    ));
                }
            }
        }
    }
    if violations.is_empty() { Ok(consumer) } else { Err(violations) }
}

/// Parses the document (into `specs`, where the write's snapshot build finds it); fills in its version and
/// title. A text over `max_bytes` is refused before it is parsed.
pub fn prepare_spec(mut spec: Spec, specs: &SpecCache, max_bytes: usize) -> Result<Spec, Vec<Violation>> {
    match check_spec_size(&spec.content, max_bytes).and_then(|()| specs.parse(&spec.content)) {
        Ok(parsed) => {
            spec.openapi_version = Some(parsed.openapi_version.clone());
            spec.title = Some(parsed.title.clone());
            Ok(spec)
        }
        Err(e) => Err(vec![violation("/content", e.to_string())]),
    }
}

/// Reads PEM or PKCS#12, checks the key matches the certificate, seals the key.
pub fn prepare_certificate(
    mut cert: Certificate,
    previous: Option<&Certificate>,
    secrets: &SecretBox,
) -> Result<Certificate, Vec<Violation>> {
    let parsed = parse_certificate(&mut cert, secrets).map_err(|v| vec![v])?;
    let kept = previous
        .and_then(|p| p.key_sealed.clone())
        .filter(|sealed| secrets.open(sealed).is_ok_and(|k| k == parsed.key_pem.as_bytes()));
    cert.key_sealed = Some(kept.unwrap_or_else(|| secrets.seal(parsed.key_pem.as_bytes())));
    cert.chain = Some(parsed.chain_pem);
    if cert.snis.is_empty() {
        cert.snis = parsed.snis;
    }
    cert.subject = Some(parsed.subject);
    cert.not_after = chrono::DateTime::from_timestamp(parsed.not_after, 0).map(|t| t.to_rfc3339());
    Ok(cert)
}

fn parse_certificate(cert: &mut Certificate, secrets: &SecretBox) -> Result<ParsedCertificate, Violation> {
    let password = cert.password.take();
    let key = cert.key.take();
    if let Some(pkcs12) = cert.pkcs12.take() {
        let der = base64::engine::general_purpose::STANDARD
            .decode(pkcs12.trim())
            .map_err(|e| violation("/pkcs12", format!("is not base64: {e}")))?;
        return certificates::from_pkcs12(&der, password.as_deref().unwrap_or_default())
            .map_err(|e| violation("/pkcs12", e.to_string()));
    }
    let Some(chain) = cert.chain.as_deref() else {
        return Err(violation("/chain", "is required (or send `pkcs12` and `password`)"));
    };
    let key = match (key, &cert.key_sealed) {
        (Some(key), _) => key,
        (None, Some(sealed)) => secrets
            .open(sealed)
            .ok()
            .and_then(|k| String::from_utf8(k).ok())
            .ok_or_else(|| violation("/key_sealed", "cannot be decrypted with this control plane's secret key"))?,
        (None, None) => return Err(violation("/key", "is required")),
    };
    certificates::from_pem(chain, &key).map_err(|e| violation("/chain", e.to_string()))
}
