//! TLS between the planes and on the admin API, set up as an operator would
//! with `sluice certs init`: data planes sync over mutual TLS, and everything
//! that should not get in is refused at the handshake (plain HTTP/2, no client
//! certificate, the wrong CA); an `https://` URL never falls back to
//! cleartext; replaced certificate files are served without a restart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{Admin, Process, all_applied, binary, control_plane_with, data_plane_at, eventually, upstream};

/// `sluice certs init --dir DIR`; returns the directory.
fn certs_init(dir: &Path) -> Result<PathBuf> {
    let output = std::process::Command::new(binary("sluice")).args(["certs", "init", "--dir"]).arg(dir).output()?;
    ensure!(output.status.success(), "certs init: {}", String::from_utf8_lossy(&output.stderr));
    Ok(dir.to_owned())
}

fn file(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// The flags of a data plane that trusts `ca_dir`'s CA and presents `identity_dir`'s client certificate.
fn dp_tls(ca_dir: &Path, identity_dir: Option<&Path>) -> Vec<String> {
    let mut flags = vec!["--control-plane-ca".to_string(), file(ca_dir, "ca.pem")];
    if let Some(dir) = identity_dir {
        flags.extend([
            "--client-cert".into(),
            file(dir, "data-plane.pem"),
            "--client-key".into(),
            file(dir, "data-plane-key.pem"),
        ]);
    }
    flags
}

async fn dp(url: &str, node_id: &str, flags: &[String]) -> Result<Process> {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    data_plane_at(url, node_id, &flags).await
}

/// A first configuration version for the data planes to apply.
async fn configure(admin: &Admin) -> Result<u64> {
    let (_upstream, addr) = upstream("u", "127.0.0.1:0").await?;
    admin.create_upstream("u", addr).await?;
    admin.latest_version().await
}

async fn node_ids(admin: &Admin) -> Result<Vec<String>> {
    Ok(admin.data_planes().await?.iter().filter_map(|n| n["node_id"].as_str().map(str::to_owned)).collect())
}

#[tokio::test]
async fn data_planes_sync_over_mutual_tls_and_nothing_else_gets_in() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = certs_init(&dir.path().join("pki"))?;
    let cp = control_plane_with(
        dir.path(),
        &[
            "--grpc-tls-cert",
            &file(&pki, "control-plane.pem"),
            "--grpc-tls-key",
            &file(&pki, "control-plane-key.pem"),
            "--grpc-client-ca",
            &file(&pki, "ca.pem"),
        ],
    )
    .await?;
    ensure!(cp.first_line["grpc_tls"] == true, "{}", cp.first_line);
    let admin = Admin::new(cp.addr("admin_addr")?);
    let grpc = cp.addr("grpc_addr")?;
    let url = format!("https://{grpc}");

    // The CA and a client certificate from `certs init`: the node syncs.
    let version = configure(&admin).await?;
    let good = dp(&url, "dp-mtls", &dp_tls(&pki, Some(&pki))).await?;
    eventually("the mTLS data plane to apply the configuration", || all_applied(&admin, version, 1))
        .await
        .with_context(|| good.stderr())?;

    // Plain HTTP/2 (the gRPC preface in clear) gets no HTTP/2 answer: at
    // most a TLS alert, then the connection is closed.
    let mut plain = tokio::net::TcpStream::connect(grpc).await?;
    plain.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut answer))
        .await
        .context("the TLS port kept a plain HTTP/2 connection open")??;
    ensure!(answer.is_empty() || answer[0] == 0x15, "a plain HTTP/2 client got {answer:02x?}");
    // A data plane told `http://` for the TLS port stays out too.
    let cleartext = dp(&format!("http://{grpc}"), "dp-cleartext", &[]).await?;
    cleartext.wait_for_log("sync with control plane failed").await?;

    // Mutual TLS without a client certificate: refused at the handshake.
    let no_cert = dp(&url, "dp-no-cert", &dp_tls(&pki, None)).await?;
    no_cert.wait_for_log("the control plane requires a client certificate").await?;
    cp.wait_for_log("peer sent no certificates").await?;

    // Another CA than the one that signed the control plane's certificate:
    // the data plane says which setting is wrong.
    let other = certs_init(&dir.path().join("other-pki"))?;
    let wrong_ca = dp(&url, "dp-wrong-ca", &dp_tls(&other, Some(&pki))).await?;
    wrong_ca.wait_for_log("does not verify against --control-plane-ca").await?;
    ensure!(wrong_ca.stderr().contains("\"level\":\"ERROR\""), "{}", wrong_ca.stderr());
    // A client certificate of another CA is refused by the control plane.
    let foreign_client = dp(&url, "dp-foreign-cert", &dp_tls(&pki, Some(&other))).await?;
    foreign_client.wait_for_log("the control plane refused the client certificate").await?;
    cp.wait_for_log("invalid peer certificate").await?;

    ensure!(node_ids(&admin).await? == ["dp-mtls"], "only the good node registered: {:?}", node_ids(&admin).await?);
    Ok(())
}

#[tokio::test]
async fn an_https_url_never_falls_back_to_cleartext() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = certs_init(&dir.path().join("pki"))?;
    let cp = control_plane_with(dir.path(), &[]).await?;
    let admin = Admin::new(cp.addr("admin_addr")?);
    let grpc = cp.addr("grpc_addr")?;

    // The control plane speaks h2c only: an https:// data plane fails its
    // handshake and does not try cleartext instead.
    let node = dp(&format!("https://{grpc}"), "dp-https", &dp_tls(&pki, None)).await?;
    node.wait_for_log("TLS handshake with the control plane").await?;
    ensure!(node_ids(&admin).await?.is_empty(), "nodes: {:?}", node_ids(&admin).await?);

    // TLS files with an http:// URL are a mistake caught at start-up.
    let refused = dp(&format!("http://{grpc}"), "dp-confused", &dp_tls(&pki, None)).await;
    let error = format!("{:#}", refused.err().context("a data plane with TLS files and http:// started")?);
    ensure!(error.contains("only apply to an https:// control plane URL"), "{error}");

    // Cleartext beyond loopback is allowed but said out loud.
    let remote = dp("http://sluice-cp.invalid:9090", "dp-remote", &[]).await?;
    remote.wait_for_log("the sync channel is not encrypted").await?;
    Ok(())
}

#[tokio::test]
async fn rotated_certificate_files_are_picked_up_without_restart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let first = certs_init(&dir.path().join("first"))?;
    let live = dir.path().join("live");
    std::fs::create_dir(&live)?;
    let install = |pki: &Path| -> Result<()> {
        // As certificate tools do: write beside, then rename over.
        for (from, to) in
            [("control-plane.pem", "cert.pem"), ("control-plane-key.pem", "key.pem"), ("ca.pem", "client-ca.pem")]
        {
            std::fs::copy(pki.join(from), live.join(format!("{to}.new")))?;
            std::fs::rename(live.join(format!("{to}.new")), live.join(to))?;
        }
        Ok(())
    };
    install(&first)?;
    let cp = control_plane_with(
        dir.path(),
        &[
            "--grpc-tls-cert",
            &file(&live, "cert.pem"),
            "--grpc-tls-key",
            &file(&live, "key.pem"),
            "--grpc-client-ca",
            &file(&live, "client-ca.pem"),
        ],
    )
    .await?;
    let admin = Admin::new(cp.addr("admin_addr")?);
    let url = format!("https://{}", cp.addr("grpc_addr")?);
    let version = configure(&admin).await?;
    let _before = dp(&url, "dp-first", &dp_tls(&first, Some(&first))).await?;
    eventually("the first CA's node to sync", || all_applied(&admin, version, 1)).await?;

    let second = certs_init(&dir.path().join("second"))?;
    install(&second)?;
    cp.wait_for_log("TLS certificate reloaded").await?;
    let after = dp(&url, "dp-second", &dp_tls(&second, Some(&second))).await?;
    eventually("the second CA's node to sync", || async {
        node_ids(&admin).await.is_ok_and(|ids| ids.contains(&"dp-second".to_string()))
    })
    .await
    .with_context(|| after.stderr())?;
    // A new connection that trusts only the first CA no longer verifies the server.
    let stale = dp(&url, "dp-stale", &dp_tls(&first, Some(&first))).await?;
    stale.wait_for_log("does not verify against --control-plane-ca").await?;
    Ok(())
}

#[tokio::test]
async fn the_admin_api_serves_https_and_the_cli_follows() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = certs_init(&dir.path().join("pki"))?;
    let cp = control_plane_with(
        dir.path(),
        &[
            "--admin-tls-cert",
            &file(&pki, "control-plane.pem"),
            "--admin-tls-key",
            &file(&pki, "control-plane-key.pem"),
        ],
    )
    .await?;
    ensure!(cp.first_line["admin_tls"] == true, "{}", cp.first_line);
    let addr = cp.addr("admin_addr")?;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(pki.join("ca.pem"))?)?;
    let https = reqwest::Client::builder().add_root_certificate(ca).build()?;
    let health = https.get(format!("https://{addr}/healthz")).send().await?;
    ensure!(health.status() == 200, "{}", health.status());
    ensure!(reqwest::get(format!("http://{addr}/healthz")).await.is_err(), "the admin API answered in clear");

    let history = std::process::Command::new(binary("sluice"))
        .args(["--admin-url", &format!("https://{addr}"), "--admin-ca", &file(&pki, "ca.pem")])
        .args(["--admin-token", crate::support::ADMIN_TOKEN, "-o", "json", "history"])
        .output()?;
    ensure!(history.status.success(), "sluice history over https: {}", String::from_utf8_lossy(&history.stderr));
    Ok(())
}
