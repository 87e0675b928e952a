//! The web dashboard (`/ui`) in a real headless Chromium, driven over
//! WebDriver, against a real control plane and two real data planes: sign
//! in, see both planes, create an API in the form (its field error first)
//! and see a data plane serve it, see a NACK's reason, compare two snapshots
//! and roll back, a read-only session without write controls whose forced
//! save shows the 403; and, in a second cluster, the traffic charts follow
//! requests sent through both data planes and a stopped target is shown
//! down. Each page is saved as a PNG under `target/screenshots/dashboard/`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use reqwest::Method;
use serde_json::{Value, json};
use sluice_testkit::sim_node::{Faults, SimNode, SimOptions};
use sluice_testkit::webdriver::{Browser, Chromedriver, screenshot_dir};

use crate::support::{
    ADMIN_TOKEN, Admin, CLUSTER_TOKEN, Cluster, all_applied, data_plane, eventually, served_by, upstream,
};

/// What the simulated data plane of another build says when it refuses a snapshot.
const REFUSAL: &str = "this build cannot run API `legacy`";

/// Saves the viewport as `<name>.png`.
async fn snap(browser: &Browser, name: &str) -> Result<()> {
    browser.screenshot(&screenshot_dir("dashboard").join(format!("{name}.png"))).await
}

/// Opens a page of the dashboard by its route and waits for its heading.
async fn open(browser: &Browser, ui: &str, route: &str, heading: &str) -> Result<()> {
    browser.goto(&format!("{ui}#/{route}")).await?;
    browser.wait_for_text("main h1", heading).await.map(drop)
}

/// Every visible text and attribute of the page, for "never shows X" checks.
async fn page_source(browser: &Browser) -> Result<String> {
    let html = browser.execute("return document.documentElement.outerHTML", vec![]).await?;
    Ok(html.as_str().unwrap_or_default().to_owned())
}

async fn sign_in(browser: &Browser, ui: &str, token: &str) -> Result<()> {
    browser.goto(&format!("{ui}#/overview")).await?;
    let input = browser.wait_for("#sign-in #token").await?;
    browser.fill(&input, token).await?;
    browser.click_on("#sign-in button[type=submit]").await?;
    browser.wait_for_text("main h1", "Overview").await.map(drop)
}

#[tokio::test]
async fn the_dashboard_shows_and_changes_a_real_cluster() -> Result<()> {
    let Some(driver) = Chromedriver::start().await? else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let Cluster { cp, admin, upstream: _u1, backend, dp: dp_a } = Cluster::start(dir.path(), "dp-a").await?;
    let dp_b = data_plane(cp.addr("grpc_addr")?, "dp-b").await?;
    admin.create_upstream("pool", backend).await?;
    let before_shop = admin.latest_version().await?;
    eventually("both data planes on the first version", || all_applied(&admin, before_shop, 2)).await?;

    let ui = format!("http://{}/ui", cp.addr("admin_addr")?);
    let browser = driver.browser().await?;
    let proxies = [dp_a.addr("http_addr")?, dp_b.addr("http_addr")?];
    let grpc = format!("http://{}", cp.addr("grpc_addr")?);
    let outcome = scenario(&browser, &ui, &admin, &grpc, backend, proxies, before_shop).await;
    if outcome.is_err() {
        // The page as it was when the test failed, beside the others.
        let _ = snap(&browser, "failure").await;
    }
    browser.quit().await.ok();
    driver.stop().await?;
    outcome
}

async fn scenario(
    browser: &Browser,
    ui: &str,
    admin: &Admin,
    grpc: &str,
    backend: SocketAddr,
    proxies: [SocketAddr; 2],
    before_shop: u64,
) -> Result<()> {
    // Sign-in: the page holds no data before a token is given.
    browser.goto(ui).await?;
    browser.wait_for("#sign-in").await?;
    snap(browser, "01-sign-in").await?;
    let input = browser.find("#token").await?;
    browser.fill(&input, "not-the-token").await?;
    browser.click_on("#sign-in button[type=submit]").await?;
    browser.wait_for_text("#sign-in-error", "refused").await?;
    sign_in(browser, ui, ADMIN_TOKEN).await?;

    // Overview: two real data planes, connected, on the current version.
    let table = browser.wait_for_text("#data-planes-table", "dp-b").await?;
    ensure!(table.contains("dp-a") && table.matches("connected").count() >= 2, "{table}");
    ensure!(table.contains(&format!("ACK v{before_shop}")), "{table}");
    let version = browser.wait_for_text("#current-version", &before_shop.to_string()).await?;
    ensure!(version.contains("admin-token"), "the author of the current version: {version}");
    browser.wait_for_text("#count-upstreams", "1").await?;
    snap(browser, "02-overview").await?;

    // Edit: a new API from the form. A bad prefix first: the problem's pointer puts the error beside its field.
    open(browser, ui, "edit", "Edit").await?;
    snap(browser, "03-edit").await?;
    browser.click_on("#new-api").await?;
    browser.wait_for_text("main h1", "New API").await?;
    browser.fill(&browser.find("#api-name").await?, "shop").await?;
    browser.fill(&browser.find("#api-path_prefix").await?, "shop").await?;
    browser.click_on("#api-upstream option[value=pool]").await?;
    browser.click_on("#save").await?;
    let field = browser.wait_for("#api-path_prefix[aria-invalid=true]").await?;
    let error = browser.text(&browser.find("#api-path_prefix-error").await?).await?;
    ensure!(!error.is_empty(), "no error beside the path prefix");
    browser.wait_for("#form-problem:not([hidden])").await?;
    snap(browser, "04-edit-problem").await?;
    ensure!(admin.latest_version().await? == before_shop, "the refused form committed something ({error})");
    browser.fill(&field, "/shop").await?;
    browser.click_on("#save").await?;
    browser.wait_for_text("main h1", "API shop").await?;
    snap(browser, "05-api-detail").await?;
    let with_shop = admin.latest_version().await?;
    ensure!(with_shop > before_shop, "the form committed no version");
    let client = reqwest::Client::new();
    for proxy in proxies {
        let url = format!("http://{proxy}/shop/x");
        eventually("the API created in the form is served", || async {
            served_by(&client, &url).await.as_deref() == Ok("u1")
        })
        .await?;
    }

    // APIs and Upstreams pages.
    open(browser, ui, "apis", "APIs").await?;
    let row = browser.wait_for_text("tr[data-api=shop]", "pool").await?;
    ensure!(row.contains("/shop"), "{row}");
    snap(browser, "06-apis").await?;
    open(browser, ui, "upstreams", "Upstreams").await?;
    let pool = browser.wait_for_text("[data-upstream=pool]", &backend.to_string()).await?;
    ensure!(pool.contains("round robin") && pool.contains("shop"), "{pool}");
    snap(browser, "07-upstreams").await?;

    // Consumers: the kinds of credential, never a credential in any form.
    let consumer = json!({ "username": "alice", "basic_auth": { "password": "pa55word-alice" },
                           "api_keys": [{ "key": "key-of-alice-123" }] });
    admin.ok(Method::POST, "/v1/consumers", Some(consumer)).await?;
    let stored = admin.ok(Method::GET, "/v1/consumers/alice", None).await?;
    let secrets = stored_secrets(&stored);
    ensure!(secrets.len() == 2, "expected a password hash and a key digest: {stored}");
    open(browser, ui, "consumers", "Consumers").await?;
    let row = browser.wait_for_text("tr[data-consumer=alice]", "basic auth").await?;
    ensure!(row.contains("API key"), "{row}");
    let source = page_source(browser).await?;
    for secret in secrets.iter().map(String::as_str).chain(["pa55word-alice", "key-of-alice-123"]) {
        ensure!(!source.contains(secret), "the consumers page shows a credential");
    }
    snap(browser, "08-consumers").await?;

    // A NACK and its reason, as a data plane reported it: the control plane refuses at write time what this
    // build's data planes would, so the NACK comes from a (simulated) data plane of another build.
    let mut options = SimOptions::new(grpc, CLUSTER_TOKEN, "dp-other-build");
    options.heartbeat = std::time::Duration::from_millis(300);
    let other = SimNode::start(options)?;
    other.set_faults(Faults {
        refuse: Some(Arc::new(|pushed| {
            let snapshot = pushed.decode().ok()?;
            snapshot.apis.iter().any(|api| api.name == "legacy").then(|| REFUSAL.to_owned())
        })),
        ..Faults::default()
    });
    let legacy = json!({ "name": "legacy", "path_prefix": "/legacy", "upstream": "pool" });
    admin.ok(Method::POST, "/v1/apis", Some(legacy)).await?;
    let refused = admin.latest_version().await?;
    open(browser, ui, "overview", "Overview").await?;
    let row = browser.wait_for_text("tr[data-node=dp-other-build] .nack", &format!("NACK v{refused}")).await?;
    ensure!(row.contains(REFUSAL), "the NACK's reason: {row}");
    snap(browser, "09-overview-nack").await?;
    admin.ok(Method::DELETE, "/v1/apis/legacy", None).await?;

    // Snapshots: compare the version before the form's API with the one it made, then roll back to before it.
    open(browser, ui, "snapshots", "Snapshots").await?;
    let history = browser.wait_for_text("#snapshots-table", &format!("v{with_shop}")).await?;
    ensure!(history.contains("create api shop"), "{history}");
    snap(browser, "10-snapshots").await?;
    browser.click_on(&format!("#a-{before_shop}")).await?;
    browser.click_on(&format!("#b-{with_shop}")).await?;
    browser.click_on("#compare-button").await?;
    let diff = browser.wait_for_text("#diff-table", "/apis/shop/path_prefix").await?;
    ensure!(diff.contains("\"/shop\"") && diff.contains("added"), "{diff}");
    ensure!(!diff.contains("/consumers"), "a setting that did not change is listed: {diff}");
    snap(browser, "11-diff").await?;
    // A diff across the consumer's version names its credentials but hides their values.
    let latest = admin.latest_version().await?;
    browser.goto(&format!("{ui}#/snapshots/diff?a={with_shop}&b={latest}")).await?;
    let diff = browser.wait_for_text("#diff-table", "/consumers/alice/basic_auth/password_hash").await?;
    ensure!(diff.contains("‹hidden›"), "{diff}");
    let source = page_source(browser).await?;
    ensure!(secrets.iter().all(|secret| !source.contains(secret.as_str())), "the diff shows a credential");

    open(browser, ui, "snapshots", "Snapshots").await?;
    browser.click_on(&format!("[data-rollback=\"{before_shop}\"]")).await?;
    let dialog = browser.wait_for_text("dialog[open]", &format!("Roll back to version {before_shop}?")).await?;
    ensure!(dialog.contains("Cancel"), "{dialog}");
    snap(browser, "12-rollback-confirm").await?;
    browser.click_on("dialog[open] [data-confirm]").await?;
    let message = browser.wait_for_text("#snapshot-message", "Rolled back").await?;
    let rolled = admin.latest_version().await?;
    ensure!(message.contains(&format!("now version {rolled}")), "{message}");
    let (status, _) = admin.send(Method::GET, "/v1/apis/shop", None).await?;
    ensure!(status == 404, "after the rollback the API is still there: {status}");
    for proxy in proxies {
        let url = format!("http://{proxy}/shop/x");
        eventually("the rolled-back API no longer served", || async { served_by(&client, &url).await == Err(404) })
            .await?;
    }

    // A read-only token: the same pages, no control that writes.
    let created = admin.ok(Method::POST, "/v1/tokens", Some(json!({ "name": "viewer", "role": "read-only" }))).await?;
    let viewer = created["token"].as_str().context("no token in the answer")?.to_owned();
    browser.click_on("#sign-out").await?;
    browser.wait_for("#sign-in").await?;
    sign_in(browser, ui, &viewer).await?;
    let role = browser.wait_for_text("#session", "read-only").await?;
    ensure!(role.contains("viewer"), "{role}");
    ensure!(browser.find_all("nav a[href='#/edit']").await?.is_empty(), "a read-only session is offered Edit");
    snap(browser, "13-read-only-overview").await?;
    for (route, heading) in [("apis", "APIs"), ("upstreams", "Upstreams"), ("snapshots", "Snapshots")] {
        open(browser, ui, route, heading).await?;
        let controls = browser.find_all("main button, main a.button, [data-rollback], #new-api").await?;
        // Only the snapshot page's Compare and paging buttons may remain; they read.
        for control in &controls {
            let id = browser.attribute(control, "id").await?.unwrap_or_default();
            let text = browser.text(control).await?;
            ensure!(
                id == "compare-button" || id == "older",
                "a read-only session sees the control {id:?} {text:?} on {route}"
            );
        }
    }
    // Following a link to a form: every control disabled. Forced past that, the save is the admin API's 403,
    // shown as the problem it is, and nothing is committed.
    let before = admin.latest_version().await?;
    open(browser, ui, "edit/upstream/pool", "Edit upstream pool").await?;
    browser.wait_for_text("#read-only-notice", "read-only").await?;
    browser.wait_for("#read-only-fields[disabled]").await?;
    snap(browser, "14-read-only-form").await?;
    browser.execute("document.getElementById('read-only-fields').disabled = false", vec![]).await?;
    browser.click_on("#save").await?;
    let problem = browser.wait_for_text("#form-problem", "HTTP 403").await?;
    ensure!(problem.contains("read-only"), "the 403 problem does not say why: {problem}");
    snap(browser, "15-read-only-403").await?;
    ensure!(admin.latest_version().await? == before, "a read-only session committed a version");
    Ok(())
}

/// The stored forms of a consumer's credentials (hash, digest) as the admin API returns them.
fn stored_secrets(consumer: &Value) -> Vec<String> {
    let hash = consumer["basic_auth"]["password_hash"].as_str();
    let digests = consumer["api_keys"].as_array().into_iter().flatten().filter_map(|k| k["key_digest"].as_str());
    hash.into_iter().chain(digests).map(str::to_owned).collect()
}

#[tokio::test]
async fn the_dashboard_draws_traffic_and_shows_a_stopped_target_down() -> Result<()> {
    let Some(driver) = Chromedriver::start().await? else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let Cluster { cp, admin, upstream: _u1, backend, dp: dp_a } = Cluster::start(dir.path(), "dp-a").await?;
    let dp_b = data_plane(cp.addr("grpc_addr")?, "dp-b").await?;
    let (second, second_addr) = upstream("u2", "127.0.0.1:0").await?;
    let pool = json!({
        "name": "pool",
        "targets": [{ "url": format!("http://{backend}") }, { "url": format!("http://{second_addr}") }],
        "health_check": { "path": "/health", "interval": "200ms", "timeout": "200ms",
                          "healthy_threshold": 1, "unhealthy_threshold": 2 },
    });
    admin.ok(Method::POST, "/v1/upstreams", Some(pool)).await?;
    admin.create_api("shop", "/shop", "pool").await?;
    let version = admin.latest_version().await?;
    eventually("both data planes run the shop API", || all_applied(&admin, version, 2)).await?;

    let ui = format!("http://{}/ui", cp.addr("admin_addr")?);
    let browser = driver.browser().await?;
    let proxies = [dp_a.addr("http_addr")?, dp_b.addr("http_addr")?];
    let outcome = traffic_scenario(&browser, &ui, proxies, [backend, second_addr], second).await;
    if outcome.is_err() {
        let _ = snap(&browser, "failure-traffic").await;
    }
    browser.quit().await.ok();
    driver.stop().await?;
    outcome
}

/// Sends `count` requests to `/shop/…?{query}` through `proxy`; returns how many had each class of status.
async fn send(client: &reqwest::Client, proxy: SocketAddr, count: usize, query: &str) -> Result<(usize, usize)> {
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..count {
        let status = client.get(format!("http://{proxy}/shop/item?{query}")).send().await?.status();
        if status.is_server_error() { failed += 1 } else { ok += 1 }
    }
    Ok((ok, failed))
}

/// The numbers an API's card shows: the window's requests and errors.
async fn totals(browser: &Browser, api: &str) -> Result<(u64, u64)> {
    let figure = |name: &'static str| async move {
        let text = browser.text(&browser.find(&format!("#traffic-{api} [data-figure={name}]")).await?).await?;
        text.trim().parse::<u64>().with_context(|| format!("{name}: {text:?}"))
    };
    Ok((figure("requests").await?, figure("errors").await?))
}

/// The values of a chart's points, as drawn.
async fn chart_values(browser: &Browser, id: &str) -> Result<Vec<f64>> {
    let mut values = Vec::new();
    for point in browser.find_all(&format!("#{id} circle")).await? {
        let value = browser.attribute(&point, "data-value").await?.unwrap_or_default();
        values.push(value.parse::<f64>().with_context(|| format!("a point of {id}: {value:?}"))?);
    }
    Ok(values)
}

async fn traffic_scenario(
    browser: &Browser,
    ui: &str,
    proxies: [SocketAddr; 2],
    targets: [SocketAddr; 2],
    mut second: sluice_testkit::Process,
) -> Result<()> {
    sign_in(browser, ui, ADMIN_TOKEN).await?;

    // Upstreams: both targets healthy as both data planes see them.
    open(browser, ui, "upstreams", "Upstreams").await?;
    for target in targets {
        let row = format!("tr[data-target=\"http://{target}\"]");
        let health = browser.wait_for_text(&row, "2 of 2 data planes healthy").await?;
        ensure!(health.contains("healthy"), "{health}");
    }

    // Traffic: 30 requests through one data plane (10 answered 500 by the upstream), 20 through the other.
    let client = reqwest::Client::new();
    let mut sent = (0, 0);
    for (proxy, count, query) in [(proxies[0], 20, "n=1"), (proxies[0], 10, "status=500"), (proxies[1], 20, "n=2")] {
        let (ok, failed) = send(&client, proxy, count, query).await?;
        sent = (sent.0 + ok, sent.1 + failed);
    }
    ensure!(sent == (40, 10), "the upstream answered otherwise than asked: {sent:?}");
    open(browser, ui, "traffic", "Traffic").await?;
    let sources = browser.wait_for_text("#traffic-sources", "2 data planes").await?;
    ensure!(sources.contains("dp-a") && sources.contains("dp-b"), "{sources}");
    eventually_shown(browser, "shop", (50, 10)).await?;
    let rates = chart_values(browser, "chart-shop-requests_per_second").await?;
    ensure!(!rates.is_empty() && rates.iter().any(|rate| *rate > 0.0), "requests/s drawn: {rates:?}");
    let errors = chart_values(browser, "chart-shop-error_rate").await?;
    ensure!(errors.iter().any(|rate| *rate > 0.0), "error rate drawn: {errors:?}");
    let latest = browser.wait_for("[data-latest=requests_per_second]").await?;
    ensure!(browser.text(&latest).await?.contains("req/s"), "no latest requests/s beside the chart");
    snap(browser, "16-traffic").await?;

    // More requests, slower ones: the figures and the p99 chart move.
    send(&client, proxies[1], 25, "delay_ms=150").await?;
    eventually_shown(browser, "shop", (75, 10)).await?;
    // The slowest of 75 requests, or of a step holding only the slow ones, is 150 ms: the (100, 250] ms bucket.
    let p99 = chart_values(browser, "chart-shop-p99_ms").await?;
    ensure!(p99.iter().any(|p99| *p99 >= 100.0), "the slow requests are not in the p99 chart: {p99:?}");
    snap(browser, "17-traffic-moved").await?;

    // One data plane alone: the second took 20 + 25 requests, none answered 500.
    browser.click_on("#traffic-source option[value=dp-b]").await?;
    browser.wait_for_text("#traffic-sources", "from data plane dp-b alone").await?;
    eventually_shown(browser, "shop", (45, 0)).await?;
    snap(browser, "18-traffic-one-data-plane").await?;

    // The second target stops: both data planes' active checks fail it, and the page says so.
    second.kill().await?;
    open(browser, ui, "upstreams", "Upstreams").await?;
    let row = format!("tr[data-target=\"http://{}\"]", targets[1]);
    let health = browser.wait_for_text(&row, "0 of 2 data planes healthy").await?;
    ensure!(health.contains("down") && health.matches("failing active check").count() == 2, "{health}");
    let state = browser.attribute(&browser.find(&row).await?, "data-health").await?;
    ensure!(state.as_deref() == Some("down"), "{state:?}");
    let first = format!("tr[data-target=\"http://{}\"]", targets[0]);
    ensure!(
        browser.text(&browser.find(&first).await?).await?.contains("2 of 2 data planes healthy"),
        "the first target"
    );
    snap(browser, "19-upstreams-target-down").await?;
    Ok(())
}

/// Waits until the API's card shows these totals (the page refreshes on its own every few seconds).
async fn eventually_shown(browser: &Browser, api: &str, expected: (u64, u64)) -> Result<()> {
    let what = format!("the traffic page to show {expected:?} for {api}");
    let shown = sluice_testkit::eventually(&what, std::time::Duration::from_millis(200), || async {
        totals(browser, api).await.is_ok_and(|totals| totals == expected)
    })
    .await;
    if shown.is_err() {
        let last = totals(browser, api).await;
        return shown.with_context(|| format!("last shown (requests, errors): {last:?}"));
    }
    Ok(())
}
