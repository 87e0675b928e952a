//! What an operator sees of a request, with a real `sluice-dp` process and
//! `sluice-test-upstream`: the request ID (taken or made, sent upstream,
//! echoed, in problem bodies, the access log and error log lines).

use anyhow::{Context, Result};
use serde_json::Value;
use sluice_proto::v1;
use sluice_proto::v1::policy::Kind;

use crate::support::{DataPlane, Upstream, api, client, eventually, send, unused_addr};

fn upstream(name: &str, urls: &[String]) -> v1::Upstream {
    v1::Upstream {
        name: name.into(),
        targets: urls.iter().map(|url| v1::Target { url: url.clone(), weight: 1 }).collect(),
        ..Default::default()
    }
}

/// Every series on `/metrics` is explained by a `# HELP` line.
pub fn assert_every_series_has_help(text: &str) {
    let typed = text.lines().filter_map(|line| line.strip_prefix("# TYPE ")?.split_whitespace().next());
    let missing: Vec<&str> =
        typed.filter(|name| !text.lines().any(|line| line.starts_with(&format!("# HELP {name} ")))).collect();
    assert!(missing.is_empty(), "no # HELP for {missing:?} in\n{text}");
}

/// The access log lines (stdout after the address line) whose `path` is `path`.
fn access_lines(dp: &DataPlane, path: &str) -> Vec<Value> {
    dp.process
        .stdout()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["path"] == path)
        .collect()
}

/// Waits for the one access log line of `path`.
async fn access_line(dp: &DataPlane, path: &str) -> Result<Value> {
    let logged = || async { access_lines(dp, path).len() == 1 };
    eventually(path, std::time::Duration::from_millis(20), logged)
        .await
        .with_context(|| format!("no access log line for {path}; stdout:\n{}", dp.process.stdout()))?;
    access_lines(dp, path).pop().context("the line went away")
}

#[tokio::test]
async fn request_ids_are_taken_or_made_and_seen_everywhere() -> Result<()> {
    let echo = Upstream::start("echo").await?;
    let dead = format!("http://{}", unused_addr().await?);
    let deny_all =
        Kind::IpRestriction(v1::IpRestriction { allow: vec![], deny: vec!["0.0.0.0/0".into(), "::/0".into()] });
    let snapshot = v1::Snapshot {
        version: 1,
        apis: vec![
            api("open", "/open", "live", vec![]),
            api("down", "/down", "dead", vec![]),
            api("closed", "/closed", "live", vec![deny_all]),
        ],
        upstreams: vec![upstream("live", &[echo.url()]), upstream("dead", &[dead])],
        ..Default::default()
    };
    let (_cp, dp) = DataPlane::running(snapshot, &[]).await?;
    let c = client();

    // None sent: one is made, sent upstream, echoed and logged.
    let (status, headers, body) = send(c.get(dp.url("/open/made"))).await?;
    assert_eq!(status, 200);
    let made = headers["x-request-id"].to_str()?.to_owned();
    assert_eq!(made.len(), 26, "{made}");
    assert_eq!(body["headers"]["x-request-id"], made.as_str(), "the upstream got it");
    assert_eq!(access_line(&dp, "/open/made").await?["request_id"], made.as_str());
    // Each request its own.
    let (_, headers, _) = send(c.get(dp.url("/open/made"))).await?;
    assert_ne!(headers["x-request-id"].to_str()?, made);

    // A well-formed one from the client: kept as sent, everywhere.
    let uuid = "4f1c2b9e-8d1a-4c3e-9f00-1234567890ab";
    let (status, headers, body) = send(c.get(dp.url("/open/taken")).header("X-Request-Id", uuid)).await?;
    assert_eq!(status, 200);
    assert_eq!(headers["x-request-id"], uuid);
    assert_eq!(body["headers"]["x-request-id"], uuid);
    assert_eq!(access_line(&dp, "/open/taken").await?["request_id"], uuid);

    // Malformed, too long or repeated: replaced, and the upstream sees only the replacement.
    let long = "a".repeat(65);
    for (path, sent) in [("/open/bad", vec!["a b<script>"]), ("/open/long", vec![&long]), ("/open/two", vec!["x", "y"])]
    {
        let mut request = c.get(dp.url(path));
        for value in &sent {
            request = request.header("x-request-id", *value);
        }
        let (status, headers, body) = send(request).await?;
        assert_eq!(status, 200, "{path}");
        let id = headers["x-request-id"].to_str()?;
        assert_eq!(id.len(), 26, "{path}: {id}");
        assert_eq!(body["headers"]["x-request-id"], id, "{path}");
    }

    // Problem bodies name it: a 502 (and its error log line), a policy refusal, a 404.
    let (status, headers, body) = send(c.get(dp.url("/down/x")).header("x-request-id", "trace-502")).await?;
    assert_eq!((status, headers["x-request-id"].to_str()?), (502, "trace-502"));
    assert_eq!(body["request_id"], "trace-502");
    dp.process.wait_for_log("trace-502").await?;
    let logged = dp.process.stderr();
    let error_line = logged.lines().find(|line| line.contains("trace-502")).context("no error line")?;
    assert!(error_line.contains("upstream failure"), "{error_line}");
    for (path, want) in [("/closed/x", 403), ("/nowhere", 404)] {
        let (status, headers, body) = send(c.get(dp.url(path))).await?;
        assert_eq!(status, want, "{path}");
        let id = headers["x-request-id"].to_str()?;
        assert_eq!(body["request_id"], id, "{path}: {body}");
        assert_eq!(access_line(&dp, path).await?["request_id"], id, "{path}");
    }
    Ok(())
}

#[tokio::test]
async fn the_request_id_header_is_configurable() -> Result<()> {
    let echo = Upstream::start("echo").await?;
    let snapshot = v1::Snapshot {
        version: 1,
        apis: vec![api("open", "/", "live", vec![])],
        upstreams: vec![upstream("live", &[echo.url()])],
        ..Default::default()
    };
    let (_cp, dp) = DataPlane::running(snapshot, &["--request-id-header", "X-Correlation-Id"]).await?;
    let (status, headers, body) =
        send(client().get(dp.url("/x")).header("x-correlation-id", "corr-1").header("x-request-id", "other")).await?;
    assert_eq!(status, 200);
    assert_eq!(headers["x-correlation-id"], "corr-1");
    assert_eq!(body["headers"]["x-correlation-id"], "corr-1");
    // Another header of that name is an ordinary header now.
    assert_eq!(body["headers"]["x-request-id"], "other");
    assert_eq!(access_line(&dp, "/x").await?["request_id"], "corr-1");
    Ok(())
}

#[tokio::test]
async fn with_one_of_two_targets_dead_retries_go_to_the_live_one_and_none_fails() -> Result<()> {
    let live = Upstream::start("live").await?;
    let dead = format!("http://{}", unused_addr().await?);
    // Round robin, no health check: every other request starts on the dead target.
    let snapshot = v1::Snapshot {
        version: 1,
        apis: vec![v1::Api { retries: 2, ..api("shop", "/", "pool", vec![]) }],
        upstreams: vec![upstream("pool", &[dead, live.url()])],
        ..Default::default()
    };
    let (_cp, dp) = DataPlane::running(snapshot, &["--access-log", "off"]).await?;
    let c = client();
    let mut failed = Vec::new();
    for i in 0..100 {
        let (status, _, _) = send(c.get(dp.url(&format!("/r{i}")))).await?;
        if status != 200 {
            failed.push((i, status));
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}; stderr:\n{}", dp.process.stderr());
    // A retry is not a round-robin turn: half the requests started on the dead target, once each.
    assert_eq!(dp.metric("sluice_upstream_retries_total").await?, Some(50.0));
    assert_eq!(dp.metric("sluice_upstream_retries_refused_total").await?, Some(0.0));
    let received: Value = client().get(format!("{}/__received", live.url())).send().await?.json().await?;
    assert_eq!(received["count"], 100);
    let text = client().get(dp.ops_url("/metrics")).send().await?.text().await?;
    assert_every_series_has_help(&text);
    // The live target's answers, timed; bytes per API.
    assert_eq!(crate::support::metric_sum(&text, "sluice_upstream_request_duration_seconds_count"), Some(100.0));
    assert!(crate::support::metric_sum(&text, "sluice_response_bytes_total").is_some_and(|n| n > 0.0), "{text}");
    Ok(())
}

#[tokio::test]
async fn the_access_log_line_has_every_field() -> Result<()> {
    let echo = Upstream::start("echo").await?;
    let dead = format!("http://{}", unused_addr().await?);
    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(vec!["api.example.test".to_string()])?.self_signed(&key)?;
    let snapshot = v1::Snapshot {
        version: 1,
        apis: vec![api("open", "/open", "live", vec![]), api("down", "/down", "dead", vec![])],
        upstreams: vec![upstream("live", &[echo.url()]), upstream("dead", std::slice::from_ref(&dead))],
        certificates: vec![v1::Certificate {
            name: "site".into(),
            chain_pem: cert.pem(),
            private_key_pem: key.serialize_pem(),
            default: true,
            ..Default::default()
        }],
        ..Default::default()
    };
    let (_cp, dp) = DataPlane::running(snapshot, &[]).await?;
    let c = client();

    // Plain HTTP/1.1 with a body.
    let response = c
        .post(dp.url("/open/upload?secret=1"))
        .header("user-agent", "observe-test/1.0")
        .header("x-request-id", "log-1")
        .body(vec![b'x'; 1234])
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 200);
    let sent = response.bytes().await?.len();
    let line = access_line(&dp, "/open/upload").await?;
    let mut keys: Vec<&str> = line.as_object().context("an object")?.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut documented = [
        "time",
        "request_id",
        "client",
        "tls",
        "http",
        "method",
        "host",
        "path",
        "user_agent",
        "api",
        "consumer",
        "status",
        "bytes_in",
        "bytes_out",
        "duration_ms",
        "upstream",
        "upstream_status",
        "upstream_ms",
        "grpc_status",
    ];
    documented.sort_unstable();
    assert_eq!(keys, documented, "{line}");
    assert_eq!(line["request_id"], "log-1");
    assert_eq!(line["client"], "127.0.0.1");
    assert_eq!(line["tls"], Value::Null);
    assert_eq!(line["http"], "1.1");
    assert_eq!(line["method"], "POST");
    assert_eq!(line["host"], "127.0.0.1");
    assert_eq!(line["path"], "/open/upload", "never the query");
    assert_eq!(line["user_agent"], "observe-test/1.0");
    assert_eq!(line["api"], "open");
    assert_eq!(line["status"], 200);
    assert_eq!(line["bytes_in"], 1234);
    assert_eq!(line["bytes_out"], sent);
    assert_eq!(line["upstream"], echo.url().as_str());
    assert_eq!(line["upstream_status"], 200);
    let (upstream_ms, duration_ms) = (line["upstream_ms"].as_f64(), line["duration_ms"].as_f64());
    assert!(matches!((upstream_ms, duration_ms), (Some(u), Some(d)) if u >= 0.0 && d >= u), "{line}");

    // The upstream's own error status, and a target that never answered.
    let (status, _, _) = send(c.get(dp.url("/open/failing?status=503"))).await?;
    assert_eq!(status, 503);
    let line = access_line(&dp, "/open/failing").await?;
    assert_eq!((line["status"].as_u64(), line["upstream_status"].as_u64()), (Some(503), Some(503)));
    let (status, _, _) = send(c.get(dp.url("/down/x"))).await?;
    assert_eq!(status, 502);
    let line = access_line(&dp, "/down/x").await?;
    assert_eq!(line["upstream"], dead.as_str());
    assert_eq!((line["upstream_status"].clone(), line["upstream_ms"].clone()), (Value::Null, Value::Null));

    // HTTP/2 over TLS.
    let tls = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(cert.pem().as_bytes())?])
        .resolve("api.example.test", dp.https_addr)
        .build()?;
    let response = tls.get(format!("https://api.example.test:{}/open/secure", dp.https_addr.port())).send().await?;
    assert_eq!((response.status().as_u16(), response.version()), (200, http::Version::HTTP_2));
    let line = access_line(&dp, "/open/secure").await?;
    assert_eq!((line["tls"].as_str(), line["http"].as_str()), (Some("TLSv1.3"), Some("2")));
    assert_eq!(line["host"], "api.example.test");
    assert_eq!(line["user_agent"], Value::Null);
    Ok(())
}
