//! Clients that try to harm other clients or an upstream through a real
//! `sluice-dp` process, fed by the fake control plane, in front of a real
//! `sluice-test-upstream --record` that prints what reached it: broken and
//! over-limit bodies must not eject a healthy target, slow bodies end in 408
//! on every route without a complete request reaching the upstream, password
//! guessing is limited before any hash is computed, a burst with one
//! credential costs one hash, and oversized tokens and
//! credentialed wildcard CORS are refused.

use std::time::Duration;

use anyhow::Result;
use serde_json::Value;
use sluice_proto::v1;
use sluice_proto::v1::policy::Kind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fake_cp::{FakeControlPlane, seal};
use crate::support::{DataPlane, Process, client, eventually};

/// A `sluice-test-upstream --record`.
struct RecordingUpstream {
    process: Process,
    url: String,
}

impl RecordingUpstream {
    async fn start() -> Result<Self> {
        let process = Process::spawn(
            env!("CARGO_BIN_EXE_sluice-test-upstream"),
            &["--addr", "127.0.0.1:0", "--name", "recording", "--record"],
            &[],
        )
        .await?;
        let url = format!("http://{}", process.addr("addr")?);
        Ok(Self { process, url })
    }

    /// The `{"received": ...}` and `{"body": ...}` lines printed so far.
    fn lines(&self) -> Vec<Value> {
        self.process.stdout().lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
    }

    /// Request heads that reached the upstream for `path`.
    fn heads(&self, path: &str) -> usize {
        self.lines().iter().filter(|line| line["received"]["path"] == path).count()
    }

    /// Bodies for `path` that reached the upstream whole.
    fn complete_bodies(&self, path: &str) -> usize {
        self.lines().iter().filter(|line| line["body"]["path"] == path && line["body"]["complete"] == true).count()
    }

    async fn wait_for_head(&self, path: &str) -> Result<()> {
        eventually(&format!("{path} at the upstream"), Duration::from_millis(20), || async { self.heads(path) > 0 })
            .await
    }
}

fn policy(kind: Kind) -> v1::Policy {
    v1::Policy { kind: Some(kind) }
}

fn api(name: &str, prefix: &str, policies: Vec<v1::Policy>) -> v1::Api {
    v1::Api {
        name: name.into(),
        path_prefix: prefix.into(),
        upstream: "backend".into(),
        policies,
        ..Default::default()
    }
}

/// One upstream `backend` that is ejected after two consecutive failures,
/// for a minute: long enough that any ejection shows in the test.
fn snapshot(upstream: &RecordingUpstream, apis: Vec<v1::Api>) -> v1::Snapshot {
    let backend = v1::Upstream {
        name: "backend".into(),
        targets: vec![v1::Target { url: upstream.url.clone(), weight: 1 }],
        passive_health_check: Some(v1::PassiveHealthCheck {
            consecutive_failures: 2,
            ejection_ms: 60_000,
            // What the control plane sends when `unhealthy_statuses` is left out.
            unhealthy_statuses: vec![502, 503, 504],
        }),
        ..Default::default()
    };
    v1::Snapshot { version: 1, apis, upstreams: vec![backend], ..Default::default() }
}

/// Sends raw bytes (a request the HTTP clients refuse to send), optionally
/// half-closes, and returns what the gateway answered until it closed or
/// went quiet. The status line's code, if any.
async fn raw_exchange(dp: &DataPlane, request: &[u8], half_close: bool) -> Result<Option<u16>> {
    let mut stream = TcpStream::connect(dp.http_addr).await?;
    stream.write_all(request).await?;
    if half_close {
        stream.shutdown().await?;
    }
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => {
                answer.extend_from_slice(&buffer[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") && !half_close {
                    // The head is enough; a kept-open connection would only go quiet.
                    break;
                }
            }
        }
    }
    let text = String::from_utf8_lossy(&answer);
    Ok(text.strip_prefix("HTTP/1.1 ").and_then(|rest| rest.get(..3)).and_then(|code| code.parse().ok()))
}

#[tokio::test]
async fn client_body_failures_never_eject_a_healthy_target() -> Result<()> {
    let upstream = RecordingUpstream::start().await?;
    let limited = policy(Kind::RequestSizeLimit(v1::RequestSizeLimit { max_bytes: 500 }));
    let snapshot = snapshot(&upstream, vec![api("open", "/", vec![limited])]);
    let (_cp, dp) = DataPlane::running(snapshot, &[]).await?;

    // Each three times: more than the two consecutive failures that eject.
    for round in 0..3 {
        // A chunk size that is not hex, after a good first chunk (so the request is on its way).
        let path = format!("/bad-chunk-{round}");
        let bad_chunk = format!(
            "POST {path} HTTP/1.1\r\nHost: shop\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nmore\r\n0\r\n\r\n"
        );
        let status = raw_exchange(&dp, bad_chunk.as_bytes(), false).await?;
        assert!(status.is_none_or(|s| s == 400), "bad chunk: {status:?}");
        // An upload that stops after 10 of 400 bytes.
        let path = format!("/truncated-{round}");
        let truncated =
            format!("POST {path} HTTP/1.1\r\nHost: shop\r\nContent-Length: 400\r\nConnection: close\r\n\r\n0123456789");
        let status = raw_exchange(&dp, truncated.as_bytes(), true).await?;
        assert!(status.is_none_or(|s| s == 400), "truncated upload: {status:?}");
        // A chunked body over the API's 500-byte limit: the gateway's own 413.
        let path = format!("/too-large-{round}");
        let chunk = format!("c8\r\n{}\r\n", "x".repeat(200));
        let too_large = format!(
            "POST {path} HTTP/1.1\r\nHost: shop\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{chunk}{chunk}{chunk}0\r\n\r\n"
        );
        let status = raw_exchange(&dp, too_large.as_bytes(), false).await?;
        assert_eq!(status, Some(413), "over the limit");
    }
    // None of those bodies reached the upstream whole.
    for round in 0..3 {
        for path in [format!("/bad-chunk-{round}"), format!("/truncated-{round}"), format!("/too-large-{round}")] {
            assert_eq!(upstream.complete_bodies(&path), 0, "{path}: {:?}", upstream.lines());
        }
    }

    // The target was never ejected: another client is served.
    let response = client().get(dp.url("/innocent")).send().await?;
    assert_eq!(response.status().as_u16(), 200, "{}", dp.process.stderr());
    let echo: Value = response.json().await?;
    assert_eq!(echo["path"], "/innocent");
    assert_eq!(dp.metric("sluice_upstream_healthy").await?, Some(1.0));
    assert!(!dp.process.stderr().contains("target ejected"), "{}", dp.process.stderr());
    Ok(())
}

#[tokio::test]
async fn upstream_failures_still_eject_the_target() -> Result<()> {
    // The other side of the rule: the target's own failures count.
    let upstream = RecordingUpstream::start().await?;
    let (_cp, dp) = DataPlane::running(snapshot(&upstream, vec![api("open", "/", vec![])]), &[]).await?;
    // A status the check does not count (500 is not among the default statuses) is an answer, not a failure.
    for _ in 0..3 {
        let response = client().get(dp.url("/error?status=500")).send().await?;
        assert_eq!(response.status().as_u16(), 500);
    }
    assert_eq!(dp.metric("sluice_upstream_healthy").await?, Some(1.0));
    for _ in 0..2 {
        let response = client().get(dp.url("/fail?status=503")).send().await?;
        assert_eq!(response.status().as_u16(), 503);
    }
    dp.process.wait_for_log("target ejected").await?;
    let response = client().get(dp.url("/after")).send().await?;
    assert_eq!(response.status().as_u16(), 503, "ejected: no healthy target");
    assert_eq!(upstream.heads("/after"), 0);
    Ok(())
}

/// A spec with one operation whose JSON body the gateway validates (so it
/// buffers the body before anything goes upstream).
fn items_spec() -> v1::Spec {
    let doc = serde_json::json!({
        "openapi": "3.0.3",
        "info": { "title": "items", "version": "1" },
        "paths": { "/items": { "post": {
            "requestBody": { "required": true, "content": { "application/json": {
                "schema": { "type": "object" } } } },
            "responses": { "201": { "description": "made" } }
        } } }
    });
    v1::Spec { name: "items".into(), json: doc.to_string() }
}

#[tokio::test]
async fn slow_bodies_get_408_on_every_route_and_never_reach_the_upstream_whole() -> Result<()> {
    let upstream = RecordingUpstream::start().await?;
    let mut validated = api("validated", "/validated", vec![]);
    validated.openapi =
        Some(v1::OpenApiBinding { spec: "items".into(), validate_requests: true, validate_responses: false });
    let mut snapshot = snapshot(&upstream, vec![validated, api("plain", "/plain", vec![])]);
    snapshot.specs = vec![items_spec()];
    let (_cp, dp) = DataPlane::running(snapshot, &["--client-body-timeout-secs", "1"]).await?;

    // 100,000 bytes announced, one sent, the connection kept open.
    for path in ["/validated/items", "/plain/items"] {
        let slow = format!(
            "POST {path} HTTP/1.1\r\nHost: shop\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{"
        );
        let status = raw_exchange(&dp, slow.as_bytes(), false).await?;
        assert_eq!(status, Some(408), "{path}; stderr:\n{}", dp.process.stderr());
    }
    // A complete request afterwards reaches the upstream, and the target is still in.
    let response =
        client().post(dp.url("/validated/items")).header("content-type", "application/json").body("{}").send().await?;
    assert_eq!(response.status().as_u16(), 200);
    upstream.wait_for_head("/validated/items").await?;
    // The buffered route sent nothing upstream for the slow request: one head, the good one.
    assert_eq!(upstream.heads("/validated/items"), 1, "{:?}", upstream.lines());
    assert_eq!(upstream.complete_bodies("/validated/items"), 1);
    // The streamed route's upstream got a head and part of a body, never a whole request.
    assert_eq!(upstream.complete_bodies("/plain/items"), 0, "{:?}", upstream.lines());
    assert_eq!(dp.metric("sluice_upstream_healthy").await?, Some(1.0));
    Ok(())
}

/// An Argon2id hash of `password`, cheap enough for tests unless `m` says otherwise.
fn password_hash(password: &str, memory_kib: u32) -> Result<String> {
    use argon2::PasswordHasher as _;
    let params = argon2::Params::new(memory_kib, 1, 1, None).map_err(|e| anyhow::anyhow!("{e}"))?;
    let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    Ok(argon.hash_password(password.as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))?.to_string())
}

fn basic(credentials: &str) -> String {
    use base64::Engine as _;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(credentials))
}

/// One API behind basic auth, with consumer `ann` (password `right`).
fn basic_auth_snapshot(upstream: &RecordingUpstream, memory_kib: u32) -> Result<v1::Snapshot> {
    let mut snapshot =
        snapshot(upstream, vec![api("private", "/", vec![policy(Kind::BasicAuth(v1::BasicAuth::default()))])]);
    snapshot.consumers = vec![v1::Consumer {
        username: "ann".into(),
        basic_auth_password_hash: password_hash("right", memory_kib)?,
        ..Default::default()
    }];
    Ok(snapshot)
}

async fn verifications(dp: &DataPlane) -> Result<f64> {
    Ok(dp.metric("sluice_password_verifications_total").await?.unwrap_or(0.0))
}

#[tokio::test]
async fn password_guessing_is_limited_before_any_hash_is_computed() -> Result<()> {
    let upstream = RecordingUpstream::start().await?;
    let flags = ["--auth-failure-limit", "5", "--auth-failure-window-secs", "600"];
    let (_cp, dp) = DataPlane::running(basic_auth_snapshot(&upstream, 1024)?, &flags).await?;
    let http = client();
    let login =
        |credentials: &str, path: &str| http.get(dp.url(path)).header("authorization", basic(credentials)).send();

    // The owner logs in once (so the gateway knows the credential).
    assert_eq!(login("ann:right", "/owner").await?.status().as_u16(), 200);
    // Five wrong passwords are checked, and refused.
    for n in 0..5 {
        let response = login(&format!("ann:guess-{n}"), "/guess").await?;
        assert_eq!(response.status().as_u16(), 401, "guess {n}");
    }
    let checked = verifications(&dp).await?;
    assert_eq!(checked, 6.0, "one argon2 run per new credential");
    // From then on every guess is refused with 429, and no hash runs.
    for n in 5..25 {
        let response = login(&format!("ann:guess-{n}"), "/guess").await?;
        assert_eq!(response.status().as_u16(), 429, "guess {n}");
        assert!(response.headers().contains_key("retry-after"));
        let problem: Value = response.json().await?;
        assert_eq!(problem["status"], 429);
    }
    // Another username from the same address is limited too: the address failed.
    assert_eq!(login("bob:x", "/guess").await?.status().as_u16(), 429);
    assert_eq!(verifications(&dp).await?, checked, "no hash computed while limited");
    assert!(dp.metric("sluice_auth_limited_total").await?.unwrap_or(0.0) >= 21.0);
    assert_eq!(dp.metric("sluice_auth_failures_total").await?, Some(5.0));
    // None of the guesses reached the upstream; the owner's login did.
    upstream.wait_for_head("/owner").await?;
    assert_eq!(upstream.heads("/guess"), 0);
    Ok(())
}

#[tokio::test]
async fn a_username_is_limited_across_addresses_and_unknown_ones_cost_a_hash_too() -> Result<()> {
    let upstream = RecordingUpstream::start().await?;
    // The test's connections come from a trusted proxy, so X-Forwarded-For
    // names a different client for every guess: only the username links them.
    let flags = ["--auth-failure-limit", "3", "--auth-failure-window-secs", "600", "--trusted-proxies", "127.0.0.1"];
    let (_cp, dp) = DataPlane::running(basic_auth_snapshot(&upstream, 1024)?, &flags).await?;
    let http = client();
    let guess = |credentials: &str, n: u32| {
        http.get(dp.url("/guess"))
            .header("authorization", basic(credentials))
            .header("x-forwarded-for", format!("198.51.100.{n}"))
            .send()
    };
    for n in 0..3 {
        assert_eq!(guess("ann:wrong", n).await?.status().as_u16(), 401);
    }
    let before = verifications(&dp).await?;
    assert_eq!(guess("ann:wrong", 10).await?.status().as_u16(), 429, "ann's guesses are over, whatever the address");
    assert_eq!(verifications(&dp).await?, before);

    // An unknown username runs argon2 like a known one (its timing tells nothing).
    assert_eq!(guess("nobody:x", 20).await?.status().as_u16(), 401);
    assert_eq!(verifications(&dp).await?, before + 1.0);
    assert_eq!(upstream.heads("/guess"), 0);
    Ok(())
}

/// A data plane that has just started meets a burst of requests with one
/// credential it has not verified yet (here 32 connections at once): one
/// argon2 run serves them all, instead of one each filling the password
/// pool's queue so that the rest of the burst is refused as busy.
#[tokio::test]
async fn a_burst_with_one_credential_costs_one_argon2_run() -> Result<()> {
    let upstream = RecordingUpstream::start().await?;
    let (_cp, dp) = DataPlane::running(basic_auth_snapshot(&upstream, 8 * 1024)?, &[]).await?;
    let burst = (0..32).map(|_| {
        // A client each: a connection each.
        let url = dp.url("/burst");
        async move { client().get(url).header("authorization", basic("ann:right")).send().await }
    });
    for response in futures_util::future::join_all(burst).await {
        assert_eq!(response?.status().as_u16(), 200);
    }
    assert_eq!(verifications(&dp).await?, 1.0, "stderr:\n{}", dp.process.stderr());
    eventually("32 requests at the upstream", Duration::from_millis(20), || async { upstream.heads("/burst") == 32 })
        .await?;
    Ok(())
}

#[tokio::test]
async fn oversized_tokens_are_refused_before_parsing() -> Result<()> {
    let upstream = RecordingUpstream::start().await?;
    let jwt = v1::JwtAuth::default();
    let mut snapshot = snapshot(&upstream, vec![api("tokens", "/", vec![policy(Kind::Jwt(jwt))])]);
    snapshot.consumers = vec![v1::Consumer {
        username: "ann".into(),
        jwt_credentials: vec![v1::JwtCredential {
            key: "ann-iss".into(),
            algorithm: "HS256".into(),
            secret: "ann-secret".into(),
            public_key_pem: String::new(),
        }],
        ..Default::default()
    }];
    let (_cp, dp) = DataPlane::running(snapshot, &[]).await?;
    let exp = jsonwebtoken::get_current_timestamp() + 600;
    let sign = |padding: &str| {
        let claims = serde_json::json!({ "iss": "ann-iss", "exp": exp, "padding": padding });
        let key = jsonwebtoken::EncodingKey::from_secret(b"ann-secret")?;
        anyhow::Ok(jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key)?)
    };
    // A valid token of ordinary size passes.
    let ok = client().get(dp.url("/small")).bearer_auth(sign("x")?).send().await?;
    assert_eq!(ok.status().as_u16(), 200);
    // The same, validly signed but padded past 8 KiB, is refused unread.
    let large = sign(&"x".repeat(9 * 1024))?;
    let refused = client().get(dp.url("/large")).bearer_auth(&large).send().await?;
    assert_eq!(refused.status().as_u16(), 401);
    let problem: Value = refused.json().await?;
    assert!(problem["detail"].as_str().is_some_and(|d| d.contains("longer than 8192 bytes")), "{problem}");
    upstream.wait_for_head("/small").await?;
    assert_eq!(upstream.heads("/large"), 0);
    Ok(())
}

#[tokio::test]
async fn credentialed_any_origin_and_costly_hashes_are_refused_by_the_data_plane() -> Result<()> {
    let upstream = RecordingUpstream::start().await?;
    let mut cp = FakeControlPlane::start().await?;
    let dp = DataPlane::start(&cp.url(), &[]).await?;
    let mut conn = cp.accept().await?;
    let cors = v1::Cors { allow_origins: vec!["*".into()], allow_credentials: true, ..Default::default() };
    let mut snapshot = basic_auth_snapshot(&upstream, 1024)?;
    snapshot.apis[0].policies.push(policy(Kind::Cors(cors)));
    snapshot.consumers[0].basic_auth_password_hash =
        "$argon2id$v=19$m=4194304,t=1,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaA".into();
    conn.push(seal(snapshot)).await?;
    let nack = conn.nack().await?;
    assert!(nack.error.contains("/apis/private/policies/1/cors/allow_credentials"), "{}", nack.error);
    assert!(nack.error.contains("/consumers/ann/basic_auth/password_hash"), "{}", nack.error);
    assert_eq!(dp.ready_status().await?, 503, "nothing applied");
    Ok(())
}

/// Not a check: prints the data plane's resident memory before, during and
/// after 16 connections sending wrong passwords for 10 s (with the failure
/// limit off, so every guess costs an argon2 run at the control plane's
/// default cost). Run by hand:
/// `cargo nextest run -p sluice-data-plane --run-ignored only memory_under_a_password_flood --no-capture`.
#[tokio::test]
#[ignore = "a measurement, not a test"]
async fn memory_under_a_password_flood() -> Result<()> {
    let upstream = RecordingUpstream::start().await?;
    let (_cp, dp) =
        DataPlane::running(basic_auth_snapshot(&upstream, 19 * 1024)?, &["--auth-failure-limit", "0"]).await?;
    let pid = dp.process.pid()?;
    let idle = sluice_testkit::rss_kib(pid)?;
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let flooders = (0..16).map(|c| {
        let url = dp.url("/flood");
        tokio::spawn(async move {
            let http = client();
            let mut sent = 0u32;
            while tokio::time::Instant::now() < until {
                let _ = http.get(&url).header("authorization", basic(&format!("ann:wrong-{c}-{sent}"))).send().await;
                sent += 1;
            }
            sent
        })
    });
    let sampler = tokio::spawn(async move {
        let mut peak = 0;
        while tokio::time::Instant::now() < until {
            peak = peak.max(sluice_testkit::rss_kib(pid).unwrap_or(0));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        peak
    });
    let mut sent = 0;
    for flooder in flooders {
        sent += flooder.await?;
    }
    let peak = sampler.await?;
    let right_after = sluice_testkit::rss_kib(pid)?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let settled = sluice_testkit::rss_kib(pid)?;
    let checked = verifications(&dp).await?;
    println!(
        "password flood: {sent} requests, {checked} argon2 runs; RSS idle {idle} KiB, peak {peak} KiB, \
         right after {right_after} KiB, 5 s later {settled} KiB"
    );
    Ok(())
}
