//! Admin tokens with roles, against a real `sluice-cp`: a read-only token
//! made with `sluice-cp tokens create` reads everything but is refused (403)
//! on every write route the OpenAPI document lists; named admin tokens made
//! through `/v1/tokens` write, and the history names the token of each
//! write; revoked tokens are refused; failed authentications are logged with
//! the client's address and an address that keeps failing is refused.

use anyhow::{Context, Result, ensure};
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{ADMIN_TOKEN, Admin, binary, control_plane_with};

/// `sluice-cp tokens ...` on the control plane's database in `dir`.
fn tokens(dir: &std::path::Path, args: &[&str]) -> Result<String> {
    let output = std::process::Command::new(binary("sluice-cp"))
        .args(["--database-url", &format!("sqlite://{}", dir.join("sluice.db").display()), "--secret-key-file"])
        .arg(dir.join("secret.key"))
        .arg("tokens")
        .args(args)
        .output()?;
    ensure!(output.status.success(), "tokens {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8(output.stdout)?)
}

#[tokio::test]
async fn a_read_only_token_reads_and_is_refused_on_every_write_route() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cp = control_plane_with(dir.path(), &[]).await?;
    let base = format!("http://{}", cp.addr("admin_addr")?);
    let admin = Admin::new(cp.addr("admin_addr")?);
    admin.create_upstream("u", "127.0.0.1:9001".parse()?).await?;
    let reader = tokens(dir.path(), &["create", "dashboards", "--role", "read-only"])?.trim().to_string();
    let as_reader = Admin::with_token(cp.addr("admin_addr")?, &reader);
    ensure!(reader.len() >= 40, "a generated token: {reader:?}");
    let version = admin.latest_version().await?;

    let document: Value = reqwest::get(format!("{base}/openapi.json")).await?.json().await?;
    let (mut refused, mut read) = (Vec::new(), 0);
    for (path, item) in document["paths"].as_object().context("paths")? {
        let url = path.replace("{name}", "u").replace("{version}", "1");
        for (method, _) in item.as_object().into_iter().flatten() {
            let Ok(method) = method.to_ascii_uppercase().parse::<Method>() else { continue };
            let (status, body) = as_reader.send(method.clone(), &url, Some(json!({}))).await?;
            let write = method != Method::GET || path.starts_with("/v1/tokens");
            let public = ["/healthz", "/readyz", "/openapi.json"].contains(&path.as_str());
            if write && !public {
                ensure!(status == 403, "{method} {path}: {status} {body}");
                ensure!(body["type"] == "https://sluice.dev/problems/forbidden", "{method} {path}: {body}");
                ensure!(body["detail"].as_str().is_some_and(|d| d.contains("dashboards")), "{body}");
                refused.push(format!("{method} {path}"));
            } else {
                ensure!(!matches!(status, 401 | 403), "{method} {path}: a read was refused: {status} {body}");
                read += 1;
            }
        }
    }
    // Five collections (create, replace, patch, delete), config import, rollback, tokens (list, create, revoke).
    ensure!(refused.len() >= 25, "write routes found in the document: {refused:?}");
    ensure!(read >= 10, "reads: {read}");
    ensure!(admin.latest_version().await? == version, "a refused write changed the configuration");
    let listed = tokens(dir.path(), &["list"])?;
    ensure!(listed.contains("dashboards") && listed.contains("read-only"), "{listed}");
    Ok(())
}

#[tokio::test]
async fn the_history_names_the_token_of_each_write_and_revoked_tokens_are_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cp = control_plane_with(dir.path(), &[]).await?;
    let base = format!("http://{}", cp.addr("admin_addr")?);
    let admin = Admin::new(cp.addr("admin_addr")?);
    admin.create_upstream("backend", "127.0.0.1:9001".parse()?).await?;

    let (status, created) =
        admin.send(Method::POST, "/v1/tokens", Some(json!({ "name": "deployer", "role": "admin" }))).await?;
    ensure!(status == 201 && created["created_by"] == "admin-token", "{status} {created}");
    let deployer = created["token"].as_str().context("the token, once")?.to_string();
    let (status, _) =
        admin.send(Method::POST, "/v1/tokens", Some(json!({ "name": "deployer", "role": "admin" }))).await?;
    ensure!(status == 409, "a second token of the same name: {status}");
    let (status, _) =
        admin.send(Method::POST, "/v1/tokens", Some(json!({ "name": "admin-token", "role": "admin" }))).await?;
    ensure!(status == 422, "the startup token's name is reserved: {status}");

    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "upstreams:\n  - name: backend\n    targets: [{ url: \"http://127.0.0.1:9001\" }]\napis:\n  - name: shop\n    path_prefix: /shop\n    upstream: backend\n",
    )?;
    let apply = std::process::Command::new(binary("sluice"))
        .args(["--admin-url", &base, "--admin-token", &deployer, "apply", "-f"])
        .arg(&config)
        .output()?;
    ensure!(apply.status.success(), "apply: {}", String::from_utf8_lossy(&apply.stderr));

    let history = admin.ok(Method::GET, "/v1/snapshots", None).await?;
    let items = history["items"].as_array().context("items")?;
    ensure!(items[0]["author"] == "deployer" && items[0]["note"] == "import: +apis/shop", "{}", items[0]);
    ensure!(items[1]["author"] == "admin-token" && items[1]["note"] == "create upstream backend", "{}", items[1]);
    let shown = std::process::Command::new(binary("sluice"))
        .args(["--admin-url", &base, "--admin-token", ADMIN_TOKEN, "history"])
        .output()?;
    let shown = String::from_utf8_lossy(&shown.stdout);
    ensure!(shown.contains("deployer") && shown.contains("import: +apis/shop"), "{shown}");

    let listed = admin.ok(Method::GET, "/v1/tokens", None).await?;
    ensure!(listed["items"][0]["name"] == "deployer" && listed["items"][0].get("token").is_none(), "{listed}");
    let (status, _) = admin.send(Method::DELETE, "/v1/tokens/deployer", None).await?;
    ensure!(status == 204, "revoke: {status}");
    let (status, body) =
        Admin::with_token(cp.addr("admin_addr")?, &deployer).send(Method::GET, "/v1/apis", None).await?;
    ensure!(status == 401, "a revoked token: {status} {body}");
    let (status, _) = admin.send(Method::DELETE, "/v1/tokens/deployer", None).await?;
    ensure!(status == 404, "revoking twice: {status}");
    Ok(())
}

#[tokio::test]
async fn failed_authentications_are_logged_with_the_address_and_limited() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cp = control_plane_with(dir.path(), &[]).await?;
    let base = format!("http://{}", cp.addr("admin_addr")?);
    for attempt in 0..10 {
        let (status, _) = Admin::with_token(cp.addr("admin_addr")?, &format!("guess-{attempt}"))
            .send(Method::GET, "/v1/apis", None)
            .await?;
        ensure!(status == 401, "attempt {attempt}: {status}");
    }
    cp.wait_for_log("admin API authentication failed").await?;
    ensure!(cp.stderr().contains("\"client\":\"127.0.0.1:"), "the client's address is logged: {}", cp.stderr());
    ensure!(!cp.stderr().contains("guess-"), "a presented token was logged");
    // Refused now, even with the right token, without it being looked at.
    let response = reqwest::Client::new().get(format!("{base}/v1/apis")).bearer_auth(ADMIN_TOKEN).send().await?;
    ensure!(response.status() == 429, "{}", response.status());
    let retry = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    ensure!(retry.is_some_and(|s| (1..=60).contains(&s)), "Retry-After: {retry:?}");
    // Probes stay open to everyone.
    ensure!(reqwest::get(format!("{base}/healthz")).await?.status() == 200, "healthz");
    Ok(())
}
