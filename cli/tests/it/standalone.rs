//! `sluice standalone` on a fresh directory, driven by the `sluice` CLI the way
//! DESIGN.md's example config describes: apply, traffic, export, re-apply.

use anyhow::{Context, Result, ensure};
use tokio::process::Command;

use crate::support::{ADMIN_TOKEN, binary, design_example, eventually, standalone, upstream};

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
