//! Process lifecycle of `sluice-dp`: the address line, ops endpoints, and
//! graceful shutdown on SIGTERM.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::fake_cp::{FakeControlPlane, snapshot};
use crate::support::{DataPlane, Upstream, client, metric_sum};

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
    assert!(metric_sum(&text, "sluice_sync_connected").is_some(), "{text}");
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
    // The request is in flight before the signal.
    dp.wait_metric("sluice_upstream_active_connections", 1.0).await?;
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

#[tokio::test]
async fn client_connections_are_split_evenly_across_the_workers() -> Result<()> {
    let upstream = Upstream::start("echo").await?;
    let mut cp = FakeControlPlane::start().await?;
    let dp = DataPlane::start(&cp.url(), &["--worker-threads", "2"]).await?;
    let mut conn = cp.accept().await?;
    conn.push(snapshot(1, &[upstream.url()])).await?;
    conn.ack().await?;

    // Twenty clients, each keeping its one connection open, opened at once.
    let clients: Vec<reqwest::Client> = (0..20).map(|_| client()).collect();
    let sent = clients.iter().enumerate().map(|(i, c)| c.get(dp.url(&format!("/items/{i}"))).send());
    for response in futures_util::future::join_all(sent).await {
        assert_eq!(response?.status().as_u16(), 200);
    }
    let open = |text: &str, worker: u8| metric_sum(text, &format!("sluice_open_connections{{worker=\"{worker}\"}}"));
    let text = client().get(dp.ops_url("/metrics")).send().await?.text().await?;
    let (first, second) = (open(&text, 0).unwrap_or(-1.0), open(&text, 1).unwrap_or(-1.0));
    assert_eq!(first + second, 20.0, "{text}");
    assert!((first - second).abs() <= 3.0, "split {first}/{second}");

    drop(clients);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = client().get(dp.ops_url("/metrics")).send().await?.text().await?;
        if open(&text, 0) == Some(0.0) && open(&text, 1) == Some(0.0) {
            return Ok(());
        }
        assert!(Instant::now() < deadline, "closed connections still counted:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn proxy_workers_all_serve_and_sigterm_drops_requests_past_the_grace() -> Result<()> {
    let upstream = Upstream::start("slow").await?;
    let mut cp = FakeControlPlane::start().await?;
    let mut dp = DataPlane::start(&cp.url(), &["--worker-threads", "3"]).await?;
    let mut conn = cp.accept().await?;
    conn.push(snapshot(1, &[upstream.url()])).await?;
    conn.ack().await?;

    // A client per request: each connection goes to whichever worker accepts it.
    for i in 0..12 {
        let response = client().get(dp.url(&format!("/items/{i}"))).send().await?;
        assert_eq!(response.status().as_u16(), 200, "request {i}");
    }
    // Reused upstream connections stay with their worker; a keep-alive
    // client on one connection is answered every time.
    let keep_alive = client();
    for i in 0..20 {
        assert_eq!(keep_alive.get(dp.url(&format!("/again/{i}"))).send().await?.status().as_u16(), 200);
    }
    assert!(dp.process.stderr().contains("\"proxy_workers\":3"), "stderr:\n{}", dp.process.stderr());

    // Past the 5 s grace, what is still in flight is dropped and the process exits.
    let stuck = tokio::spawn(client().get(dp.url("/slow?delay_ms=30000")).send());
    dp.wait_metric("sluice_upstream_active_connections", 1.0).await?;
    let started = Instant::now();
    dp.process.terminate()?;
    let status = tokio::time::timeout(Duration::from_secs(15), dp.process.child.wait()).await??;
    let took = started.elapsed();
    assert!(status.success(), "exit status {status:?}; stderr:\n{}", dp.process.stderr());
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(9),
        "shutdown took {took:?}; stderr:\n{}",
        dp.process.stderr()
    );
    let dropped = stuck.await?.expect_err("a request past the grace gets no answer");
    assert!(!dropped.is_timeout(), "the connection closes at the grace, not at the client's timeout: {dropped}");
    assert!(dp.process.stderr().contains("grace period over"), "stderr:\n{}", dp.process.stderr());
    Ok(())
}
