//! What keeps traffic flowing while the configuration changes or the control
//! plane fails: swaps under load, refused and NACKed snapshots, control-plane restarts and
//! the snapshot cache, all through the real binaries.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use reqwest::Method;
use serde_json::{Value, json};

use sluice_testkit::sim_node::{Faults, Pushed, SimNode, SimOptions};

use crate::support::{
    Admin, CLUSTER_TOKEN, Cluster, WAIT, all_applied, control_plane, control_plane_on, data_plane, data_plane_with,
    eventually, eventually_every, metric_sum, served_by, upstream,
};

/// Fine polling where the test measures or paces by how soon a change lands.
const POLL: Duration = Duration::from_millis(5);

/// A `headers` policy that stamps every response with `x-gen: <generation>`,
/// so each update is a new snapshot and a client can tell which table served it.
fn stamped(generation: u32) -> Value {
    json!([{ "headers": { "response": { "set": { "x-gen": generation.to_string() } } } }])
}

/// One client loop: requests back to back until `stop`, returning the
/// generations it saw and every failure.
async fn hammer(client: reqwest::Client, url: String, stop: Arc<AtomicBool>) -> (usize, BTreeSet<String>, Vec<String>) {
    let (mut ok, mut generations, mut failures) = (0, BTreeSet::new(), Vec::new());
    while !stop.load(Ordering::Relaxed) {
        match client.get(&url).send().await {
            Ok(response) if response.status() == 200 => {
                if let Some(generation) = response.headers().get("x-gen").and_then(|v| v.to_str().ok()) {
                    generations.insert(generation.to_owned());
                }
                match response.bytes().await {
                    Ok(_) => ok += 1,
                    Err(e) => failures.push(format!("body: {e}")),
                }
            }
            Ok(response) => failures.push(format!("status {}", response.status())),
            Err(e) => failures.push(format!("send: {e}")),
        }
    }
    (ok, generations, failures)
}

#[tokio::test]
async fn swaps_under_load_drop_nothing_and_in_flight_requests_finish_on_the_old_table() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let Cluster { cp: _cp, admin, upstream: _u1, backend: a1, dp } = Cluster::start(dir.path(), "dp-load").await?;
    let proxy = dp.addr("http_addr")?;
    let client = reqwest::Client::builder().timeout(WAIT).build()?;

    admin.create_upstream("pool", a1).await?;
    admin
        .ok(
            Method::POST,
            "/v1/apis",
            Some(json!({ "name": "svc", "path_prefix": "/svc", "upstream": "pool", "policies": stamped(0) })),
        )
        .await?;
    let url = format!("http://{proxy}/svc/load");
    eventually("the API on the data plane", || async { served_by(&client, &url).await.is_ok() }).await?;

    // A few concurrent client loops, each on its own keep-alive connection,
    // while the API changes 100 times.
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for _ in 0..4 {
        let own = reqwest::Client::builder().timeout(WAIT).build()?;
        loops.push(tokio::spawn(hammer(own, url.clone(), stop.clone())));
    }
    // Each update waits until the node applied it: the control plane
    // coalesces bursts of writes into one push, and this test wants 100 real
    // swaps under load, not a handful.
    for generation in 1..=100 {
        admin.ok(Method::PATCH, "/v1/apis/svc", Some(json!({ "policies": stamped(generation) }))).await?;
        let version = admin.latest_version().await?;
        eventually_every("the update applied", POLL, || all_applied(&admin, version, 1)).await?;
    }
    // Served by the final table, as seen by a client.
    let response = client.get(&url).send().await?;
    ensure!(response.headers().get("x-gen").is_some_and(|v| v == "100"), "final headers: {:?}", response.headers());
    stop.store(true, Ordering::Relaxed);

    let (mut ok, mut generations, mut failures) = (0, BTreeSet::new(), Vec::new());
    for handle in loops {
        let (n, seen, failed) = tokio::time::timeout(WAIT, handle).await.context("client loop hung")??;
        ok += n;
        generations.extend(seen);
        failures.extend(failed);
    }
    ensure!(
        failures.is_empty(),
        "{} of {} requests failed during swaps: {:?}",
        failures.len(),
        ok + failures.len(),
        failures
    );
    // The load really overlapped the swaps: clients saw many of the tables.
    ensure!(generations.len() > 10, "{ok} requests saw only generations {generations:?}");
    eprintln!("swap under load: {ok} requests, 0 failures, {} generations seen", generations.len());

    // A slow request started before a swap that removes its route completes on
    // the old table; one sent after the swap gets 404.
    admin.create_api("slow", "/slow", "pool").await?;
    let slow_url = format!("http://{proxy}/slow/x");
    eventually("the slow API", || async { served_by(&client, &slow_url).await.is_ok() }).await?;
    // 2 s upstream delay: ample time for the swap to land while the request is in flight.
    let slow = tokio::spawn(client.get(format!("{slow_url}?delay_ms=2000")).send());
    let metrics_url = format!("http://{}/metrics", dp.addr("ops_addr")?);
    eventually("the slow request in flight", || async {
        let Ok(response) = client.get(&metrics_url).send().await else { return false };
        let text = response.text().await.unwrap_or_default();
        metric_sum(&text, "sluice_upstream_active_connections") == Some(1.0)
    })
    .await?;
    admin.ok(Method::DELETE, "/v1/apis/slow", None).await?;
    eventually("the slow API removed", || async { served_by(&client, &slow_url).await == Err(404) }).await?;
    ensure!(!slow.is_finished(), "the slow request finished before the swap; the test proves nothing");
    let response = tokio::time::timeout(WAIT, slow).await.context("slow request hung")???;
    ensure!(response.status() == 200, "in-flight request across the swap: {}", response.status());
    let echo: Value = response.json().await?;
    ensure!(echo["path"] == "/slow/x", "{echo}");
    Ok(())
}

/// A spec whose request body schema has a `pattern` that is not a regular
/// expression: every data plane would refuse to compile it.
fn spec_with_a_bad_pattern() -> Value {
    let content = json!({
        "openapi": "3.0.3",
        "info": { "title": "bad pattern", "version": "1" },
        "paths": { "/bad/items": { "post": {
            "requestBody": { "content": { "application/json": { "schema": { "type": "string", "pattern": "([" } } } },
            "responses": { "200": { "description": "ok" } },
        } } },
    });
    json!({ "name": "bad-pattern", "content": content.to_string() })
}

/// What a data plane of this version would refuse, the control plane refuses
/// first (422 naming the place, nothing committed). A NACK is left for
/// version skew: a simulated data plane of another build refuses an API the
/// real one takes; the real one moves on, the other stays on the newest
/// version it can take, also after a restart without a cache, and is not
/// sent the refused version again.
#[tokio::test]
async fn what_a_data_plane_would_refuse_is_422_and_a_version_skew_nack_is_parked() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let Cluster { cp, admin, upstream: _u1, backend: a1, dp } = Cluster::start(dir.path(), "dp-nack").await?;
    let client = reqwest::Client::builder().timeout(WAIT).build()?;

    admin.create_upstream("pool", a1).await?;
    admin.create_api("svc", "/svc", "pool").await?;
    let url = format!("http://{}/svc/x", dp.addr("http_addr")?);
    eventually("the API on the data plane", || async { served_by(&client, &url).await.is_ok() }).await?;
    let good = admin.latest_version().await?;
    eventually("the good version applied", || all_applied(&admin, good, 1)).await?;

    let (status, problem) = admin
        .send(
            Method::POST,
            "/v1/upstreams",
            Some(json!({
                "name": "bad-tls",
                "targets": [{ "url": "https://127.0.0.1:9" }],
                "tls": { "ca_bundle": "not a PEM bundle" },
            })),
        )
        .await?;
    ensure!(status == 422, "a bad CA bundle: {status} {problem}");
    ensure!(problem["errors"][0]["pointer"] == "/upstreams/bad-tls/tls/ca_bundle", "{problem}");
    ensure!(admin.latest_version().await? == good, "the refused write made a snapshot");

    // A spec no API validates with is never compiled by a data plane, so it
    // is taken; binding it is refused, at the schema's place in the spec.
    admin.ok(Method::POST, "/v1/specs", Some(spec_with_a_bad_pattern())).await?;
    let good = admin.latest_version().await?;
    let (status, problem) = admin
        .send(
            Method::POST,
            "/v1/apis",
            Some(json!({
                "name": "bad", "path_prefix": "/bad", "upstream": "pool",
                "openapi": { "spec": "bad-pattern", "validate_requests": true },
            })),
        )
        .await?;
    ensure!(status == 422, "an API validating with a spec whose pattern is not a regex: {status} {problem}");
    let pointer = "/specs/bad-pattern/content/paths/~1bad~1items/post/requestBody/content/application~1json/schema";
    ensure!(problem["errors"][0]["pointer"] == pointer, "{problem}");
    ensure!(problem["errors"][0]["detail"].as_str().is_some_and(|d| d.contains("API `bad`")), "{problem}");
    ensure!(admin.latest_version().await? == good, "the refused API made a snapshot");
    eventually("the spec's version applied", || all_applied(&admin, good, 1)).await?;

    // A data plane of another build that cannot take an API named `newer`.
    let grpc = format!("http://{}", cp.addr("grpc_addr")?);
    let mut options = SimOptions::new(grpc, CLUSTER_TOKEN, "dp-other-build");
    options.software_version = "other-build".into();
    options.heartbeat = Duration::from_millis(300);
    let other = SimNode::start(options)?;
    other.set_faults(Faults {
        refuse: Some(Arc::new(|pushed: &Pushed| {
            let snapshot = pushed.decode().ok()?;
            snapshot.apis.iter().any(|api| api.name == "newer").then(|| "unknown field in API `newer`".to_owned())
        })),
        ..Faults::default()
    });
    eventually("both nodes on the good version", || all_applied(&admin, good, 2)).await?;
    admin
        .ok(Method::POST, "/v1/apis", Some(json!({ "name": "newer", "path_prefix": "/newer", "upstream": "pool" })))
        .await?;
    let bad = admin.latest_version().await?;
    ensure!(bad > good, "the API made no snapshot");
    let newer_url = format!("http://{}/newer/x", dp.addr("http_addr")?);
    eventually("the real data plane serves the new API", || async { served_by(&client, &newer_url).await.is_ok() })
        .await?;
    let other_row = || async {
        let nodes = admin.data_planes().await.unwrap_or_default();
        nodes.into_iter().find(|n| n["node_id"] == "dp-other-build").unwrap_or_default()
    };
    eventually("the NACK on /v1/data-planes", || async {
        other_row().await["last_nack_version"].as_u64() == Some(bad)
    })
    .await?;
    let row = other_row().await;
    let error = row["last_error"].as_str().unwrap_or_default();
    ensure!(error.contains("newer"), "NACK reason: {row}");
    ensure!(row["applied_version"].as_u64() == Some(good), "the other build moved off the good version: {row}");

    // Restarted without a cache, it asks again and gets the newest version
    // it can take, not the one it refused.
    other.restart_without_cache();
    let state = other
        .wait_until(WAIT, |s| s.connected && s.running.as_ref().is_some_and(|(version, _)| *version == good))
        .await?;
    ensure!(state.refused.len() == 1, "the refused snapshot was sent again: {state:?}");
    eventually("the other build shown on the good version again", || async {
        other_row().await["applied_version"].as_u64() == Some(good)
    })
    .await?;
    ensure!(other.state().refused.len() == 1, "the refused snapshot was sent again: {:?}", other.state());

    // A newer snapshot both can take is accepted everywhere and clears the error.
    admin.ok(Method::DELETE, "/v1/apis/newer", None).await?;
    let fixed = admin.latest_version().await?;
    eventually("the fixed version applied", || all_applied(&admin, fixed, 2)).await?;
    let row = other_row().await;
    ensure!(row["last_error"].is_null(), "the error stayed after a good snapshot: {row}");
    let served = served_by(&client, &url).await;
    ensure!(served.as_deref() == Ok("u1"), "the real data plane: {served:?}");
    Ok(())
}

/// Posts an API on `/<name>` and times how long until every node serves it.
async fn timed_rollout(
    admin: &Admin,
    client: &reqwest::Client,
    proxies: &[SocketAddr],
    name: &str,
) -> Result<Duration> {
    admin
        .ok(
            Method::POST,
            "/v1/apis",
            Some(json!({ "name": name, "path_prefix": format!("/{name}"), "upstream": "pool" })),
        )
        .await?;
    let written = Instant::now();
    for proxy in proxies {
        let url = format!("http://{proxy}/{name}/x");
        eventually_every("the new API on every node", POLL, || async { served_by(client, &url).await.is_ok() }).await?;
    }
    Ok(written.elapsed())
}

#[tokio::test]
async fn data_planes_survive_a_control_plane_restart_and_a_cached_node_serves_while_it_is_down() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cache = dir.path().join("dp-b.snapshot");
    let cache_arg = cache.to_str().context("temp path")?;
    let mut cp = control_plane(dir.path()).await?;
    let admin = Admin::new(cp.addr("admin_addr")?);
    let grpc = cp.addr("grpc_addr")?;
    let (_u1, a1) = upstream("u1", "127.0.0.1:0").await?;
    let dp_a = data_plane(grpc, "dp-a").await?;
    let mut dp_b = data_plane_with(grpc, "dp-b", &["--snapshot-cache", cache_arg]).await?;
    let client = reqwest::Client::builder().timeout(WAIT).build()?;

    admin.create_upstream("pool", a1).await?;
    let proxies = [dp_a.addr("http_addr")?, dp_b.addr("http_addr")?];
    let rollout = timed_rollout(&admin, &client, &proxies, "svc").await?;
    eprintln!("convergence (admin write -> both nodes serving): {rollout:?}");
    let version = admin.latest_version().await?;
    eventually("both nodes on the version", || all_applied(&admin, version, 2)).await?;
    eventually("dp-b's snapshot cache written", || async { std::fs::metadata(&cache).is_ok_and(|m| m.len() > 0) })
        .await?;

    // The control plane dies: both nodes keep serving.
    cp.kill().await?;
    for proxy in proxies {
        for _ in 0..5 {
            let served = served_by(&client, &format!("http://{proxy}/svc/down")).await;
            ensure!(served.is_ok(), "{proxy} with the control plane down: {served:?}");
        }
    }

    // dp-b restarts while the control plane is still down: it serves from its cache.
    dp_b.kill().await?;
    let dp_b = data_plane_with(grpc, "dp-b", &["--snapshot-cache", cache_arg]).await?;
    let ops = dp_b.addr("ops_addr")?;
    eventually("the restarted dp-b ready from its cache", || async {
        client.get(format!("http://{ops}/readyz")).send().await.is_ok_and(|r| r.status() == 200)
    })
    .await?;
    let proxies = [proxies[0], dp_b.addr("http_addr")?];
    let served = served_by(&client, &format!("http://{}/svc/cached", proxies[1])).await;
    ensure!(served.as_deref() == Ok("u1"), "dp-b from its cache: {served:?}");

    // The control plane comes back on the same gRPC port with the same database:
    // both nodes reconnect and converge on a write made after the restart.
    let cp = control_plane_on(dir.path(), &grpc.to_string()).await?;
    let admin = Admin::new(cp.addr("admin_addr")?);
    eventually("both nodes reconnected", || all_applied(&admin, version, 2)).await?;
    let rollout = timed_rollout(&admin, &client, &proxies, "after").await?;
    eprintln!("convergence after the control plane restart: {rollout:?}");
    let newest = admin.latest_version().await?;
    ensure!(newest > version, "the write after the restart made no new version");
    eventually("both nodes on the newest version", || all_applied(&admin, newest, 2)).await?;
    for proxy in proxies {
        for path in ["/svc/y", "/after/y"] {
            let served = served_by(&client, &format!("http://{proxy}{path}")).await;
            ensure!(served.is_ok(), "{proxy}{path} after the restart: {served:?}");
        }
    }
    Ok(())
}
