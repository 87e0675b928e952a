//! Whole-config import/export (round trip is a no-op, dry run commits nothing), snapshot history and rollback,
//! and the data planes' view with its stale flag.

use std::time::{SystemTime, UNIX_EPOCH};

use reqwest::Method;
use serde_json::{Value, json};
use sluice_control_plane::store::DataPlaneRecord;

use super::support::{Server, both, fruitshop, reply};

both!(export_import_round_trip_is_a_no_op, export_import_round_trip_is_a_no_op);
both!(dry_run_shows_the_diff_and_commits_nothing, dry_run_shows_the_diff_and_commits_nothing);
both!(rollback_commits_the_old_config_as_new_version, rollback_commits_the_old_config_as_new_version);
both!(data_planes_show_stale_nodes, data_planes_show_stale_nodes);

/// DESIGN.md's example config (`examples/fruitshop/config.yaml`), with the spec's `file:` resolved into
/// `content` as the CLI does.
fn example_yaml() -> String {
    let spec: String = fruitshop().lines().map(|line| format!("      {line}\n")).collect();
    let example = sluice_testkit::example("fruitshop/config.yaml").unwrap_or_else(|e| panic!("{e:#}"));
    let file = "    file: fruitshop-v2-2-0.oas.yml\n";
    assert!(example.contains(file), "the example no longer names its spec file: {example}");
    example.replace(file, &format!("    content: |\n{spec}"))
}

async fn import_yaml(server: &Server, path: &str, yaml: String) -> Value {
    server.raw(Method::PUT, path, "application/yaml", yaml).await.expect(200)
}

async fn export_import_round_trip_is_a_no_op(server: &Server) {
    let imported = import_yaml(server, "/v1/config", example_yaml()).await;
    assert_eq!(imported["changed"], true, "{imported}");
    assert_eq!(imported["dry_run"], false);
    for (collection, name) in
        [("upstreams", "shop-backend"), ("specs", "fruitshop"), ("consumers", "loadtest"), ("apis", "shop")]
    {
        assert_eq!(imported["diff"][collection]["added"], json!([name]), "{imported}");
    }
    let version = imported["version"].as_u64().unwrap_or_default();
    assert_eq!(server.version().await, version);

    // The export gives the document back: same resources, credentials only in stored form.
    let export = server.get("/v1/config").await;
    assert_eq!(export.header("content-type"), Some("application/json"));
    let exported = export.json();
    assert_eq!(exported["apis"][0]["path_prefix"], "/shop/v2");
    assert_eq!(exported["apis"][0]["policies"][1]["rate_limit"]["requests"], 2_000_000);
    assert_eq!(exported["upstreams"][0]["targets"].as_array().map(Vec::len), Some(2));
    assert_eq!(exported["specs"][0]["content"], fruitshop().as_str());
    assert!(exported["consumers"][0]["basic_auth"]["password_hash"].is_string());
    assert!(exported["consumers"][0]["basic_auth"].get("password").is_none());

    // Re-importing the JSON export, the YAML export, or the original (plaintext password) changes nothing.
    let again = server.put("/v1/config", &exported).await.expect(200);
    assert_eq!((again["changed"].clone(), again["version"].as_u64()), (json!(false), Some(version)), "{again}");
    let yaml = reply(
        server
            .http
            .get(format!("{}/v1/config", server.base))
            .bearer_auth(super::support::TOKEN)
            .header("accept", "application/yaml"),
    )
    .await;
    assert_eq!(yaml.header("content-type"), Some("application/yaml"));
    assert!(yaml.text.contains("shop-backend") && !yaml.text.trim_start().starts_with('{'));
    let again = import_yaml(server, "/v1/config", yaml.text).await;
    assert_eq!(again["changed"], false, "{again}");
    let again = import_yaml(server, "/v1/config", example_yaml()).await;
    assert_eq!(again["changed"], false, "{again}");
    assert_eq!(server.version().await, version);
    assert_eq!(server.get("/v1/config?format=json").await.json(), exported);
}

async fn dry_run_shows_the_diff_and_commits_nothing(server: &Server) {
    import_yaml(server, "/v1/config", example_yaml()).await;
    let version = server.version().await;
    let mut config = server.get("/v1/config").await.json();
    if let Some(upstreams) = config["upstreams"].as_array_mut() {
        upstreams.push(json!({ "name": "extra", "targets": [{ "url": "http://127.0.0.1:9003" }] }));
    }
    config["apis"][0]["strip_prefix"] = json!(true);
    config["consumers"] = json!([]);

    let dry = server.put("/v1/config?dry_run=true", &config).await.expect(200);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["changed"], true);
    assert_eq!(dry["version"].as_u64(), Some(version));
    assert_eq!(dry["diff"]["upstreams"]["added"], json!(["extra"]), "{dry}");
    assert_eq!(dry["diff"]["apis"]["changed"], json!(["shop"]), "{dry}");
    assert_eq!(dry["diff"]["consumers"]["removed"], json!(["loadtest"]), "{dry}");
    assert_eq!(server.version().await, version, "nothing committed");
    server.get("/v1/upstreams/extra").await.problem(404, "not-found");
    server.get("/v1/consumers/loadtest").await.expect(200);

    // A dry run also builds the snapshot, so a broken reference is caught without committing.
    config["apis"][0]["upstream"] = json!("nowhere");
    let problem = server.put("/v1/config?dry_run=true", &config).await.problem(422, "invalid-config");
    assert!(problem["errors"].as_array().is_some_and(|e| e.iter().any(|e| e["pointer"] == "/apis/shop/upstream")));
    server.put("/v1/config", &config).await.problem(422, "invalid-config");
    assert_eq!(server.version().await, version);
}

async fn rollback_commits_the_old_config_as_new_version(server: &Server) {
    let upstream = |name: &str| json!({ "name": name, "targets": [{ "url": "http://127.0.0.1:9001" }] });
    server.post("/v1/upstreams", &upstream("one")).await.expect(201);
    let target = server.version().await;
    server.post("/v1/upstreams", &upstream("two")).await.expect(201);
    server.delete("/v1/upstreams/one").await.expect(204);
    let latest = server.version().await;

    let rolled = server.call(Method::POST, &format!("/v1/snapshots/{target}/rollback"), None).await;
    let result = rolled.expect(201);
    assert_eq!(result["version"].as_u64(), Some(latest + 1), "{result}");
    assert_eq!(result["rolled_back_to"].as_u64(), Some(target));
    assert_eq!(rolled.header("location"), Some(format!("/v1/snapshots/{}", latest + 1).as_str()));

    let old = server.get(&format!("/v1/snapshots/{target}")).await.expect(200);
    let new = server.get(&format!("/v1/snapshots/{}", latest + 1)).await.expect(200);
    assert_eq!(new["config"], old["config"]);
    assert_eq!(new["hash"], old["hash"]);
    assert_eq!(new["version"].as_u64(), Some(latest + 1));
    server.get("/v1/upstreams/one").await.expect(200);
    server.get("/v1/upstreams/two").await.problem(404, "not-found");

    // Rolling back to what is already current commits nothing.
    let same = server.call(Method::POST, &format!("/v1/snapshots/{target}/rollback"), None).await.expect(200);
    assert_eq!((same["changed"].clone(), same["version"].as_u64()), (json!(false), Some(latest + 1)));

    server.call(Method::POST, "/v1/snapshots/999999/rollback", None).await.problem(404, "not-found");
    server.get("/v1/snapshots/999999").await.problem(404, "not-found");
    server.get("/v1/snapshots/latest").await.problem(400, "http-error");

    // History pages newest first through `before`.
    let mut versions = Vec::new();
    let mut path = "/v1/snapshots?limit=2".to_string();
    loop {
        let page = server.get(&path).await.expect(200);
        versions.extend(page["items"].as_array().into_iter().flatten().filter_map(|s| s["version"].as_u64()));
        match page["next"].as_u64() {
            Some(before) => path = format!("/v1/snapshots?limit=2&before={before}"),
            None => break,
        }
    }
    let expected: Vec<u64> = (1..=latest + 1).rev().collect();
    assert_eq!(versions, expected);
}

async fn data_planes_show_stale_nodes(server: &Server) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    for (node_id, last_seen) in [("fresh", now), ("silent", now - 3_600_000)] {
        let record = DataPlaneRecord {
            node_id: node_id.into(),
            hostname: format!("{node_id}.local"),
            address: "127.0.0.1:50000".into(),
            software_version: "0.1.0".into(),
            protocol_version: 1,
            applied_version: Some(1),
            applied_hash: Some("abc".into()),
            last_ack_version: Some(1),
            last_nack_version: None,
            last_nack_hash: None,
            last_error: None,
            connected: true,
            first_seen: last_seen,
            last_seen,
        };
        server.store.upsert_data_plane(&record).await.unwrap_or_else(|e| panic!("upsert: {e}"));
    }
    let page = server.get("/v1/data-planes").await.expect(200);
    let items = page["items"].as_array().cloned().unwrap_or_default();
    let stale: Vec<(String, bool)> = items
        .iter()
        .map(|i| (i["node_id"].as_str().unwrap_or_default().to_string(), i["stale"].as_bool().unwrap_or_default()))
        .collect();
    assert_eq!(stale, [("fresh".to_string(), false), ("silent".to_string(), true)], "{page}");
    assert_eq!(items[0]["hostname"], "fresh.local");
    assert_eq!(items[0]["applied_version"], 1);
}
