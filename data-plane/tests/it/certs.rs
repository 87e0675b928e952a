//! Certificates made per test: a private CA and the leaves it issues, in the
//! forms the TLS and gRPC tests need (PEM for snapshots, DER and key for
//! in-test servers, a root store for in-test clients).

use std::sync::Arc;

use anyhow::Result;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sluice_proto::v1;

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A certificate authority made for one test.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate issued by a [`Ca`], in the forms the tests need.
pub struct Leaf {
    pub chain_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Ok(Ca { issuer: CertifiedIssuer::self_signed(params, KeyPair::generate()?)? })
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn roots(&self) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        roots.add(self.issuer.der().clone())?;
        Ok(roots)
    }

    pub fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Result<Leaf> {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("leaf"));
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &*self.issuer)?;
        Ok(Leaf { chain_pem: cert.pem(), key_pem: key.serialize_pem(), der: cert.der().clone() })
    }

    pub fn server_leaf(&self, names: &[&str]) -> Result<Leaf> {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth)
    }
}

impl Leaf {
    pub fn certificate(&self, name: &str, snis: &[&str], default: bool) -> v1::Certificate {
        v1::Certificate {
            name: name.into(),
            chain_pem: self.chain_pem.clone(),
            private_key_pem: self.key_pem.clone(),
            snis: snis.iter().map(|s| s.to_string()).collect(),
            default,
            not_after: 0,
        }
    }

    pub fn key(&self) -> Result<PrivateKeyDer<'static>> {
        Ok(PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())?)
    }
}
