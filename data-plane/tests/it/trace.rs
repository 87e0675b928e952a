//! Distributed tracing with a real `sluice-dp`, `sluice-test-upstream` (which
//! echoes the headers it received) and the testkit's OTLP collector in the
//! test, which keeps every span.

use std::time::Duration;

use anyhow::{Context, Result};
use opentelemetry_proto::tonic::trace::v1::{span, status};
use serde_json::Value;
use sluice_proto::v1;
use sluice_proto::v1::policy::Kind;
use sluice_testkit::otlp::Collector;

use crate::policies::{HMAC_KEY, hmac_hex};
use crate::support::{DataPlane, Upstream, api, client, eventually, send, unused_addr};

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// The upstream's `traceparent`, split: (trace id, parent id, flags).
fn received_traceparent(echo: &Value) -> Result<(String, String, String)> {
    let header = echo["headers"]["traceparent"].as_str().context("the upstream got no traceparent")?;
    let parts: Vec<&str> = header.split('-').collect();
    anyhow::ensure!(parts.len() == 4 && parts[0] == "00", "{header}");
    Ok((parts[1].to_owned(), parts[2].to_owned(), parts[3].to_owned()))
}

fn snapshot(echo: &Upstream, dead: String) -> Result<v1::Snapshot> {
    let upstream = |name: &str, url: String| v1::Upstream {
        name: name.into(),
        targets: vec![v1::Target { url, weight: 1 }],
        ..Default::default()
    };
    let api_key = Kind::ApiKey(v1::ApiKeyAuth { header: "x-api-key".into(), query_param: String::new() });
    Ok(v1::Snapshot {
        version: 1,
        apis: vec![api("shop", "/shop", "backend", vec![api_key]), api("down", "/down", "dead", vec![])],
        upstreams: vec![upstream("backend", echo.url()), upstream("dead", dead)],
        consumers: vec![v1::Consumer {
            username: "ann".into(),
            api_key_digests: vec![hmac_hex("ann-key")?],
            ..Default::default()
        }],
        api_key_hmac_key: HMAC_KEY.to_vec(),
        ..Default::default()
    })
}

#[tokio::test]
async fn spans_continue_the_clients_trace_parent_the_upstream_and_reach_the_collector() -> Result<()> {
    let (collector, collector_addr) = Collector::start().await?;
    let echo = Upstream::start("echo").await?;
    let endpoint = format!("http://{collector_addr}");
    let flags = ["--otlp-endpoint", &endpoint, "--service-name", "edge-test", "--node-id", "dp-trace"];
    let (_cp, dp) = DataPlane::running(snapshot(&echo, format!("http://{}", unused_addr().await?))?, &flags).await?;
    let c = client();

    // The client's sampled trace is continued: same trace, the client's span as parent.
    let incoming = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let (status, _, body) = send(
        c.get(dp.url("/shop/items?secret=1"))
            .header("traceparent", &incoming)
            .header("tracestate", "vendor=opaque")
            .header("x-api-key", "ann-key")
            .header("x-request-id", "traced-1"),
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    let (trace_id, parent_id, sampled) = received_traceparent(&body)?;
    assert_eq!((trace_id.as_str(), sampled.as_str()), (CLIENT_TRACE, "01"));
    assert_ne!(parent_id, CLIENT_SPAN, "the upstream's parent is the gateway's span, not the client's");
    assert_eq!(body["headers"]["tracestate"], "vendor=opaque");

    let got = collector.span("traced-1").await?;
    let span = &got.span;
    assert_eq!(hex::encode(&span.trace_id), CLIENT_TRACE);
    assert_eq!(hex::encode(&span.parent_span_id), CLIENT_SPAN);
    assert_eq!(hex::encode(&span.span_id), parent_id, "the span the upstream was told is its parent");
    assert_eq!(span.kind, span::SpanKind::Server as i32);
    assert_eq!(span.name, "GET /shop");
    assert_eq!(span.trace_state, "vendor=opaque");
    assert!(span.end_time_unix_nano >= span.start_time_unix_nano && span.start_time_unix_nano > 0);
    assert_eq!(span.status.as_ref().map(|s| s.code), Some(status::StatusCode::Unset as i32));
    for (key, want) in [
        ("http.request.method", "GET".to_string()),
        ("url.path", "/shop/items".into()),
        ("url.scheme", "http".into()),
        ("http.route", "/shop".into()),
        ("http.response.status_code", "200".into()),
        ("sluice.api", "shop".into()),
        ("sluice.consumer", "ann".into()),
        ("sluice.upstream", "backend".into()),
        ("sluice.upstream.target", echo.url()),
        ("sluice.upstream.status_code", "200".into()),
        ("client.address", "127.0.0.1".into()),
        ("network.protocol.version", "1.1".into()),
    ] {
        assert_eq!(got.attribute(key).as_deref(), Some(want.as_str()), "{key} in {:?}", span.attributes);
    }
    assert!(!format!("{:?}", span.attributes).contains("secret"), "never the query");
    assert_eq!(got.resource.get("service.name").map(String::as_str), Some("edge-test"));
    assert_eq!(got.resource.get("service.instance.id").map(String::as_str), Some("dp-trace"));

    // No context (or a malformed one): a new trace, which the upstream continues under the gateway's span.
    for (request_id, traceparent) in [("traced-new", None), ("traced-bad", Some("00-xyz-01"))] {
        let mut request = c.get(dp.url("/shop/new")).header("x-api-key", "ann-key").header("x-request-id", request_id);
        if let Some(value) = traceparent {
            request = request.header("traceparent", value).header("tracestate", "dropped=1");
        }
        let (status, _, body) = send(request).await?;
        assert_eq!(status, 200);
        let (trace_id, parent_id, sampled) = received_traceparent(&body)?;
        assert_eq!(sampled, "01", "sampled at the default ratio of 1");
        assert!(body["headers"]["tracestate"].is_null(), "{request_id}: the state of a refused context goes");
        let span = collector.span(request_id).await?.span;
        assert_eq!((hex::encode(&span.trace_id), hex::encode(&span.span_id)), (trace_id, parent_id));
        assert!(span.parent_span_id.is_empty(), "{request_id}: a root span");
    }

    // Refusals and failures are traced too: no upstream for a 401 or a 404, an error status for a 502.
    let (status, _, _) = send(c.get(dp.url("/shop/x")).header("x-request-id", "traced-401")).await?;
    assert_eq!(status, 401);
    let refused = collector.span("traced-401").await?;
    assert_eq!(refused.attribute("http.response.status_code").as_deref(), Some("401"));
    assert_eq!(refused.attribute("sluice.upstream.target"), None);
    assert_eq!(refused.span.status.as_ref().map(|s| s.code), Some(status::StatusCode::Unset as i32));
    let (status, _, _) = send(c.get(dp.url("/nowhere")).header("x-request-id", "traced-404")).await?;
    assert_eq!(status, 404);
    let unrouted = collector.span("traced-404").await?;
    assert_eq!((unrouted.span.name.as_str(), unrouted.attribute("sluice.api")), ("GET", None));
    let (status, _, _) = send(c.get(dp.url("/down/x")).header("x-request-id", "traced-502")).await?;
    assert_eq!(status, 502);
    let failed = collector.span("traced-502").await?;
    assert_eq!(failed.span.status.as_ref().map(|s| s.code), Some(status::StatusCode::Error as i32));
    assert_eq!(failed.attribute("error.type").as_deref(), Some("502"));

    // A client's unsampled trace is propagated but not recorded.
    let unsampled = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-00");
    let request = c.get(dp.url("/shop/quiet")).header("traceparent", unsampled).header("x-api-key", "ann-key");
    let (status, _, body) = send(request.header("x-request-id", "untraced")).await?;
    assert_eq!(status, 200);
    let (trace_id, parent_id, sampled) = received_traceparent(&body)?;
    assert_eq!((trace_id.as_str(), sampled.as_str()), (CLIENT_TRACE, "00"));
    assert_ne!(parent_id, CLIENT_SPAN);
    // Spans leave in order: once a later one is in, the unsampled one would have been.
    let (status, _, _) = send(c.get(dp.url("/nowhere")).header("x-request-id", "traced-after")).await?;
    assert_eq!(status, 404);
    collector.span("traced-after").await?;
    let spans = collector.spans();
    assert!(spans.iter().all(|s| s.attribute("sluice.request_id").as_deref() != Some("untraced")));
    assert_eq!(collector.count(), 7, "one span per sampled request");
    assert_eq!(dp.metric("sluice_trace_spans_exported_total").await?, Some(7.0));
    Ok(())
}

#[tokio::test]
async fn without_an_endpoint_trace_headers_pass_untouched() -> Result<()> {
    let echo = Upstream::start("echo").await?;
    let (_cp, dp) = DataPlane::running(snapshot(&echo, format!("http://{}", unused_addr().await?))?, &[]).await?;
    let incoming = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let request = client().get(dp.url("/shop/x")).header("x-api-key", "ann-key");
    let (status, _, body) = send(request.header("traceparent", &incoming).header("tracestate", "v=1")).await?;
    assert_eq!(status, 200);
    assert_eq!(body["headers"]["traceparent"], incoming.as_str());
    assert_eq!(body["headers"]["tracestate"], "v=1");
    // Nor does a request without one get one.
    let (_, _, body) = send(client().get(dp.url("/shop/y")).header("x-api-key", "ann-key")).await?;
    assert!(body["headers"]["traceparent"].is_null(), "{body}");
    assert_eq!(dp.metric("sluice_trace_spans_exported_total").await?, None);
    Ok(())
}

#[tokio::test]
async fn a_collector_that_is_down_costs_requests_nothing() -> Result<()> {
    let echo = Upstream::start("echo").await?;
    let nowhere = format!("http://{}", unused_addr().await?);
    let snapshot = snapshot(&echo, nowhere.clone())?;
    let (_cp, dp) = DataPlane::running(snapshot, &["--otlp-endpoint", &nowhere, "--access-log", "off"]).await?;
    let c = client();
    for i in 0..20 {
        let started = std::time::Instant::now();
        let (status, _, body) = send(c.get(dp.url(&format!("/shop/{i}"))).header("x-api-key", "ann-key")).await?;
        assert_eq!(status, 200);
        assert!(started.elapsed() < Duration::from_secs(2), "request {i} waited for the collector");
        received_traceparent(&body)?;
    }
    // The batches failed, were counted and dropped.
    let dropped = || async {
        let text = client().get(dp.ops_url("/metrics")).send().await.ok()?.text().await.ok()?;
        let line =
            text.lines().find(|l| l.starts_with("sluice_trace_spans_dropped_total{reason=\"export_failed\"}"))?;
        line.rsplit_once(' ')?.1.parse::<f64>().ok()
    };
    let all = || async { dropped().await == Some(20.0) };
    eventually("20 spans dropped", Duration::from_millis(100), all).await?;
    dp.process.wait_for_log("span export failed").await?;
    Ok(())
}
