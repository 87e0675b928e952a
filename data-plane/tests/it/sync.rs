//! Sync between a real `sluice-dp` and a fake control plane: Hello, Ack/Nack,
//! same-hash no-op, readiness, heartbeats, reconnects, and the snapshot cache.

use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use sluice_proto::v1::{Api, Snapshot};

use crate::fake_cp::{FakeControlPlane, seal, snapshot};
use crate::support::{DataPlane, Upstream, client, unused_addr};

/// Sends GET `path` through the data plane and returns (status, echo JSON if any).
async fn get(dp: &DataPlane, path: &str) -> Result<(u16, Value)> {
    let response = client().get(dp.url(path)).send().await?;
    let status = response.status().as_u16();
    let body = response.text().await?;
    Ok((status, serde_json::from_str(&body).unwrap_or(Value::String(body))))
}

/// Same API and upstream as `snapshot`, plus an API whose upstream does not
/// exist: the data plane cannot compile it.
fn broken_snapshot(version: u64, upstream_url: &str) -> Snapshot {
    let mut broken = snapshot(version, &[upstream_url.to_owned()]);
    broken.apis.push(Api {
        name: "orphan".into(),
        path_prefix: "/orphan".into(),
        upstream: "no-such-upstream".into(),
        ..Default::default()
    });
    seal(broken)
}

#[tokio::test]
async fn hello_ack_same_hash_and_nack() -> Result<()> {
    let upstream = Upstream::start("alpha").await?;
    let mut cp = FakeControlPlane::start().await?;
    let dp = DataPlane::start(&cp.url(), &["--cluster-token", "s3cret", "--node-id", "node-a"]).await?;
    assert_eq!(dp.node_id, "node-a");

    let mut conn = cp.accept().await?;
    assert_eq!(conn.authorization.as_deref(), Some("Bearer s3cret"));
    assert_eq!(conn.hello.node_id, "node-a");
    assert_eq!(conn.hello.protocol_version, sluice_proto::PROTOCOL_VERSION);
    assert_eq!(conn.hello.software_version, env!("CARGO_PKG_VERSION"));
    assert!(!conn.hello.hostname.is_empty());
    assert_eq!(conn.hello.proxy_addresses, vec![dp.http_addr.to_string()]);
    assert_eq!((conn.hello.current_version, conn.hello.current_hash.as_str()), (0, ""));

    // Nothing applied yet: alive but not ready.
    assert_eq!(client().get(dp.ops_url("/healthz")).send().await?.status().as_u16(), 200);
    assert_eq!(dp.ready_status().await?, 503);

    let good = snapshot(1, &[upstream.url()]);
    conn.push(good.clone()).await?;
    let ack = conn.ack().await?;
    assert_eq!((ack.version, ack.hash.as_str()), (1, good.hash.as_str()));
    assert_eq!(dp.ready_status().await?, 200);
    let (status, echo) = get(&dp, "/hello?x=1").await?;
    assert_eq!(status, 200, "{echo}");
    assert_eq!(echo["server"], "alpha");
    assert_eq!(echo["path"], "/hello");
    dp.wait_metric("sluice_snapshot_swaps_total", 1.0).await?;
    dp.wait_metric("sluice_sync_connected", 1.0).await?;

    // Same content under a newer version: Acked, nothing swapped, and the
    // node now reports the newer version.
    let mut same = good.clone();
    same.version = 2;
    conn.push(same).await?;
    let ack = conn.ack().await?;
    assert_eq!((ack.version, ack.hash.as_str()), (2, good.hash.as_str()));
    assert_eq!(dp.metric("sluice_snapshot_swaps_total").await?, Some(1.0));
    dp.wait_metric("sluice_snapshot_version", 2.0).await?;

    // A snapshot that does not compile: Nacked with the reason; the old table keeps serving.
    let broken = broken_snapshot(3, &upstream.url());
    conn.push(broken.clone()).await?;
    let nack = conn.nack().await?;
    assert_eq!((nack.version, nack.hash.as_str()), (3, broken.hash.as_str()));
    assert!(nack.error.contains("no-such-upstream"), "reason should name the missing upstream: {}", nack.error);
    let (status, echo) = get(&dp, "/still-here").await?;
    assert_eq!(status, 200, "{echo}");
    assert_eq!(echo["server"], "alpha");
    assert_eq!(dp.metric("sluice_snapshot_swaps_total").await?, Some(1.0));
    assert_eq!(dp.metric("sluice_snapshot_rejects_total").await?, Some(1.0));

    // Heartbeats carry what is actually served (version 2), not the Nacked one.
    let heartbeat = conn.heartbeat().await?;
    assert_eq!((heartbeat.current_version, heartbeat.current_hash.as_str()), (2, good.hash.as_str()));

    // A snapshot whose hash does not match its content is refused too.
    let mut tampered = snapshot(4, &[upstream.url()]);
    tampered.apis[0].path_prefix = "/changed".into();
    conn.push(tampered).await?;
    let nack = conn.nack().await?;
    assert!(nack.error.contains("hash"), "{}", nack.error);
    Ok(())
}

#[tokio::test]
async fn reconnects_after_control_plane_restart() -> Result<()> {
    let upstream = Upstream::start("beta").await?;
    let mut cp = FakeControlPlane::start().await?;
    let addr = cp.addr;
    let dp = DataPlane::start(&cp.url(), &[]).await?;

    let mut conn = cp.accept().await?;
    let first = snapshot(1, &[upstream.url()]);
    conn.push(first.clone()).await?;
    conn.ack().await?;

    // The control plane goes away: traffic keeps flowing on the last table.
    drop(conn);
    cp.stop().await;
    dp.wait_metric("sluice_sync_connected", 0.0).await?;
    let (status, _) = get(&dp, "/during-outage").await?;
    assert_eq!(status, 200);

    // It comes back on the same address: the node reconnects by itself and
    // says which snapshot it already serves.
    let mut cp = FakeControlPlane::start_on(addr, None).await?;
    let mut conn = cp.accept().await?;
    assert_eq!(conn.hello.current_hash, first.hash);
    assert_eq!(conn.hello.current_version, 1);
    dp.wait_metric("sluice_sync_connected", 1.0).await?;

    let mut second = snapshot(2, &[upstream.url()]);
    second.apis[0].path_prefix = "/v2".into();
    let second = seal(second);
    conn.push(second.clone()).await?;
    let ack = conn.ack().await?;
    assert_eq!((ack.version, ack.hash), (2, second.hash));
    assert_eq!(get(&dp, "/v2/x").await?.0, 200);
    assert_eq!(get(&dp, "/x").await?.0, 404);
    dp.process.wait_for_log("sync with control plane failed").await?;
    Ok(())
}

#[tokio::test]
async fn restarted_node_serves_from_snapshot_cache_without_control_plane() -> Result<()> {
    let upstream = Upstream::start("gamma").await?;
    let dir = tempfile::tempdir()?;
    let cache = dir.path().join("snapshot.pb");
    let cache_arg = cache.to_str().context("utf-8 path")?;

    let mut cp = FakeControlPlane::start().await?;
    let cached = ["--snapshot-cache", cache_arg, "--cluster-token", "cache-token"];
    let dp = DataPlane::start(&cp.url(), &cached).await?;
    let mut conn = cp.accept().await?;
    conn.push(snapshot(5, &[upstream.url()])).await?;
    conn.ack().await?;
    // The cache is written before the Ack.
    assert!(cache.exists());
    drop(dp);
    drop(conn);
    cp.stop().await;

    // No control plane at all now.
    let nowhere = format!("http://{}", unused_addr().await?);
    let dp = DataPlane::start(&nowhere, &cached).await?;
    // Ready at once, from the cache, before any control plane answered.
    assert_eq!(dp.ready_status().await?, 200);
    let (status, echo) = get(&dp, "/from-cache").await?;
    assert_eq!(status, 200, "{echo}");
    assert_eq!(echo["server"], "gamma");
    assert_eq!(dp.metric("sluice_snapshot_version").await?, Some(5.0));
    assert_eq!(dp.metric("sluice_sync_connected").await?, Some(0.0));
    drop(dp);

    // Another cluster token cannot open it: ignored, with a warning, not served.
    let other = DataPlane::start(&nowhere, &["--snapshot-cache", cache_arg, "--cluster-token", "other-token"]).await?;
    other.process.wait_for_log("written with another cluster token").await?;
    assert_eq!(other.ready_status().await?, 503);
    assert_eq!(get(&other, "/from-cache").await?.0, 503, "no routing table, nothing served from the cache");
    Ok(())
}

#[tokio::test]
async fn corrupt_snapshot_cache_is_ignored() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cache = dir.path().join("snapshot.pb");
    std::fs::write(&cache, b"definitely not a snapshot")?;
    let nowhere = format!("http://{}", unused_addr().await?);
    let cached = ["--snapshot-cache", cache.to_str().context("utf-8 path")?, "--cluster-token", "t"];
    let dp = DataPlane::start(&nowhere, &cached).await?;
    dp.process.wait_for_log("ignoring unusable snapshot cache").await?;
    assert_eq!(client().get(dp.ops_url("/healthz")).send().await?.status().as_u16(), 200);
    assert_eq!(dp.ready_status().await?, 503);
    Ok(())
}

#[tokio::test]
async fn refused_stream_is_logged_with_the_reason_and_retried() -> Result<()> {
    let mut cp = FakeControlPlane::start_with_token("right").await?;
    let dp = DataPlane::start(&cp.url(), &["--cluster-token", "wrong"]).await?;
    dp.process.wait_for_log("invalid cluster token").await?;
    dp.process.wait_for_log("sync with control plane refused").await?;
    // Refused streams never reach the test.
    assert!(tokio::time::timeout(Duration::from_millis(300), cp.accept()).await.is_err());
    assert_eq!(dp.metric("sluice_sync_connected").await?, Some(0.0));
    Ok(())
}

/// Heartbeats carry each API's requests since the previous one (every request counted once over the
/// heartbeats, 5xx answers as errors, each in a latency bucket) and each target's health.
#[tokio::test]
async fn heartbeats_report_traffic_and_target_health() -> Result<()> {
    use sluice_proto::v1::TargetState;

    let upstream = Upstream::start("alpha").await?;
    let down = format!("http://{}", unused_addr().await?);
    let mut s = snapshot(1, &[upstream.url(), down.clone()]);
    s.upstreams[0].passive_health_check = Some(sluice_proto::v1::PassiveHealthCheck {
        consecutive_failures: 1,
        ejection_ms: 60_000,
        unhealthy_statuses: vec![],
    });
    let s = seal(s);
    let mut cp = FakeControlPlane::start().await?;
    let dp = DataPlane::start(&cp.url(), &["--cluster-token", "s3cret"]).await?;
    let mut conn = cp.accept().await?;
    conn.push(s).await?;
    conn.ack().await?;

    // Round robin over the two targets: the dead one fails a request (a 502) and is ejected; the
    // others go to the live one.
    let mut statuses = Vec::new();
    for i in 0..10 {
        let query = if i < 4 { "" } else { "?status=503" };
        statuses.push(get(&dp, &format!("/item{query}")).await?.0);
    }
    let failed = statuses.iter().filter(|status| **status >= 500).count() as u64;
    assert!(failed >= 6, "{statuses:?}");

    let (mut requests, mut errors, mut latency) = (0u64, 0u64, 0u64);
    let mut last = None;
    for _ in 0..50 {
        let beat = conn.heartbeat().await?;
        let traffic = beat.traffic.clone().context("no traffic summary")?;
        assert!(traffic.interval_ms > 0, "{traffic:?}");
        for api in traffic.apis {
            assert_eq!(api.api, "echo");
            assert_eq!(api.latency_buckets.len(), sluice_proto::telemetry::LATENCY_BUCKETS);
            requests += api.requests;
            errors += api.errors;
            latency += api.latency_buckets.iter().sum::<u64>();
        }
        last = Some(beat);
        if requests >= 10 {
            break;
        }
    }
    assert_eq!((requests, errors, latency), (10, failed, 10));
    let beat = last.context("no heartbeat")?;
    let mut targets: Vec<(String, TargetState)> = beat.targets.iter().map(|t| (t.url.clone(), t.state())).collect();
    targets.sort();
    let mut expected = vec![(upstream.url(), TargetState::Healthy), (down, TargetState::Ejected)];
    expected.sort();
    assert_eq!(targets, expected);
    assert!(beat.targets.iter().all(|t| t.upstream == "backend"));
    Ok(())
}
