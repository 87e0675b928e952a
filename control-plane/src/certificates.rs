//! Certificate intake: an uploaded PEM pair or PKCS#12 bundle (`/v1/certificates`) is parsed, checked and normalised
//! here into a PEM chain and key before the store encrypts the key, so data planes only ever receive pairs that load.

use std::fmt::Write as _;

use base64::Engine as _;
use p12_keystore::{KeyStore, Pkcs12ImportPolicy};
use rustls::crypto::aws_lc_rs::sign::any_supported_type;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer as _;

/// A certificate chain and its key that are known to belong together. `key_pem` is secret: encrypt it before storing
/// and never return it.
#[derive(Clone, PartialEq, Eq)]
pub struct ParsedCertificate {
    /// Leaf first, re-encoded from the parsed DER so stray text around the PEM blocks is dropped.
    pub chain_pem: String,
    pub key_pem: String,
    /// DNS names from the leaf's subjectAltName, lower-cased; the subject CN only when there are none.
    pub snis: Vec<String>,
    pub subject: String,
    pub issuer: String,
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
}

impl std::fmt::Debug for ParsedCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParsedCertificate")
            .field("snis", &self.snis)
            .field("subject", &self.subject)
            .field("issuer", &self.issuer)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CertificateError {
    #[error("the {0} is not PEM: expected a block starting with \"-----BEGIN ...-----\"")]
    NotPem(&'static str),
    #[error("the {what} has malformed PEM: {reason}")]
    BadPem { what: &'static str, reason: String },
    #[error("no certificate found: the chain must hold at least one \"CERTIFICATE\" PEM block")]
    NoCertificate,
    #[error("certificate #{index} in the chain is not a valid X.509 certificate: {reason}")]
    BadCertificate { index: usize, reason: String },
    #[error("no private key found: expected a \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\" PEM block")]
    NoKey,
    #[error("the private key is encrypted; upload it unencrypted (it is encrypted at rest by Sluice)")]
    EncryptedKey,
    #[error("more than one private key given; upload exactly one")]
    MultipleKeys,
    #[error("unsupported or malformed private key: {0}; supported are RSA, ECDSA (P-256, P-384, P-521) and Ed25519")]
    UnsupportedKeyType(String),
    #[error("the private key does not match the public key of the first (leaf) certificate in the chain")]
    KeyMismatch,
    #[error("wrong PKCS#12 password")]
    WrongPassword,
    #[error("not a readable PKCS#12 file: {0}")]
    BadPkcs12(String),
}

pub fn from_pem(chain_pem: &str, key_pem: &str) -> Result<ParsedCertificate, CertificateError> {
    if !chain_pem.contains("-----BEGIN ") {
        return Err(CertificateError::NotPem("certificate chain"));
    }
    if !key_pem.contains("-----BEGIN ") {
        return Err(CertificateError::NotPem("private key"));
    }
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertificateError::BadPem { what: "certificate chain", reason: e.to_string() })?;

    let mut keys = PrivateKeyDer::pem_slice_iter(key_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertificateError::BadPem { what: "private key", reason: e.to_string() })?;
    let key = match keys.len() {
        1 => keys.remove(0),
        0 if is_encrypted_pem(key_pem) => return Err(CertificateError::EncryptedKey),
        0 => return Err(CertificateError::NoKey),
        _ => return Err(CertificateError::MultipleKeys),
    };
    check_and_describe(chain, key)
}

pub fn from_pkcs12(der: &[u8], password: &str) -> Result<ParsedCertificate, CertificateError> {
    // Strict import links each key to its certificate by localKeyId and builds the chain leaf first.
    let store = KeyStore::from_pkcs12(der, password, Pkcs12ImportPolicy::Strict).map_err(|e| match e {
        // A MAC failure is how a wrong password shows; without a MAC it surfaces as bad padding on decryption.
        p12_keystore::error::Error::MacError(_) | p12_keystore::error::Error::UnpadError => {
            CertificateError::WrongPassword
        }
        other => CertificateError::BadPkcs12(other.to_string()),
    })?;
    let Some((_, chain)) = store.private_key_chain() else {
        let has_certs = store.entries().any(|(_, e)| matches!(e, p12_keystore::KeyStoreEntry::Certificate(_)));
        return Err(if has_certs { CertificateError::NoKey } else { CertificateError::NoCertificate });
    };
    let certs = chain.certs().iter().map(|c| CertificateDer::from(c.as_der().to_vec())).collect();
    let key = PrivateKeyDer::Pkcs8(chain.key().as_der().to_vec().into());
    check_and_describe(certs, key)
}

/// The PEM parser skips blocks it does not know, so encrypted keys would otherwise read as "no key".
fn is_encrypted_pem(pem: &str) -> bool {
    pem.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") || pem.contains("Proc-Type: 4,ENCRYPTED")
}

fn check_and_describe(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<ParsedCertificate, CertificateError> {
    let Some(leaf_der) = chain.first() else {
        return Err(CertificateError::NoCertificate);
    };
    for (index, der) in chain.iter().enumerate().skip(1) {
        X509Certificate::from_der(der)
            .map_err(|e| CertificateError::BadCertificate { index: index + 1, reason: e.to_string() })?;
    }
    let (_, leaf) = X509Certificate::from_der(leaf_der)
        .map_err(|e| CertificateError::BadCertificate { index: 1, reason: e.to_string() })?;

    let snis = sni_names(&leaf)?;
    let subject = leaf.subject().to_string();
    let issuer = leaf.issuer().to_string();
    let not_before = leaf.validity().not_before.timestamp();
    let not_after = leaf.validity().not_after.timestamp();

    let key_pem = encode_pem(key_label(&key), key.secret_der());
    // The same provider the data plane serves with, so "loads here" means "loads there".
    let signing_key = any_supported_type(&key).map_err(|e| CertificateError::UnsupportedKeyType(e.to_string()))?;
    let chain_pem = chain.iter().map(|der| encode_pem("CERTIFICATE", der)).collect::<String>();
    match CertifiedKey::new(chain, signing_key).keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(CertificateError::KeyMismatch);
        }
        // Unknown: the key cannot state its public half, so nothing proves the pair belongs together.
        Err(e) => return Err(CertificateError::UnsupportedKeyType(e.to_string())),
    }

    Ok(ParsedCertificate { chain_pem, key_pem, snis, subject, issuer, not_before, not_after })
}

fn sni_names(leaf: &X509Certificate<'_>) -> Result<Vec<String>, CertificateError> {
    let san = leaf
        .subject_alternative_name()
        .map_err(|e| CertificateError::BadCertificate { index: 1, reason: format!("subjectAltName: {e}") })?;
    let mut names: Vec<String> = san
        .iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(dns.to_ascii_lowercase()),
            _ => None,
        })
        .collect();
    if names.is_empty() {
        names =
            leaf.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_ascii_lowercase).collect();
    }
    names.dedup();
    Ok(names)
}

fn key_label(key: &PrivateKeyDer<'_>) -> &'static str {
    match key {
        PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
        PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
        _ => "PRIVATE KEY",
    }
}

fn encode_pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(body.len() + body.len() / 64 + 2 * label.len() + 40);
    let _ = writeln!(out, "-----BEGIN {label}-----");
    for line in body.as_bytes().chunks(64) {
        // base64 output is ASCII, so any 64-byte chunk is valid UTF-8.
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    let _ = writeln!(out, "-----END {label}-----");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

    struct Pair {
        chain_pem: String,
        key_pem: String,
        cert_der: Vec<Vec<u8>>,
        key_der: Vec<u8>,
    }

    fn leaf_signed_by_ca(sans: &[&str], cn: &str, alg: &'static rcgen::SignatureAlgorithm) -> Pair {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "Sluice Test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);

        let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate_for(alg).unwrap();
        let leaf = params.signed_by(&key, &issuer).unwrap();
        Pair {
            chain_pem: format!("{}{}", leaf.pem(), ca_cert.pem()),
            key_pem: key.serialize_pem(),
            cert_der: vec![leaf.der().to_vec(), ca_cert.der().to_vec()],
            key_der: key.serialize_der(),
        }
    }

    fn p12(pair: &Pair, password: &str) -> Vec<u8> {
        let key = p12_keystore::PrivateKey::from_der(&pair.key_der).unwrap();
        let certs = pair.cert_der.iter().map(|d| p12_keystore::Certificate::from_der(d).unwrap());
        let chain = p12_keystore::PrivateKeyChain::new(b"leaf".as_slice(), key, certs);
        let mut store = KeyStore::new();
        store.add_entry("leaf", p12_keystore::KeyStoreEntry::PrivateKeyChain(chain));
        store.writer(password).write().unwrap()
    }

    #[test]
    fn pem_pair_is_described() {
        let pair = leaf_signed_by_ca(&["API.example.com", "www.example.com"], "api", &rcgen::PKCS_ECDSA_P256_SHA256);
        let parsed = from_pem(&format!("leading junk\n{}", pair.chain_pem), &pair.key_pem).unwrap();
        assert_eq!(parsed.snis, ["api.example.com", "www.example.com"]);
        assert_eq!(parsed.subject, "CN=api");
        assert_eq!(parsed.issuer, "CN=Sluice Test CA");
        assert!(parsed.not_before < parsed.not_after);
        assert_eq!(parsed.chain_pem, pair.chain_pem.replace("\r\n", "\n"));
        assert!(parsed.key_pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
        // The normalised output must itself be accepted, since that is what data planes will load.
        assert_eq!(from_pem(&parsed.chain_pem, &parsed.key_pem).unwrap(), parsed);
        assert!(!format!("{parsed:?}").contains("PRIVATE KEY"), "Debug must not print the key");
    }

    #[test]
    fn key_types_rsa_ed25519_p384() {
        for alg in [&rcgen::PKCS_ED25519, &rcgen::PKCS_ECDSA_P384_SHA384, &rcgen::PKCS_RSA_SHA256] {
            if alg == &rcgen::PKCS_RSA_SHA256 && KeyPair::generate_for(alg).is_err() {
                eprintln!("skipping RSA: this rcgen backend cannot generate RSA keys");
                continue;
            }
            let pair = leaf_signed_by_ca(&["a.example"], "a", alg);
            let parsed = from_pem(&pair.chain_pem, &pair.key_pem).unwrap_or_else(|e| panic!("{alg:?}: {e}"));
            assert_eq!(parsed.snis, ["a.example"]);
        }
    }

    #[test]
    fn cn_is_the_sni_when_there_are_no_dns_sans() {
        let pair = leaf_signed_by_ca(&[], "Legacy.Example.org", &rcgen::PKCS_ECDSA_P256_SHA256);
        assert_eq!(from_pem(&pair.chain_pem, &pair.key_pem).unwrap().snis, ["legacy.example.org"]);
    }

    #[test]
    fn pem_errors_are_specific() {
        let a = leaf_signed_by_ca(&["a.example"], "a", &rcgen::PKCS_ECDSA_P256_SHA256);
        let b = leaf_signed_by_ca(&["b.example"], "b", &rcgen::PKCS_ECDSA_P256_SHA256);
        let encrypted = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n";
        // PKCS#8 for DSA (OID 1.2.840.10040.4.1): a well-formed key of a type rustls cannot sign with.
        let dsa_pkcs8 = [
            0x30, 0x14, 0x02, 0x01, 0x00, 0x30, 0x09, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01, 0x04, 0x04,
            0x02, 0x02, 0x01, 0x01,
        ];
        let dsa_pem = encode_pem("PRIVATE KEY", &dsa_pkcs8);
        let cases: Vec<(&str, String, String, CertificateError)> = vec![
            ("chain not pem", "hello".into(), a.key_pem.clone(), CertificateError::NotPem("certificate chain")),
            ("key not pem", a.chain_pem.clone(), "hello".into(), CertificateError::NotPem("private key")),
            ("key only in chain", a.key_pem.clone(), a.key_pem.clone(), CertificateError::NoCertificate),
            ("cert as key", a.chain_pem.clone(), a.chain_pem.clone(), CertificateError::NoKey),
            ("encrypted key", a.chain_pem.clone(), encrypted.into(), CertificateError::EncryptedKey),
            ("two keys", a.chain_pem.clone(), format!("{}{}", a.key_pem, b.key_pem), CertificateError::MultipleKeys),
            ("other key", a.chain_pem.clone(), b.key_pem.clone(), CertificateError::KeyMismatch),
        ];
        for (name, chain, key, want) in cases {
            let err = from_pem(&chain, &key).unwrap_err();
            eprintln!("{name}: {err}");
            assert_eq!(err, want, "{name}");
        }
        let err = from_pem(&a.chain_pem, &dsa_pem).unwrap_err();
        assert!(matches!(err, CertificateError::UnsupportedKeyType(_)), "{err:?}");
        assert!(err.to_string().contains("Ed25519"), "{err}");

        let truncated = a.chain_pem.replace("-----END CERTIFICATE-----", "");
        assert!(matches!(from_pem(&truncated, &a.key_pem), Err(CertificateError::BadPem { .. })));
        let garbage_cert = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        assert!(matches!(from_pem(garbage_cert, &a.key_pem), Err(CertificateError::BadCertificate { index: 1, .. })));
    }

    #[test]
    fn pkcs12_round_trip() {
        let pair = leaf_signed_by_ca(&["p12.example"], "p12", &rcgen::PKCS_ECDSA_P256_SHA256);
        let der = p12(&pair, "s3cret");
        let parsed = from_pkcs12(&der, "s3cret").unwrap();
        assert_eq!(parsed.snis, ["p12.example"]);
        assert_eq!(parsed.chain_pem, pair.chain_pem.replace("\r\n", "\n"));
        assert!(parsed.key_pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
        assert_eq!(from_pem(&parsed.chain_pem, &parsed.key_pem).unwrap(), parsed);
    }

    #[test]
    fn pkcs12_errors() {
        let pair = leaf_signed_by_ca(&["p12.example"], "p12", &rcgen::PKCS_ECDSA_P256_SHA256);
        let der = p12(&pair, "s3cret");
        assert_eq!(from_pkcs12(&der, "wrong").unwrap_err(), CertificateError::WrongPassword);
        assert!(matches!(from_pkcs12(b"not a p12 file", "x"), Err(CertificateError::BadPkcs12(_))));

        let mut certs_only = KeyStore::new();
        let cert = p12_keystore::Certificate::from_der(&pair.cert_der[0]).unwrap();
        certs_only.add_entry("ca", p12_keystore::KeyStoreEntry::Certificate(cert));
        let der = certs_only.writer("pw").write().unwrap();
        assert_eq!(from_pkcs12(&der, "pw").unwrap_err(), CertificateError::NoKey);

        let other = leaf_signed_by_ca(&["x.example"], "x", &rcgen::PKCS_ECDSA_P256_SHA256);
        let mismatched = Pair { key_der: other.key_der.clone(), ..pair };
        assert_eq!(from_pkcs12(&p12(&mismatched, "pw"), "pw").unwrap_err(), CertificateError::KeyMismatch);
    }
}
