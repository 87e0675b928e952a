//! One control plane, two data planes, three upstreams: what an operator sees
//! when running Sluice as a cluster.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use anyhow::{Result, ensure};
use reqwest::Method;
use serde_json::json;

use crate::support::{Admin, control_plane, data_plane, eventually, served_by, upstream};

async fn spread(client: &reqwest::Client, url: &str, requests: usize) -> Result<BTreeMap<String, usize>> {
    let mut counts = BTreeMap::new();
    for _ in 0..requests {
        match served_by(client, url).await {
            Ok(server) => *counts.entry(server).or_default() += 1,
            Err(status) => anyhow::bail!("request {url} failed with {status}"),
        }
    }
    Ok(counts)
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(name, n)| (name.to_string(), *n)).collect()
}

#[tokio::test]
async fn two_data_planes_route_balance_and_follow_changes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cp = control_plane(dir.path()).await?;
    let admin = Admin::new(cp.addr("admin_addr")?);
    let grpc = cp.addr("grpc_addr")?;
    let (_u1, a1) = upstream("u1", "127.0.0.1:0").await?;
    let (_u2, a2) = upstream("u2", "127.0.0.1:0").await?;
    let (mut u3, a3) = upstream("u3", "127.0.0.1:0").await?;
    let nodes = [data_plane(grpc, "dp-a").await?, data_plane(grpc, "dp-b").await?];
    let proxies: Vec<SocketAddr> = nodes.iter().map(|n| n.addr("http_addr")).collect::<Result<_>>()?;
    let client = reqwest::Client::new();

    let target = |addr: SocketAddr, weight: u32| json!({ "url": format!("http://{addr}"), "weight": weight });
    admin
        .ok(
            Method::POST,
            "/v1/upstreams",
            Some(json!({
                "name": "pool",
                "targets": [target(a1, 1), target(a2, 1), target(a3, 1)],
                "health_check": { "path": "/health", "interval": "100ms", "timeout": "200ms",
                                  "healthy_threshold": 1, "unhealthy_threshold": 1 },
            })),
        )
        .await?;
    admin.create_api("svc", "/svc", "pool").await?;

    // The API created through the admin API is served by both nodes.
    for proxy in &proxies {
        let url = format!("http://{proxy}/svc/hello");
        eventually("the API on every data plane", || async { served_by(&client, &url).await.is_ok() }).await?;
    }

    // Round robin spreads evenly on each node.
    for proxy in &proxies {
        let seen = spread(&client, &format!("http://{proxy}/svc/rr"), 30).await?;
        ensure!(seen == counts(&[("u1", 10), ("u2", 10), ("u3", 10)]), "round robin on {proxy}: {seen:?}");
    }

    // Weights hold.
    admin
        .ok(
            Method::PATCH,
            "/v1/upstreams/pool",
            Some(json!({
                "balance": "weighted_round_robin", "targets": [target(a1, 1), target(a2, 2), target(a3, 3)],
            })),
        )
        .await?;
    let version = admin.ok(Method::GET, "/v1/snapshots?limit=1", None).await?["items"][0]["version"].as_u64();
    eventually("both nodes on the weighted version", || async {
        let nodes = admin.ok(Method::GET, "/v1/data-planes", None).await.unwrap_or_default();
        let items = nodes["items"].as_array().cloned().unwrap_or_default();
        items.len() == 2 && items.iter().all(|n| n["applied_version"].as_u64() == version && n["connected"] == true)
    })
    .await?;
    for proxy in &proxies {
        let seen = spread(&client, &format!("http://{proxy}/svc/w"), 60).await?;
        ensure!(seen == counts(&[("u1", 10), ("u2", 20), ("u3", 30)]), "weights on {proxy}: {seen:?}");
    }

    // A killed upstream is ejected by health checks: every request still succeeds.
    u3.kill().await?;
    let url = format!("http://{}/svc/k", proxies[0]);
    eventually("u3 ejected", || async {
        let mut only_live = true;
        for _ in 0..12 {
            only_live &= matches!(served_by(&client, &url).await.as_deref(), Ok("u1" | "u2"));
        }
        only_live
    })
    .await?;
    let seen = spread(&client, &url, 30).await?;
    ensure!(!seen.contains_key("u3") && seen.values().sum::<usize>() == 30, "after the kill: {seen:?}");

    // ... and re-admitted once it is back on the same address.
    let (_u3_again, _) = upstream("u3", &a3.to_string()).await?;
    eventually("u3 re-admitted", || async {
        let mut back = false;
        for _ in 0..12 {
            back |= served_by(&client, &url).await.as_deref() == Ok("u3");
        }
        back
    })
    .await?;

    // Each node is visible on the control plane with the version it runs.
    let listed = admin.ok(Method::GET, "/v1/data-planes", None).await?;
    let ids: Vec<&str> =
        listed["items"].as_array().into_iter().flatten().filter_map(|n| n["node_id"].as_str()).collect();
    ensure!(ids == ["dp-a", "dp-b"], "data planes: {listed}");

    // A change is live on every node, and traffic keeps flowing once the control plane is gone.
    admin.create_api("late", "/late", "pool").await?;
    for proxy in &proxies {
        let url = format!("http://{proxy}/late/x");
        eventually("the new API on every node", || async { served_by(&client, &url).await.is_ok() }).await?;
    }
    cp.kill().await?;
    for proxy in &proxies {
        for path in ["/svc/after", "/late/after"] {
            let served = served_by(&client, &format!("http://{proxy}{path}")).await;
            ensure!(served.is_ok(), "{proxy}{path} after the control plane died: {served:?}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn an_invalid_change_is_refused_and_nothing_is_pushed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cp = control_plane(dir.path()).await?;
    let admin = Admin::new(cp.addr("admin_addr")?);
    let before = admin.ok(Method::GET, "/v1/snapshots?limit=1", None).await?["items"][0]["version"].clone();
    let (status, problem) = admin
        .send(Method::POST, "/v1/apis", Some(json!({ "name": "orphan", "path_prefix": "/o", "upstream": "missing" })))
        .await?;
    ensure!(status == 422, "status {status}: {problem}");
    ensure!(problem["errors"].to_string().contains("/upstream"), "{problem}");
    let after = admin.ok(Method::GET, "/v1/snapshots?limit=1", None).await?["items"][0]["version"].clone();
    ensure!(before == after, "version moved from {before} to {after}");
    Ok(())
}
