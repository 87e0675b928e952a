//! Snapshot certificates -> rustls keys, at snapshot compile time: parses each
//! PEM chain and key once, checks they belong together, and indexes the
//! result by SNI name (exact and `*.` wildcard) for the per-handshake lookup.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::sign::CertifiedKey;
use sluice_proto::v1;

/// A certificate of the snapshot that cannot be used; NACKs the snapshot.
#[derive(Debug, thiserror::Error)]
#[error("certificate `{name}`: {reason}")]
pub struct CertificateError {
    pub name: String,
    pub reason: String,
}

/// One snapshot certificate, parsed and ready for a handshake on either side
/// (served to clients, or presented to an upstream as a client certificate).
#[derive(Debug)]
pub struct CompiledCertificate {
    pub name: String,
    pub key: Arc<CertifiedKey>,
    /// The wire form this was compiled from; an identical certificate in the
    /// next snapshot reuses this compiled one (and so keeps upstream pools
    /// that present it as a client certificate).
    spec: v1::Certificate,
}

impl CompiledCertificate {
    fn compile(spec: &v1::Certificate) -> Result<Self, CertificateError> {
        let key = sluice_proto::tls::certified_key(&spec.chain_pem, &spec.private_key_pem)
            .map_err(|e| CertificateError { name: spec.name.clone(), reason: e.to_string() })?;
        Ok(CompiledCertificate { name: spec.name.clone(), key: Arc::new(key), spec: spec.clone() })
    }
}

/// The certificates of one routing table, indexed for SNI selection.
#[derive(Debug, Default)]
pub struct CertificateSet {
    by_name: HashMap<String, Arc<CompiledCertificate>>,
    /// Lower-case DNS name -> certificate.
    exact: HashMap<String, Arc<CompiledCertificate>>,
    /// `example.com` for a `*.example.com` entry.
    wildcard: HashMap<String, Arc<CompiledCertificate>>,
    default: Option<Arc<CompiledCertificate>>,
}

impl CertificateSet {
    /// Compiles every certificate; one that does not parse fails the whole
    /// set, naming it. Certificates identical to one in `previous` are reused.
    pub fn compile(
        certificates: &[v1::Certificate],
        previous: Option<&CertificateSet>,
    ) -> Result<CertificateSet, CertificateError> {
        let mut set = CertificateSet::default();
        // Sorted by name so that the tie-break below does not depend on the
        // order the snapshot happens to list them in.
        let mut specs: Vec<&v1::Certificate> = certificates.iter().collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        let now = chrono::Utc::now().timestamp();
        for spec in specs {
            let compiled = match previous.and_then(|p| p.by_name.get(&spec.name)) {
                Some(old) if old.spec == *spec => old.clone(),
                _ => Arc::new(CompiledCertificate::compile(spec)?),
            };
            if spec.not_after != 0 && spec.not_after < now {
                tracing::warn!(certificate = %spec.name, not_after = spec.not_after, "certificate has expired");
            }
            for sni in &spec.snis {
                let sni = normalize(sni);
                let (index, key) = match sni.strip_prefix("*.") {
                    Some(parent) => (&mut set.wildcard, parent.to_string()),
                    None => (&mut set.exact, sni),
                };
                insert_preferring_newest(index, key, &compiled);
            }
            if spec.default {
                set.default = Some(compiled.clone());
            }
            set.by_name.insert(spec.name.clone(), compiled);
        }
        Ok(set)
    }

    /// The certificate named `name`, e.g. an upstream's client certificate.
    pub fn get(&self, name: &str) -> Option<&Arc<CompiledCertificate>> {
        self.by_name.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Picks the certificate for a handshake: exact SNI name, then a wildcard
    /// covering its first label, then the default. `None` refuses the handshake.
    pub fn resolve(&self, sni: Option<&str>) -> Option<&Arc<CompiledCertificate>> {
        if let Some(sni) = sni {
            let sni = normalize(sni);
            if let Some(found) = self.exact.get(&sni) {
                return Some(found);
            }
            // A wildcard stands for exactly one label: `*.example.com` covers
            // `a.example.com`, not `example.com` nor `a.b.example.com`.
            if let Some((_, parent)) = sni.split_once('.')
                && let Some(found) = self.wildcard.get(parent)
            {
                return Some(found);
            }
        }
        self.default.as_ref()
    }
}

/// Two certificates claiming one name is normal during a rotation (the new
/// one is uploaded before the old is deleted): serve the one that expires
/// last rather than refusing the snapshot.
fn insert_preferring_newest(
    index: &mut HashMap<String, Arc<CompiledCertificate>>,
    key: String,
    candidate: &Arc<CompiledCertificate>,
) {
    match index.get(&key) {
        Some(current) if current.spec.not_after >= candidate.spec.not_after => {
            tracing::debug!(sni = %key, kept = %current.name, ignored = %candidate.name, "two certificates serve one name");
        }
        _ => {
            index.insert(key, candidate.clone());
        }
    }
}

/// SNI and configured names compare case-insensitively and without the
/// root's trailing dot.
fn normalize(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(name: &str, snis: &[&str], default: bool) -> v1::Certificate {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![format!("{name}.test")]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        v1::Certificate {
            name: name.into(),
            chain_pem: cert.pem(),
            private_key_pem: key.serialize_pem(),
            snis: snis.iter().map(|s| s.to_string()).collect(),
            default,
            not_after: 0,
        }
    }

    fn picked(set: &CertificateSet, sni: Option<&str>) -> Option<String> {
        set.resolve(sni).map(|c| c.name.clone())
    }

    #[test]
    fn sni_selection_table() {
        let certs = vec![
            certificate("api", &["api.example.test"], false),
            certificate("wild", &["*.example.test"], false),
            certificate("fallback", &[], true),
        ];
        let set = CertificateSet::compile(&certs, None).unwrap();
        let cases = [
            (Some("api.example.test"), Some("api")),
            (Some("API.Example.Test."), Some("api")),
            (Some("shop.example.test"), Some("wild")),
            // One label only: neither the parent nor a deeper name matches the wildcard.
            (Some("example.test"), Some("fallback")),
            (Some("a.b.example.test"), Some("fallback")),
            (Some("unknown.test"), Some("fallback")),
            (None, Some("fallback")),
        ];
        for (sni, want) in cases {
            assert_eq!(picked(&set, sni).as_deref(), want, "{sni:?}");
        }
    }

    #[test]
    fn no_match_and_no_default_refuses() {
        let set = CertificateSet::compile(&[certificate("api", &["api.example.test"], false)], None).unwrap();
        assert_eq!(picked(&set, Some("api.example.test")).as_deref(), Some("api"));
        assert_eq!(picked(&set, Some("other.test")), None);
        assert_eq!(picked(&set, None), None);
        assert!(CertificateSet::compile(&[], None).unwrap().resolve(Some("x")).is_none());
    }

    #[test]
    fn newest_certificate_wins_a_shared_name() {
        let mut old = certificate("a-old", &["api.example.test"], false);
        old.not_after = 1_000;
        let mut new = certificate("b-new", &["api.example.test"], false);
        new.not_after = 2_000;
        for order in [vec![old.clone(), new.clone()], vec![new.clone(), old.clone()]] {
            let set = CertificateSet::compile(&order, None).unwrap();
            assert_eq!(picked(&set, Some("api.example.test")).as_deref(), Some("b-new"));
        }
    }

    #[test]
    fn bad_certificates_are_named() {
        let good = certificate("good", &[], false);
        let other = certificate("other", &[], false);
        let cases = [
            ("garbage chain", v1::Certificate { chain_pem: "not pem".into(), ..good.clone() }, "no CERTIFICATE"),
            ("garbage key", v1::Certificate { private_key_pem: "nope".into(), ..good.clone() }, "private key"),
            (
                "mismatched key",
                v1::Certificate { private_key_pem: other.private_key_pem.clone(), ..good.clone() },
                "does not fit",
            ),
        ];
        for (case, spec, want) in cases {
            let err = CertificateSet::compile(&[spec], None).expect_err(case);
            let text = err.to_string();
            assert!(text.starts_with("certificate `good`") && text.contains(want), "{case}: {text}");
        }
    }

    #[test]
    fn identical_certificates_are_reused() {
        let a = certificate("a", &["a.test"], false);
        let first = CertificateSet::compile(std::slice::from_ref(&a), None).unwrap();
        let second = CertificateSet::compile(std::slice::from_ref(&a), Some(&first)).unwrap();
        assert!(Arc::ptr_eq(first.get("a").unwrap(), second.get("a").unwrap()));
        let changed = v1::Certificate { snis: vec!["b.test".into()], ..a };
        let third = CertificateSet::compile(&[changed], Some(&second)).unwrap();
        assert!(!Arc::ptr_eq(second.get("a").unwrap(), third.get("a").unwrap()));
    }
}
