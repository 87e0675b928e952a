//! Two control planes on one PostgreSQL database, one data plane on each: a
//! write on either replica reaches both data planes (the writer's
//! `pg_notify` wakes the other replica's LISTEN, which pushes to its own
//! nodes), and either replica shows every node, since node records live in
//! the shared database.

use std::net::SocketAddr;

use anyhow::{Context, Result, ensure};
use reqwest::Method;
use serde_json::json;
use sluice_testkit::control_plane_args;
use sluice_testkit::postgres::FreshDatabase;

use crate::support::{ADMIN_TOKEN, Admin, CLUSTER_TOKEN, Process, data_plane, eventually, served_by, spawn, upstream};

/// Every replica must share this key: each one seals and opens the same
/// JWT secrets and private keys in the shared database.
const SECRET_KEY: &str = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";

async fn replica(database_url: &str) -> Result<Process> {
    spawn("sluice-cp", &control_plane_args(database_url, "127.0.0.1:0", ADMIN_TOKEN, CLUSTER_TOKEN, SECRET_KEY)).await
}

async fn latest(admin: &Admin) -> Result<u64> {
    let page = admin.ok(Method::GET, "/v1/snapshots?limit=1", None).await?;
    page["items"][0]["version"].as_u64().context("no version")
}

async fn both_serve(client: &reqwest::Client, proxies: &[SocketAddr], path: &str) -> Result<()> {
    for proxy in proxies {
        let url = format!("http://{proxy}{path}");
        eventually(&format!("{url} served"), || async { served_by(client, &url).await.is_ok() }).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_write_on_either_control_plane_reaches_every_data_plane() -> Result<()> {
    let Some(database) = FreshDatabase::create("replicas").await? else { return Ok(()) };
    two_replicas(&database.url).await
}

async fn two_replicas(database_url: &str) -> Result<()> {
    let (cp_a, cp_b) = (replica(database_url).await?, replica(database_url).await?);
    let (admin_a, admin_b) = (Admin::new(cp_a.addr("admin_addr")?), Admin::new(cp_b.addr("admin_addr")?));
    let dp_a = data_plane(cp_a.addr("grpc_addr")?, "dp-a").await?;
    let dp_b = data_plane(cp_b.addr("grpc_addr")?, "dp-b").await?;
    let proxies = [dp_a.addr("http_addr")?, dp_b.addr("http_addr")?];
    let (_backend, backend) = upstream("backend", "127.0.0.1:0").await?;
    let client = reqwest::Client::new();

    // Written on A: served by B's data plane too.
    let pool = json!({ "name": "pool", "targets": [{ "url": format!("http://{backend}") }] });
    admin_a.ok(Method::POST, "/v1/upstreams", Some(pool)).await?;
    let one = json!({ "name": "one", "path_prefix": "/one", "upstream": "pool" });
    admin_a.ok(Method::POST, "/v1/apis", Some(one)).await?;
    both_serve(&client, &proxies, "/one/x").await?;

    // Written on B, including a secret sealed by B that A must open when it
    // builds the next snapshot: served by A's data plane too.
    let consumer = json!({ "username": "svc", "jwt": [{ "key": "svc", "algorithm": "HS256", "secret": "s3cr3t-s3cr3t-s3cr3t-s3cr3t-0123" }] });
    admin_b.ok(Method::POST, "/v1/consumers", Some(consumer)).await?;
    let two = json!({ "name": "two", "path_prefix": "/two", "upstream": "pool" });
    admin_b.ok(Method::POST, "/v1/apis", Some(two)).await?;
    both_serve(&client, &proxies, "/two/x").await?;
    let three = json!({ "name": "three", "path_prefix": "/three", "upstream": "pool", "policies": [{ "jwt": {} }] });
    admin_a.ok(Method::POST, "/v1/apis", Some(three)).await?;
    for proxy in &proxies {
        let url = format!("http://{proxy}/three/x");
        eventually("the JWT API on every node", || async { served_by(&client, &url).await == Err(401) }).await?;
    }

    // Both replicas agree on the latest version, and each lists both nodes
    // running it.
    let version = latest(&admin_a).await?;
    ensure!(latest(&admin_b).await? == version, "replicas disagree on the latest version");
    for admin in [&admin_a, &admin_b] {
        eventually("both nodes on the latest version, seen from each replica", || async {
            let Ok(nodes) = admin.ok(Method::GET, "/v1/data-planes", None).await else { return false };
            let items = nodes["items"].as_array().cloned().unwrap_or_default();
            let ids: Vec<&str> = items.iter().filter_map(|n| n["node_id"].as_str()).collect();
            ids == ["dp-a", "dp-b"] && items.iter().all(|n| n["applied_version"].as_u64() == Some(version))
        })
        .await?;
    }
    Ok(())
}
