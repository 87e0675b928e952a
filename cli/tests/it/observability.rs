//! The `observability` profile's files against what the binaries export:
//! every Prometheus scrape target of deploy/prometheus/prometheus.yml is a
//! compose service's listener that serves `/metrics`, and every metric the
//! Grafana dashboard (deploy/grafana/sluice.json) queries is one those
//! scrapes show after traffic. Run by `compose.rs`, which starts the services.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

/// The (service, port) pairs a scrape config names, with its metrics path:
/// `static_configs` targets and `dns_sd_configs` names with their port.
pub fn scrape_targets(prometheus_yml: &str) -> Result<Vec<(String, u16, String)>> {
    let config: Value = yaml_serde::from_str(prometheus_yml).context("prometheus.yml is not YAML")?;
    let mut targets = Vec::new();
    for job in config["scrape_configs"].as_array().context("no scrape_configs")? {
        let path = job["metrics_path"].as_str().unwrap_or("/metrics").to_string();
        for target in job["static_configs"].as_array().into_iter().flatten().flat_map(|c| c["targets"].as_array()) {
            for hostport in target.iter().filter_map(Value::as_str) {
                let (host, port) = hostport.rsplit_once(':').context("a target without a port")?;
                targets.push((host.to_string(), port.parse()?, path.clone()));
            }
        }
        for sd in job["dns_sd_configs"].as_array().into_iter().flatten() {
            let port = sd["port"].as_u64().context("dns_sd_configs without a port")?;
            for name in sd["names"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                targets.push((name.to_string(), u16::try_from(port)?, path.clone()));
            }
        }
    }
    ensure!(!targets.is_empty(), "prometheus.yml scrapes nothing");
    Ok(targets)
}

/// Metric names as they appear on sample lines (`foo_bucket`, not `foo`).
fn exported(scrapes: &[String]) -> BTreeSet<String> {
    let lines = scrapes.iter().flat_map(|text| text.lines()).filter(|l| !l.starts_with('#') && !l.is_empty());
    lines.filter_map(|line| line.split(['{', ' ']).next()).map(String::from).collect()
}

/// Every `sluice_*` name in a PromQL expression.
fn metric_names(expr: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("sluice_") {
        let boundary = at == 0 || !rest[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        let len = rest[at..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len() - at);
        if boundary {
            names.push(&rest[at..at + len]);
        }
        rest = &rest[at + len..];
    }
    names
}

/// The queries of a dashboard: every panel target's `expr` and every
/// template variable's query, wherever they are nested (rows, libraries).
fn queries(node: &Value, out: &mut Vec<String>) {
    match node {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "definition", Value::String(q)) => out.push(q.clone()),
                    ("query", Value::String(q)) if map.contains_key("refId") || map.contains_key("definition") => {
                        out.push(q.clone())
                    }
                    _ => queries(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| queries(item, out)),
        _ => {}
    }
}

/// Checks the dashboard against the scrapes' text; `root` is the repository.
pub fn check_dashboard(root: &Path, scrapes: &[String]) -> Result<()> {
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(root.join("deploy/grafana/sluice.json"))?)
        .context("deploy/grafana/sluice.json is not JSON")?;
    let mut all = Vec::new();
    queries(&dashboard, &mut all);
    let panels = dashboard["panels"].as_array().context("no panels")?;
    let targets: usize = panels.iter().filter_map(|p| p["targets"].as_array()).map(Vec::len).sum();
    ensure!(targets >= 20, "the dashboard has {targets} queries; found {} strings", all.len());
    let exported = exported(scrapes);
    let mut unknown = BTreeSet::new();
    for query in &all {
        let names = metric_names(query);
        ensure!(!names.is_empty(), "a dashboard query names no Sluice metric: {query}");
        unknown.extend(names.into_iter().filter(|name| !exported.contains(*name)));
    }
    ensure!(unknown.is_empty(), "the dashboard queries metrics no plane exported: {unknown:?}\nexported: {exported:?}");

    // Grafana's provisioned data source is the one the dashboard selects by default.
    let datasources: Value = yaml_serde::from_str(&std::fs::read_to_string(
        root.join("deploy/grafana/provisioning/datasources/prometheus.yml"),
    )?)?;
    let uid = &datasources["datasources"][0]["uid"];
    let variable = dashboard["templating"]["list"].as_array().into_iter().flatten().find(|v| v["type"] == "datasource");
    ensure!(variable.is_some_and(|v| &v["current"]["value"] == uid), "the dashboard's data source is not {uid}");
    Ok(())
}

#[test]
fn names_are_read_from_promql() {
    let expr = r#"histogram_quantile(0.99, sum by (le) (rate(sluice_request_duration_seconds_bucket{api=~"$api"}[5m]))) / xsluice_no"#;
    assert_eq!(metric_names(expr), ["sluice_request_duration_seconds_bucket"]);
    assert_eq!(metric_names("max(sluice_cp_config_version)"), ["sluice_cp_config_version"]);
    let text = "# TYPE a counter\nsluice_a_total{x=\"1\"} 2\nsluice_b 1\n".to_string();
    assert_eq!(exported(&[text]), BTreeSet::from(["sluice_a_total".to_string(), "sluice_b".to_string()]));
}
