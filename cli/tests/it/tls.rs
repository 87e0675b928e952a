//! TLS termination end to end: a certificate uploaded through the admin API
//! is served by a real `sluice-dp` to a real TLS client (reqwest on rustls),
//! h2 is chosen by ALPN, and a certificate replaced through the admin API is
//! what the next handshake presents, without restarting the data plane.

use std::net::SocketAddr;

use anyhow::{Context, Result, ensure};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use reqwest::Method;
use serde_json::json;

use crate::support::{Cluster, eventually};

const HOST: &str = "api.e2e.test";

/// A leaf for `HOST` signed by `ca`; returns (chain PEM, key PEM, leaf DER).
fn leaf(ca: &Issuer<'_, KeyPair>, serial: u64) -> Result<(String, String, Vec<u8>)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![HOST.to_string()])?;
    // Distinct serials make the two leaves tell apart at a glance in a failure.
    params.serial_number = Some(serial.into());
    let cert = params.signed_by(&key, ca)?;
    Ok((cert.pem(), key.serialize_pem(), cert.der().to_vec()))
}

/// A fresh client, so that every request is a new TLS handshake.
fn client(ca_pem: &str, https: SocketAddr) -> Result<reqwest::Client> {
    let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes())?;
    Ok(reqwest::Client::builder()
        .tls_certs_only([ca])
        .tls_info(true)
        .resolve(HOST, https)
        .pool_max_idle_per_host(0)
        .build()?)
}

/// Status, HTTP version and the peer's leaf certificate (DER) of one request.
async fn handshake(ca_pem: &str, https: SocketAddr) -> Result<(u16, reqwest::Version, Vec<u8>)> {
    let url = format!("https://{HOST}:{}/tls/probe", https.port());
    let response = client(ca_pem, https)?.get(url).send().await?;
    let peer = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .context("no peer certificate")?
        .to_vec();
    Ok((response.status().as_u16(), response.version(), peer))
}

#[tokio::test]
async fn an_uploaded_certificate_is_served_with_h2_and_replaced_on_the_next_handshake() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let Cluster { cp: _cp, admin, upstream: _upstream, backend, dp } = Cluster::start(dir.path(), "dp-tls").await?;
    let https = dp.addr("https_addr")?;

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca_pem = ca_cert.pem();
    let ca = Issuer::new(ca_params, ca_key);

    // The default certificate: PUT creates it the first time and replaces it the second.
    let upload = |chain: String, key: String| {
        let certificate = json!({ "name": "e2e", "chain": chain, "key": key, "default": true });
        admin.ok(Method::PUT, "/v1/certificates/e2e", Some(certificate))
    };
    let (chain, key, first) = leaf(&ca, 1)?;
    upload(chain, key).await?;
    admin.create_upstream("pool", backend).await?;
    admin.create_api("tls", "/tls", "pool").await?;

    eventually("the API over TLS", || async { matches!(handshake(&ca_pem, https).await, Ok((200, _, _))) }).await?;
    let (status, version, peer) = handshake(&ca_pem, https).await?;
    ensure!(status == 200, "status {status}");
    ensure!(version == reqwest::Version::HTTP_2, "ALPN chose {version:?}, not h2");
    ensure!(peer == first, "the peer certificate is not the uploaded leaf");

    let (chain, key, second) = leaf(&ca, 2)?;
    ensure!(second != first);
    upload(chain, key).await?;
    eventually("the replaced certificate on a new handshake", || async {
        matches!(handshake(&ca_pem, https).await, Ok((200, _, peer)) if peer == second)
    })
    .await?;
    Ok(())
}
