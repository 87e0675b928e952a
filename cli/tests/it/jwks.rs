//! JWT verification against an issuer's JWKS document, end to end: the
//! document is written through the admin API, checked by the control plane,
//! pushed to a data plane and enforced there; rotating keys is another write.
//! Or the API names the issuer's JWKS URL (`jwks_url`) and the data plane
//! fetches it from an issuer served by the test, follows its key rotation and
//! survives its outage.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail, ensure};
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header};
use reqwest::Method;
use reqwest::header::{CONTENT_TYPE, WWW_AUTHENTICATE};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::{Admin, Process, all_applied, control_plane, data_plane_with, eventually, upstream};

const ISSUER: &str = "https://idp.example";
const AUDIENCE: &str = "shop";

/// One of the issuer's signing keys: the private half signs test tokens, the
/// public half is what the issuer publishes in its JWKS.
struct IssuerKey {
    kid: &'static str,
    alg: Algorithm,
    signing: EncodingKey,
    public: Value,
}

impl IssuerKey {
    fn generate(kid: &'static str, alg: Algorithm) -> Result<Self> {
        let scheme = match alg {
            Algorithm::ES256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            Algorithm::EdDSA => &rcgen::PKCS_ED25519,
            Algorithm::RS256 => &rcgen::PKCS_RSA_SHA256,
            other => bail!("no test key for {other:?}"),
        };
        let pair = rcgen::KeyPair::generate_for(scheme)?;
        let (pem, raw) = (pair.serialize_pem(), pair.public_key_raw());
        let (signing, public) = match alg {
            Algorithm::ES256 => (EncodingKey::from_ec_pem(pem.as_bytes())?, DecodingKey::from_ec_der(raw)),
            Algorithm::EdDSA => (EncodingKey::from_ed_pem(pem.as_bytes())?, DecodingKey::from_ed_der(raw)),
            _ => (EncodingKey::from_rsa_pem(pem.as_bytes())?, DecodingKey::from_rsa_der(raw)),
        };
        // Ed25519 keys go out without `alg`, as many issuers publish them: the
        // key type alone must decide the algorithm.
        let stated = (alg != Algorithm::EdDSA).then_some(alg);
        let mut jwk = Jwk::from_decoding_key(&public, stated)?;
        jwk.common.key_id = Some(kid.into());
        Ok(Self { kid, alg, signing, public: serde_json::to_value(jwk)? })
    }

    fn sign(&self, claims: &Value) -> Result<String> {
        self.sign_as(self.kid, claims)
    }

    /// Signs with this key but names another `kid` in the header.
    fn sign_as(&self, kid: &str, claims: &Value) -> Result<String> {
        let mut header = Header::new(self.alg);
        header.kid = Some(kid.into());
        Ok(jsonwebtoken::encode(&header, claims, &self.signing)?)
    }
}

fn jwks(keys: &[&IssuerKey]) -> String {
    json!({ "keys": keys.iter().map(|k| k.public.clone()).collect::<Vec<_>>() }).to_string()
}

/// Claims the API accepts for `sub`, valid for five minutes.
fn claims(sub: &str) -> Value {
    json!({ "sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": jsonwebtoken::get_current_timestamp() + 300 })
}

fn api(jwks: &str) -> Value {
    api_with(json!({ "jwks": jwks, "issuer": ISSUER, "audiences": [AUDIENCE] }))
}

fn api_with(jwt: Value) -> Value {
    json!({ "name": "shop", "path_prefix": "/shop", "upstream": "backend", "policies": [{ "jwt": jwt }] })
}

/// A control plane, one data plane and an echo upstream behind the `shop`
/// API; the fields keep the processes (killed on drop) and the database alive.
struct Gateway {
    admin: Admin,
    url: String,
    metrics_url: String,
    client: reqwest::Client,
    _processes: [Process; 3],
    _dir: TempDir,
}

impl Gateway {
    async fn start(jwks: &str) -> Result<Self> {
        Self::start_with(api(jwks), &[]).await
    }

    async fn start_with(api: Value, data_plane_flags: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let cp = control_plane(dir.path()).await?;
        let admin = Admin::new(cp.addr("admin_addr")?);
        let (backend, backend_addr) = upstream("backend", "127.0.0.1:0").await?;
        let dp = data_plane_with(cp.addr("grpc_addr")?, "dp-jwks", data_plane_flags).await?;
        let url = format!("http://{}/shop/orders", dp.addr("http_addr")?);
        let metrics_url = format!("http://{}/metrics", dp.addr("ops_addr")?);
        admin.create_upstream("backend", backend_addr).await?;
        admin.ok(Method::POST, "/v1/apis", Some(api)).await?;
        let gateway =
            Self { admin, url, metrics_url, client: reqwest::Client::new(), _processes: [cp, backend, dp], _dir: dir };
        gateway.applied().await?;
        Ok(gateway)
    }

    /// Waits until the data plane runs the newest snapshot, so what follows
    /// tests that version and not the one before.
    async fn applied(&self) -> Result<u64> {
        let version = self.admin.latest_version().await?;
        eventually("the data plane on the newest version", || all_applied(&self.admin, version, 1)).await?;
        Ok(version)
    }

    /// Asserts the token gets through and returns the headers the upstream saw.
    /// The client also claims to be `mallory`: only the token may name the consumer.
    async fn forwarded(&self, token: &str, why: &str) -> Result<Value> {
        let response =
            self.client.get(&self.url).bearer_auth(token).header("x-consumer-username", "mallory").send().await?;
        let status = response.status();
        let body: Value = response.json().await.with_context(|| format!("{why}: no JSON body"))?;
        ensure!(status == 200, "{why}: {status} {body}");
        Ok(body["headers"].clone())
    }

    /// Asserts the data plane itself refused the token, for `reason` (so a
    /// case cannot pass by failing some other check): a 401 problem with a
    /// Bearer challenge. The echo upstream answers every request it gets with
    /// its `server` name, so a body without one means it saw nothing.
    async fn refused(&self, token: &str, why: &str, reason: &str) -> Result<()> {
        let response = self.client.get(&self.url).bearer_auth(token).send().await?;
        let status = response.status();
        let header = |name| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let (challenge, content_type) = (header(WWW_AUTHENTICATE), header(CONTENT_TYPE));
        let body: Value = response.json().await.with_context(|| format!("{why}: no JSON body"))?;
        ensure!(status == 401, "{why}: {status} {body}");
        ensure!(content_type == "application/problem+json", "{why}: content type {content_type:?}");
        ensure!(challenge.starts_with("Bearer"), "{why}: challenge {challenge:?}");
        ensure!(body.get("server").is_none(), "{why}: the upstream answered: {body}");
        ensure!(body["detail"].as_str().is_some_and(|d| d.contains(reason)), "{why}: not for {reason:?}: {body}");
        Ok(())
    }
}

/// Asserts the upstream got `sub` as the consumer and no credentials.
fn ensure_consumer(headers: &Value, sub: &str) -> Result<()> {
    ensure!(headers["x-consumer-username"] == sub, "consumer for {sub}: {headers}");
    ensure!(headers.get("authorization").is_none(), "the token reached the upstream: {headers}");
    Ok(())
}

#[tokio::test]
async fn tokens_signed_by_a_jwks_key_pass_with_their_subject_as_consumer() -> Result<()> {
    let k1 = IssuerKey::generate("k1", Algorithm::ES256)?;
    let k2 = IssuerKey::generate("k2", Algorithm::EdDSA)?;
    let gateway = Gateway::start(&jwks(&[&k1, &k2])).await?;

    ensure_consumer(&gateway.forwarded(&k1.sign(&claims("carol"))?, "k1 token").await?, "carol")?;
    ensure_consumer(&gateway.forwarded(&k2.sign(&claims("dave"))?, "k2 token").await?, "dave")?;

    // Same kid, another key: what a forger without the issuer's key can make.
    let impostor = IssuerKey::generate("k1", Algorithm::ES256)?;
    gateway
        .refused(&impostor.sign(&claims("carol"))?, "signed by a key not in the set", "signature is invalid")
        .await?;
    gateway.refused(&k1.sign_as("k9", &claims("carol"))?, "a kid not in the set", "no known key").await?;
    let mut wrong_issuer = claims("carol");
    wrong_issuer["iss"] = json!("https://evil.example");
    gateway.refused(&k1.sign(&wrong_issuer)?, "wrong issuer", "issuer is not accepted").await?;
    let mut wrong_audience = claims("carol");
    wrong_audience["aud"] = json!("admin");
    gateway.refused(&k2.sign(&wrong_audience)?, "wrong audience", "audience is not accepted").await?;
    // Well past any clock-skew leeway (none is configured).
    let mut expired = claims("carol");
    expired["exp"] = json!(jsonwebtoken::get_current_timestamp() - 600);
    gateway.refused(&k1.sign(&expired)?, "expired", "has expired").await?;
    Ok(())
}

#[tokio::test]
async fn a_rotated_jwks_drops_the_old_key_without_a_restart() -> Result<()> {
    let k1 = IssuerKey::generate("k1", Algorithm::ES256)?;
    let k2 = IssuerKey::generate("k2", Algorithm::EdDSA)?;
    let k3 = IssuerKey::generate("k3", Algorithm::RS256)?;
    let gateway = Gateway::start(&jwks(&[&k1, &k2])).await?;
    let before = gateway.admin.latest_version().await?;
    gateway.forwarded(&k1.sign(&claims("carol"))?, "k1 before the rotation").await?;

    // The issuer retires k1 and publishes k3: the operator writes the new document.
    gateway.admin.ok(Method::PUT, "/v1/apis/shop", Some(api(&jwks(&[&k2, &k3])))).await?;
    let after = gateway.applied().await?;
    ensure!(after > before, "the rotation made no new version ({before} -> {after})");

    gateway.refused(&k1.sign(&claims("carol"))?, "k1 after the rotation", "no known key").await?;
    ensure_consumer(&gateway.forwarded(&k3.sign(&claims("erin"))?, "k3 token").await?, "erin")?;
    ensure_consumer(&gateway.forwarded(&k2.sign(&claims("dave"))?, "k2 kept").await?, "dave")?;
    Ok(())
}

#[tokio::test]
async fn a_malformed_jwks_is_refused_and_the_previous_keys_keep_serving() -> Result<()> {
    let k1 = IssuerKey::generate("k1", Algorithm::ES256)?;
    let gateway = Gateway::start(&jwks(&[&k1])).await?;
    let before = gateway.admin.latest_version().await?;

    let malformed = [
        ("a shared secret", r#"{"keys": [{"kty": "oct", "kid": "s", "k": "c2VjcmV0"}]}"#),
        ("not JSON", r#"{"keys": ["#),
        ("no keys", r#"{"keys": []}"#),
    ];
    for (what, document) in malformed {
        let patch = json!({ "policies": [{ "jwt": { "jwks": document, "issuer": ISSUER, "audiences": [AUDIENCE] } }] });
        let (status, problem) = gateway.admin.send(Method::PATCH, "/v1/apis/shop", Some(patch)).await?;
        ensure!(status == 422, "{what}: {status} {problem}");
        let pointers: Vec<&str> =
            problem["errors"].as_array().into_iter().flatten().filter_map(|e| e["pointer"].as_str()).collect();
        ensure!(pointers == ["/apis/shop/policies/0/jwt/jwks"], "{what}: {problem}");
    }

    // Nothing was committed, so the data plane stays on the old keys.
    let after = gateway.admin.latest_version().await?;
    ensure!(after == before, "a refused change made version {after} (was {before})");
    let stored = gateway.admin.ok(Method::GET, "/v1/apis/shop", None).await?;
    ensure!(stored["policies"][0]["jwt"]["jwks"] == jwks(&[&k1]), "the stored document changed: {stored}");
    ensure_consumer(&gateway.forwarded(&k1.sign(&claims("carol"))?, "k1 after the refusals").await?, "carol")?;
    Ok(())
}

/// An identity provider's JWKS endpoint: serves whatever document the test
/// publishes (or 500 while it has none), with a long `max-age`, and counts
/// the fetches.
struct Issuer {
    document: Arc<Mutex<Option<String>>>,
    fetches: Arc<AtomicUsize>,
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Issuer {
    async fn start(keys: &[&IssuerKey]) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/.well-known/jwks.json", listener.local_addr()?);
        let document = Arc::new(Mutex::new(Some(jwks(keys))));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (served, counted) = (document.clone(), fetches.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (served, counted) = (served.clone(), counted.clone());
                let service = hyper::service::service_fn(move |_request| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let current = served.lock().map(|d| d.clone()).unwrap_or_default();
                    let response = match current {
                        Some(text) => http::Response::builder()
                            .header("content-type", "application/jwk-set+json")
                            .header("cache-control", "public, max-age=3600")
                            .body(http_body_util::Full::new(bytes::Bytes::from(text))),
                        None => http::Response::builder().status(500).body(http_body_util::Full::default()),
                    };
                    async move { response }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
            }
        });
        Ok(Self { document, fetches, url, task })
    }

    fn publish(&self, document: Option<String>) {
        if let Ok(mut held) = self.document.lock() {
            *held = document;
        }
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

impl Drop for Issuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Gateway {
    /// The data plane's `sluice_jwks_fetches_total` for one result.
    async fn jwks_fetches(&self, result: &str) -> Result<f64> {
        let text = self.client.get(&self.metrics_url).send().await?.text().await?;
        let wanted = format!("result=\"{result}\"");
        let lines = text.lines().filter(|line| line.starts_with("sluice_jwks_fetches_total") && line.contains(&wanted));
        Ok(lines.filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok()).sum())
    }
}

#[tokio::test]
async fn keys_from_a_jwks_url_follow_rotation_and_outlive_an_outage() -> Result<()> {
    let k1 = IssuerKey::generate("k1", Algorithm::ES256)?;
    let k2 = IssuerKey::generate("k2", Algorithm::EdDSA)?;
    let issuer = Issuer::start(&[&k1]).await?;
    let interval = 2;
    let jwt = json!({ "jwks_url": issuer.url, "issuer": ISSUER, "audiences": [AUDIENCE] });
    // The failed-authentication limit is off: this client sends many refused tokens on purpose.
    let flags = ["--jwks-min-refresh-interval-secs", &interval.to_string(), "--auth-failure-limit", "0"];
    let gateway = Gateway::start_with(api_with(jwt), &flags).await?;
    let stored = gateway.admin.ok(Method::GET, "/v1/apis/shop", None).await?;
    ensure!(stored["policies"][0]["jwt"]["jwks_url"] == issuer.url.as_str(), "stored: {stored}");

    // The data plane fetches the document itself.
    let k1_token = k1.sign(&claims("carol"))?;
    eventually("a token of the published key", || async {
        gateway.forwarded(&k1_token, "k1 token").await.is_ok_and(|h| ensure_consumer(&h, "carol").is_ok())
    })
    .await?;

    // The issuer rotates in k2: its first token names an unknown kid, which makes the data plane fetch again.
    issuer.publish(Some(jwks(&[&k1, &k2])));
    let k2_token = k2.sign(&claims("dave"))?;
    eventually("a token of the rotated-in key", || async { gateway.forwarded(&k2_token, "k2 token").await.is_ok() })
        .await?;

    // Tokens naming unknown keys cannot make it hammer the issuer: early fetches are spaced by the interval.
    let (started, before) = (std::time::Instant::now(), issuer.fetches());
    for _ in 0..40 {
        gateway.refused(&k1.sign_as("k9", &claims("carol"))?, "an unknown kid", "no known key").await?;
    }
    let allowed = 1 + started.elapsed().as_secs() as usize / interval;
    ensure!(issuer.fetches() - before <= allowed, "{} fetches for 40 unknown kids", issuer.fetches() - before);

    // The issuer fails: a failed fetch is counted, and the last good keys keep serving.
    issuer.publish(None);
    tokio::time::sleep(std::time::Duration::from_secs(interval as u64)).await;
    let errors_before = gateway.jwks_fetches("error").await?;
    gateway.refused(&k1.sign_as("k8", &claims("carol"))?, "an unknown kid", "no known key").await?;
    eventually("a failed fetch counted", || async {
        gateway.jwks_fetches("error").await.is_ok_and(|errors| errors > errors_before)
    })
    .await?;
    ensure_consumer(&gateway.forwarded(&k1_token, "k1 during the outage").await?, "carol")?;
    ensure_consumer(&gateway.forwarded(&k2.sign(&claims("erin"))?, "k2 during the outage").await?, "erin")?;
    ensure!(gateway.jwks_fetches("ok").await? >= 2.0, "the successful fetches are counted");

    // The control plane refuses a URL no data plane could use, and a URL beside a document.
    for (jwt, what) in [
        (json!({ "jwks_url": "file:///etc/jwks.json" }), "a file URL"),
        (json!({ "jwks_url": "https://user:secret@idp.example/jwks" }), "credentials in the URL"),
        (json!({ "jwks_url": issuer.url, "jwks": jwks(&[&k1]) }), "a URL and a document"),
    ] {
        let (status, problem) =
            gateway.admin.send(Method::PATCH, "/v1/apis/shop", Some(json!({ "policies": [{ "jwt": jwt }] }))).await?;
        ensure!(status == 422, "{what}: {status} {problem}");
        let pointers: Vec<&str> =
            problem["errors"].as_array().into_iter().flatten().filter_map(|e| e["pointer"].as_str()).collect();
        ensure!(pointers == ["/apis/shop/policies/0/jwt/jwks_url"], "{what}: {problem}");
    }
    Ok(())
}
