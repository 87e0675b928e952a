//! The `sluice-test-upstream` binary used by the proxy tests and the benchmark.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::Value;

use crate::support::{Upstream, client};

#[tokio::test]
async fn echoes_the_request() -> Result<()> {
    let upstream = Upstream::start("echo-1").await?;
    let response = client()
        .post(format!("{}/items/7?q=a%20b&n=2", upstream.url()))
        .header("x-custom", "one")
        .body("hello body")
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let echo: Value = response.json().await?;
    assert_eq!(echo["server"], "echo-1");
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["path"], "/items/7");
    assert_eq!(echo["query"], "q=a%20b&n=2");
    assert_eq!(echo["headers"]["x-custom"], "one");
    assert_eq!(echo["body"], "hello body");
    assert_eq!(echo["body_len"], 10);
    assert_eq!(echo["version"], "HTTP/1.1");
    Ok(())
}

#[tokio::test]
async fn status_delay_health_and_h2c() -> Result<()> {
    let upstream = Upstream::start("echo-2").await?;
    let http = client();

    assert_eq!(http.get(format!("{}/x?status=418", upstream.url())).send().await?.status().as_u16(), 418);
    let by_header = http.get(format!("{}/x", upstream.url())).header("x-echo-status", "503").send().await?;
    assert_eq!(by_header.status().as_u16(), 503);

    let started = Instant::now();
    http.get(format!("{}/x?delay_ms=300", upstream.url())).send().await?;
    assert!(started.elapsed() >= Duration::from_millis(300));
    let started = Instant::now();
    http.get(format!("{}/x", upstream.url())).header("x-echo-delay-ms", "200").send().await?;
    assert!(started.elapsed() >= Duration::from_millis(200));

    let health = http.get(format!("{}/health", upstream.url())).send().await?;
    assert_eq!(health.status().as_u16(), 200);
    assert_eq!(health.text().await?, "ok\n");

    let h2 = reqwest::Client::builder().no_proxy().http2_prior_knowledge().build()?;
    let echo: Value = h2.get(format!("{}/over-h2", upstream.url())).send().await?.json().await?;
    assert_eq!(echo["version"], "HTTP/2.0");
    assert_eq!(echo["path"], "/over-h2");
    Ok(())
}

#[tokio::test]
async fn streams_large_bodies_without_echoing_them() -> Result<()> {
    let upstream = Upstream::start("echo-3").await?;
    let http = client();
    let download = http.get(format!("{}/bytes/1000000", upstream.url())).send().await?;
    assert_eq!(download.status().as_u16(), 200);
    assert_eq!(download.bytes().await?.len(), 1_000_000);

    let upload: Value = http
        .put(format!("{}/sink?discard_body=1", upstream.url()))
        .body(vec![7u8; 3_000_000])
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(upload["body_len"], 3_000_000);
    assert_eq!(upload["body"], Value::Null);
    Ok(())
}
