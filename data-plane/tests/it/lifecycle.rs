//! Process lifecycle of `sluice-dp`: the address line, ops endpoints, and
//! graceful shutdown on SIGTERM.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::fake_cp::{FakeControlPlane, snapshot};
use crate::support::{DataPlane, Upstream, client, metric_value};

#[tokio::test]
async fn ops_endpoints_answer_before_any_snapshot() -> Result<()> {
    let cp = FakeControlPlane::start().await?;
    let dp = DataPlane::start(&cp.url(), &[]).await?;
    assert!(dp.node_id.len() > 7, "generated node id: {}", dp.node_id);
    assert_eq!(client().get(dp.ops_url("/healthz")).send().await?.status().as_u16(), 200);
    assert_eq!(dp.ready_status().await?, 503);
    let metrics = client().get(dp.ops_url("/metrics")).send().await?;
    assert_eq!(metrics.status().as_u16(), 200);
    let text = metrics.text().await?;
    assert!(metric_value(&text, "sluice_sync_connected").is_some(), "{text}");
    Ok(())
}

#[tokio::test]
async fn sigterm_finishes_in_flight_requests_then_exits() -> Result<()> {
    let upstream = Upstream::start("slow").await?;
    let mut cp = FakeControlPlane::start().await?;
    let mut dp = DataPlane::start(&cp.url(), &[]).await?;
    let mut conn = cp.accept().await?;
    conn.push(snapshot(1, &[upstream.url()])).await?;
    conn.ack().await?;

    let slow = tokio::spawn(client().get(dp.url("/slow?delay_ms=1000")).send());
    // Let the request reach the upstream before the signal.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    dp.process.terminate()?;

    let response = slow.await??;
    assert_eq!(response.status().as_u16(), 200, "in-flight request must finish");
    let status = tokio::time::timeout(Duration::from_secs(10), dp.process.child.wait()).await??;
    assert!(status.success(), "exit status {status:?}; stderr:\n{}", dp.process.stderr());
    assert!(started.elapsed() < Duration::from_secs(5), "shutdown took {:?}", started.elapsed());
    // No longer accepting.
    assert!(client().get(dp.url("/after")).send().await.is_err());
    Ok(())
}
