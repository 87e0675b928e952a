//! The admin subcommands: apply, export, status, rollback, validate.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use reqwest::Method;
use serde_json::Value;
use sluice_control_plane::model::Config;
use sluice_control_plane::prepare::prepare_config;
use sluice_control_plane::secrets::SecretBox;
use sluice_control_plane::snapshot::build_snapshot;
use sluice_control_plane::specs::{DEFAULT_MAX_SPEC_BYTES, SpecCache};

use crate::Output;
use crate::admin_client::AdminClient;

/// Reads a YAML or JSON config file and inlines each spec's `file:` (relative
/// to the config file) as `content`, which is what the admin API takes.
pub fn read_config_file(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut document: Value =
        yaml_serde::from_str(&text).with_context(|| format!("{} is not valid YAML or JSON", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    if let Some(specs) = document.get_mut("specs").and_then(Value::as_array_mut) {
        for spec in specs.iter_mut().filter_map(Value::as_object_mut) {
            if let Some(Value::String(file)) = spec.remove("file") {
                let spec_path = base.join(&file);
                let content = std::fs::read_to_string(&spec_path)
                    .with_context(|| format!("reading spec file {}", spec_path.display()))?;
                spec.insert("content".into(), Value::String(content));
            }
        }
    }
    Ok(document)
}

pub async fn apply(client: &AdminClient, file: &Path, dry_run: bool, output: Output) -> anyhow::Result<()> {
    let document = read_config_file(file)?;
    eprintln!("{} {} ...", if dry_run { "checking" } else { "applying" }, file.display());
    let path = if dry_run { "/v1/config?dry_run=true" } else { "/v1/config" };
    // The server names what changes; the changed fields are shown by comparing
    // the file with the configuration as it was before, so a reviewer sees
    // what the edit does. Taken first: after a real apply it is already gone.
    let before = match output {
        Output::Table => client.call(Method::GET, "/v1/config", None).await.ok(),
        Output::Json => None,
    };
    let result = client.call(Method::PUT, path, Some(&document)).await?;
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    let diff = result.get("diff").unwrap_or(&Value::Null);
    print_diff(diff, &document, before.as_ref());
    let version = result.get("version").and_then(Value::as_u64).unwrap_or_default();
    let changed = result.get("changed").and_then(Value::as_bool).unwrap_or(false);
    match (dry_run, changed) {
        (true, _) => println!("dry run: nothing was changed"),
        (false, true) => println!("applied: configuration is now version {version}"),
        (false, false) => println!("no changes: configuration stays at version {version}"),
    }
    Ok(())
}

fn print_diff(diff: &Value, wanted: &Value, current: Option<&Value>) {
    let mut any = false;
    for (kind, changes) in diff.as_object().into_iter().flatten() {
        for (verb, sign) in [("added", '+'), ("changed", '~'), ("removed", '-')] {
            for name in changes.get(verb).and_then(Value::as_array).into_iter().flatten() {
                let name = name.as_str().unwrap_or_default();
                println!("{sign} {kind}/{name}");
                any = true;
                if verb == "changed"
                    && let Some(current) = current
                {
                    for line in field_changes(kind, name, current, wanted) {
                        println!("    {line}");
                    }
                }
            }
        }
    }
    if !any {
        println!("(no differences)");
    }
}

/// `policies/1/rate_limit/requests: 2000000 -> 1000` for one resource, both
/// sides read through the config model so that defaults left out of a file
/// do not show as changes. Stored secret digests and read-only fields are left
/// out: a file holds the secret itself, so they always differ.
fn field_changes(kind: &str, name: &str, current: &Value, wanted: &Value) -> Vec<String> {
    let normalize = |document: &Value| -> Option<Value> {
        let config: Config = serde_json::from_value(document.clone()).ok()?;
        serde_json::to_value(config).ok()
    };
    let (Some(before), Some(after)) = (normalize(current), normalize(wanted)) else { return Vec::new() };
    let find = |document: &Value| -> BTreeMap<String, String> {
        let mut fields = BTreeMap::new();
        let resource = document[kind]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r.get("name").or_else(|| r.get("username")).and_then(Value::as_str) == Some(name));
        if let Some(resource) = resource {
            flatten("", resource, &mut fields);
        }
        fields
    };
    let (before, after) = (find(&before), find(&after));
    let hidden = |path: &str| {
        let last = path.rsplit('/').next().unwrap_or(path);
        last.ends_with("_hash")
            || last.ends_with("_digest")
            || last.ends_with("_sealed")
            || matches!(last, "openapi_version" | "title" | "subject" | "not_after")
    };
    let shown = |value: Option<&String>| match value {
        None => "(none)".to_string(),
        Some(v) if v.len() > 60 => format!("({} characters)", v.len()),
        Some(v) => v.clone(),
    };
    let mut paths: Vec<&String> = before.keys().chain(after.keys()).filter(|p| !hidden(p)).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter(|p| before.get(*p) != after.get(*p))
        .map(|p| format!("{p}: {} -> {}", shown(before.get(p)), shown(after.get(p))))
        .collect()
}

/// Leaves of a JSON value by `/`-joined path.
fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, String>) {
    let join = |key: &str| if prefix.is_empty() { key.to_string() } else { format!("{prefix}/{key}") };
    match value {
        Value::Object(map) if !map.is_empty() => map.iter().for_each(|(k, v)| flatten(&join(k), v, out)),
        Value::Array(items) if !items.is_empty() => {
            items.iter().enumerate().for_each(|(i, v)| flatten(&join(&i.to_string()), v, out));
        }
        Value::String(s) => {
            out.insert(prefix.to_string(), s.clone());
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

pub async fn export(client: &AdminClient, output: Output) -> anyhow::Result<()> {
    let config = client.call(Method::GET, "/v1/config", None).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&config)?),
        Output::Table => print!("{}", yaml_serde::to_string(&config)?),
    }
    Ok(())
}

pub async fn status(client: &AdminClient, output: Output) -> anyhow::Result<()> {
    let nodes = client.call(Method::GET, "/v1/data-planes", None).await?;
    let latest = client.call(Method::GET, "/v1/snapshots?limit=1", None).await?;
    if output == Output::Json {
        println!("{}", serde_json::json!({ "data_planes": nodes["items"], "latest_snapshot": latest["items"][0] }));
        return Ok(());
    }
    let latest_version = latest["items"][0]["version"].as_u64().unwrap_or_default();
    println!("latest snapshot: version {latest_version}");
    let rows: Vec<[String; 6]> = nodes["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let text = |key: &str| match &n[key] {
                Value::Null => "-".to_string(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let state = match (n["connected"].as_bool(), n["stale"].as_bool()) {
                (_, Some(true)) => "stale",
                (Some(true), _) => "connected",
                _ => "disconnected",
            };
            let behind = n["applied_version"].as_u64().is_some_and(|v| v < latest_version);
            let applied = format!("{}{}", text("applied_version"), if behind { " (behind)" } else { "" });
            [
                text("node_id"),
                text("address"),
                applied,
                state.to_string(),
                text("last_nack_version"),
                text("last_error"),
            ]
        })
        .collect();
    print_table(
        &["NODE", "ADDRESS", "VERSION", "STATE", "NACKED", "LAST ERROR"],
        &rows,
        "(no data planes have connected)",
    );
    Ok(())
}

pub async fn rollback(client: &AdminClient, version: u64, output: Output) -> anyhow::Result<()> {
    let result = client.call(Method::POST, &format!("/v1/snapshots/{version}/rollback"), None).await?;
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else if result["changed"].as_bool() == Some(true) {
        println!("rolled back to the configuration of version {version}: now version {}", result["version"]);
    } else {
        println!("the configuration already equals version {version}: nothing changed");
    }
    Ok(())
}

/// The newest snapshots: the versions `rollback` takes, what made each, and when.
pub async fn history(client: &AdminClient, limit: u32, output: Output) -> anyhow::Result<()> {
    let page = client.call(Method::GET, &format!("/v1/snapshots?limit={limit}"), None).await?;
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default();
    let rows: Vec<[String; 5]> = page["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let age = s["created_at"].as_i64().map_or("-".into(), |at| age((now_ms - at).max(0) / 1000));
            let hash = s["hash"].as_str().unwrap_or_default().chars().take(12).collect();
            let author = s["author"].as_str().filter(|a| !a.is_empty()).unwrap_or("-").to_string();
            [s["version"].to_string(), age, author, hash, s["note"].as_str().unwrap_or_default().to_string()]
        })
        .collect();
    print_table(&["VERSION", "CREATED", "BY", "HASH", "CHANGE"], &rows, "(no snapshots)");
    Ok(())
}

fn age(seconds: i64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s ago"),
        s if s < 3_600 => format!("{}m ago", s / 60),
        s if s < 86_400 => format!("{}h ago", s / 3_600),
        s => format!("{}d ago", s / 86_400),
    }
}

/// Parses, prepares and builds the snapshot exactly as the control plane
/// would, with a throwaway key, so every problem is found without a server.
pub fn validate(file: &Path) -> anyhow::Result<()> {
    let document = read_config_file(file)?;
    let config: Config = serde_json::from_value(document)
        .with_context(|| format!("{} does not match the config format", file.display()))?;
    let secrets = SecretBox::from_key_material(&"00".repeat(32)).context("throwaway key")?;
    let hmac_key = [0u8; 32];
    let specs = SpecCache::default();
    let problems = match prepare_config(config, &Config::default(), &secrets, &hmac_key, &specs, DEFAULT_MAX_SPEC_BYTES)
    {
        Err(violations) => violations,
        Ok(prepared) => build_snapshot(&prepared, &secrets, &hmac_key, &specs).err().unwrap_or_default(),
    };
    if problems.is_empty() {
        println!("{}: valid", file.display());
        return Ok(());
    }
    for problem in &problems {
        eprintln!("  {}: {}", problem.path, problem.message);
    }
    bail!("{}: {} problem(s)", file.display(), problems.len())
}

fn print_table<const N: usize>(headers: &[&str; N], rows: &[[String; N]], empty: &str) {
    let mut widths = headers.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    if rows.is_empty() {
        println!("{empty}");
    }
}
