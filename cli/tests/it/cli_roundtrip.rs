//! The operator's loop with the `sluice` CLI against `sluice standalone`:
//! apply DESIGN.md's example, export to a file, apply the export (no
//! changes), edit, dry-run (the diff, nothing changed), apply, roll back to
//! the earlier version (the export matches again), and `-o json` for every
//! command a script would parse.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use tokio::process::Command;

use crate::support::{ADMIN_TOKEN, binary, design_example, eventually, standalone, upstream};

struct Cli {
    admin_url: String,
}

impl Cli {
    /// Runs `sluice ARGS`, insisting on success; returns stdout.
    async fn ok(&self, args: &[&str]) -> Result<String> {
        let output = Command::new(binary("sluice"))
            .args(["--admin-url", &self.admin_url, "--admin-token", ADMIN_TOKEN])
            .args(args)
            .output()
            .await
            .context("running sluice")?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        ensure!(output.status.success(), "sluice {args:?}: {stdout}{}", String::from_utf8_lossy(&output.stderr));
        Ok(stdout)
    }

    async fn json(&self, args: &[&str]) -> Result<Value> {
        let mut all = vec!["-o", "json"];
        all.extend_from_slice(args);
        let out = self.ok(&all).await?;
        serde_json::from_str(&out).with_context(|| format!("sluice -o json {args:?} printed no JSON: {out}"))
    }

    async fn latest_version(&self) -> Result<u64> {
        self.json(&["status"]).await?["latest_snapshot"]["version"].as_u64().context("no latest version")
    }
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str().context("temp path")
}

#[tokio::test]
async fn export_apply_edit_dry_run_apply_rollback() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = standalone(dir.path()).await?;
    let cli = Cli { admin_url: server.first_line["admin_url"].as_str().context("admin_url")?.to_string() };
    let proxy_url = server.first_line["proxy_url"].as_str().context("proxy_url")?.to_string();
    let (_backend, backend) = upstream("backend", "127.0.0.1:0").await?;

    // Apply the example; the JSON answer says what changed.
    let example = design_example(dir.path(), &backend.to_string(), 2_000_000)?;
    let applied = cli.json(&["apply", "-f", path_str(&example)?]).await?;
    ensure!(applied["changed"] == true && applied["diff"]["apis"]["added"] == serde_json::json!(["shop"]), "{applied}");
    let v1 = cli.latest_version().await?;

    // Export to a file (YAML, and JSON) and apply each: nothing changes.
    let exported = cli.ok(&["export"]).await?;
    let export_file = dir.path().join("exported.yaml");
    std::fs::write(&export_file, &exported)?;
    let out = cli.ok(&["apply", "-f", path_str(&export_file)?]).await?;
    ensure!(out.contains("no changes") && out.contains(&format!("version {v1}")), "re-apply of the export: {out}");
    let exported_json = cli.json(&["export"]).await?;
    let json_file = dir.path().join("exported.json");
    std::fs::write(&json_file, serde_json::to_string_pretty(&exported_json)?)?;
    let again = cli.json(&["apply", "-f", path_str(&json_file)?]).await?;
    ensure!(again["changed"] == false, "re-apply of the JSON export: {again}");

    // Edit the export: a lower limit, one more API.
    let mut edited: Value = yaml_serde::from_str(&exported)?;
    let shop = &mut edited["apis"][0];
    ensure!(shop["policies"][1]["rate_limit"]["requests"] == 2_000_000, "the export's rate limit: {shop}");
    shop["policies"][1]["rate_limit"]["requests"] = 1000.into();
    let extra_api = serde_json::json!({ "name": "extra", "path_prefix": "/extra", "upstream": "shop-backend" });
    edited["apis"].as_array_mut().context("apis")?.push(extra_api);
    let edit_file = dir.path().join("edited.yaml");
    std::fs::write(&edit_file, yaml_serde::to_string(&edited)?)?;

    // A dry run shows the diff, field by field, and changes nothing.
    let out = cli.ok(&["apply", "--dry-run", "-f", path_str(&edit_file)?]).await?;
    ensure!(out.contains("~ apis/shop") && out.contains("+ apis/extra") && out.contains("dry run"), "dry run: {out}");
    ensure!(out.contains("2000000 -> 1000"), "the dry run names the changed field: {out}");
    ensure!(cli.latest_version().await? == v1, "a dry run made a version");
    let dry = cli.json(&["apply", "--dry-run", "-f", path_str(&edit_file)?]).await?;
    ensure!(dry["dry_run"] == true && dry["diff"]["apis"]["changed"] == serde_json::json!(["shop"]), "{dry}");

    // Apply the edit: a new version, live on the data plane.
    let out = cli.ok(&["apply", "-f", path_str(&edit_file)?]).await?;
    let v2 = cli.latest_version().await?;
    ensure!(v2 > v1 && out.contains(&format!("version {v2}")), "apply of the edit: {out}");
    let client = reqwest::Client::new();
    let extra = format!("{proxy_url}/extra/x");
    eventually("the new API served", || async { client.get(&extra).send().await.is_ok_and(|r| r.status() == 200) })
        .await?;

    // Roll back to the first version: the export is the first one again, and
    // the added API is gone from the data plane.
    let out = cli.ok(&["rollback", &v1.to_string()]).await?;
    ensure!(out.contains(&format!("version {v1}")), "rollback: {out}");
    ensure!(cli.json(&["export"]).await? == exported_json, "the rollback did not restore version {v1}");
    eventually("the added API gone", || async { client.get(&extra).send().await.is_ok_and(|r| r.status() == 404) })
        .await?;
    let again = cli.json(&["rollback", &v1.to_string()]).await?;
    ensure!(again["changed"] == false && again["rolled_back_to"] == v1, "second rollback: {again}");

    // The history names each version, for picking one to roll back to.
    let history = cli.ok(&["history"]).await?;
    ensure!(history.contains("VERSION") && history.contains(&v2.to_string()), "history: {history}");
    let history = cli.json(&["history"]).await?;
    ensure!(history["items"].as_array().is_some_and(|items| items.len() >= 3), "history: {history}");

    let status = cli.json(&["status"]).await?;
    ensure!(status["data_planes"][0]["node_id"] == "standalone", "status: {status}");
    Ok(())
}
