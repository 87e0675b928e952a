//! `sluice standalone` on a fresh directory, driven by the `sluice` CLI the way
//! DESIGN.md's example config describes: apply, traffic, export, re-apply;
//! and its tracing flags, with spans sent to the testkit's OTLP collector.

use anyhow::{Context, Result, ensure};
use sluice_testkit::otlp::Collector;
use tokio::process::Command;

use crate::support::{ADMIN_TOKEN, Admin, binary, design_example, eventually, standalone, standalone_with, upstream};

async fn cli(admin_url: &str, args: &[&str]) -> Result<(bool, String, String)> {
    let output = Command::new(binary("sluice"))
        .args(["--admin-url", admin_url, "--admin-token", ADMIN_TOKEN])
        .args(args)
        .output()
        .await
        .context("running sluice")?;
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    Ok((output.status.success(), text(&output.stdout), text(&output.stderr)))
}

#[tokio::test]
async fn standalone_serves_what_the_cli_applies() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = standalone(dir.path()).await?;
    let admin_url = server.first_line["admin_url"].as_str().context("admin_url")?.to_string();
    let proxy_url = server.first_line["proxy_url"].as_str().context("proxy_url")?.to_string();
    let (_backend, backend) = upstream("backend", "127.0.0.1:0").await?;
    let config = design_example(dir.path(), &backend.to_string(), 2_000_000)?;

    let (ok, out, err) = cli(&admin_url, &["apply", "-f", config.to_str().context("path")?]).await?;
    ensure!(ok && out.contains("+ apis/shop") && out.contains("applied"), "apply: {out}{err}");

    let client = reqwest::Client::new();
    let products = format!("{proxy_url}/shop/v2/products");
    let post = |body: &'static str, auth: bool| {
        let mut request = client.post(&products).header("content-type", "application/json").body(body);
        if auth {
            request = request.basic_auth("loadtest", Some("secret"));
        }
        request.send()
    };
    eventually("the applied API served", || async {
        post(r#"{"name":"Mangos","price":2.79}"#, true).await.is_ok_and(|r| r.status() == 200)
    })
    .await?;
    let anonymous = post(r#"{"name":"Mangos","price":2.79}"#, false).await?;
    ensure!(anonymous.status() == 401, "without credentials: {}", anonymous.status());
    let invalid = post(r#"{"name":"Mangos","price":"cheap"}"#, true).await?;
    ensure!(invalid.status() == 400, "invalid body: {}", invalid.status());
    let problem = invalid.text().await?;
    ensure!(problem.contains("REQUEST/BODY#/price"), "{problem}");

    // Export holds the configuration but never the password.
    let (ok, exported, err) = cli(&admin_url, &["export"]).await?;
    ensure!(ok && exported.contains("name: shop") && exported.contains("password_hash"), "export: {exported}{err}");
    ensure!(!exported.contains("secret") && !exported.contains("password:"), "export leaks the password: {exported}");

    // Applying the same file again changes nothing.
    let (ok, out, err) = cli(&admin_url, &["apply", "-f", config.to_str().context("path")?]).await?;
    ensure!(ok && out.contains("no changes"), "re-apply: {out}{err}");

    // A dry run of an edit shows the diff and changes nothing.
    let edited = design_example(dir.path(), &backend.to_string(), 1_000)?;
    let (ok, out, err) = cli(&admin_url, &["apply", "--dry-run", "-f", edited.to_str().context("path")?]).await?;
    ensure!(ok && out.contains("~ apis/shop") && out.contains("dry run"), "dry run: {out}{err}");

    // The node and its version show in `sluice status`.
    let (ok, out, err) = cli(&admin_url, &["status"]).await?;
    ensure!(ok && out.contains("standalone") && out.contains("connected"), "status: {out}{err}");

    // A broken file is caught offline, naming the field.
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "apis:\n  - name: x\n    path_prefix: /x\n    upstream: nowhere\n")?;
    let (ok, _, err) = cli(&admin_url, &["validate", "-f", broken.to_str().context("path")?]).await?;
    ensure!(!ok && err.contains("/apis/x/upstream"), "validate: {err}");
    Ok(())
}

/// The upstream's `traceparent`, split: (trace id, parent id, flags).
fn received_traceparent(echo: &serde_json::Value) -> Result<(String, String, String)> {
    let header = echo["headers"]["traceparent"].as_str().context("the upstream got no traceparent")?;
    let parts: Vec<&str> = header.split('-').collect();
    ensure!(parts.len() == 4 && parts[0] == "00", "{header}");
    Ok((parts[1].to_owned(), parts[2].to_owned(), parts[3].to_owned()))
}

#[tokio::test]
async fn standalone_takes_the_data_planes_tracing_flags() -> Result<()> {
    const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const CLIENT_SPAN: &str = "00f067aa0ba902b7";
    let (collector, collector_addr) = Collector::start().await?;
    let endpoint = format!("http://{collector_addr}");
    let dir = tempfile::tempdir()?;
    // A ratio of 0 samples no new trace, so only a client's sampled one is recorded.
    let flags = ["--otlp-endpoint", &endpoint, "--trace-sampling-ratio", "0", "--service-name", "edge-standalone"];
    let server = standalone_with(dir.path(), &flags).await?;
    let admin_url = server.first_line["admin_url"].as_str().context("admin_url")?;
    let admin = Admin::new(admin_url.trim_start_matches("http://").parse()?);
    let proxy_url = server.first_line["proxy_url"].as_str().context("proxy_url")?.to_string();
    let (_backend, backend) = upstream("backend", "127.0.0.1:0").await?;
    admin.create_upstream("backend", backend).await?;
    admin.create_api("shop", "/shop", "backend").await?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let get = |request_id: &'static str, traceparent: Option<String>| {
        let mut request = client.get(format!("{proxy_url}/shop/items")).header("x-request-id", request_id);
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        request.send()
    };
    eventually("the API served", || async { get("warm-up", None).await.is_ok_and(|r| r.status() == 200) }).await?;

    // A new trace is started and propagated, but not sampled at a ratio of 0.
    let echo: serde_json::Value = get("unsampled", None).await?.json().await?;
    let (_, _, sampled) = received_traceparent(&echo)?;
    ensure!(sampled == "00", "a ratio of 0 sampled a new trace: {echo}");

    // The client's sampled trace is continued and its span exported with standalone's names.
    let response = get("sampled", Some(format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))).await?;
    ensure!(response.status() == 200, "{}", response.status());
    let echo: serde_json::Value = response.json().await?;
    let (trace_id, parent_id, sampled) = received_traceparent(&echo)?;
    assert_eq!((trace_id.as_str(), sampled.as_str()), (CLIENT_TRACE, "01"));
    let got = collector.span("sampled").await?;
    assert_eq!(hex::encode(&got.span.trace_id), CLIENT_TRACE);
    assert_eq!(hex::encode(&got.span.parent_span_id), CLIENT_SPAN);
    assert_eq!(hex::encode(&got.span.span_id), parent_id, "the span the upstream was told is its parent");
    assert_eq!(got.resource.get("service.name").map(String::as_str), Some("edge-standalone"));
    assert_eq!(got.resource.get("service.instance.id").map(String::as_str), Some("standalone"));
    assert_eq!(got.attribute("sluice.api").as_deref(), Some("shop"));
    assert_eq!(got.attribute("sluice.upstream.target"), Some(format!("http://{backend}")));
    // Spans leave in order: the warm-up and unsampled requests, sent before, made none.
    let ids: Vec<Option<String>> = collector.spans().iter().map(|s| s.attribute("sluice.request_id")).collect();
    assert_eq!(ids, [Some("sampled".to_string())]);
    Ok(())
}
