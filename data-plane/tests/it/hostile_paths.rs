//! Hostile request paths against a real `sluice-dp` process and real echo
//! upstreams (`sluice-test-upstream`, one per API, so the upstream that
//! answers names the API that routed): each raw path is sent as
//! `curl --path-as-is` would send it, and the test checks the path the
//! upstream received, or that the gateway refused it and no upstream saw it.
//! The routes are those of issue 22: `/admin` behind an IP allow-list that
//! excludes the test client, and `/` open to all.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use anyhow::{Context, Result};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;
use sluice_proto::v1;
use sluice_proto::v1::policy::Kind;

use crate::raw_http::{Edge, exchange, exchange_blocking, get_request};

/// The APIs of the suite, each forwarding to its own upstream of the same name.
const ADMIN: &str = "admin";
const OPEN: &str = "open";
const SHOP: &str = "shop";
const RAW: &str = "raw";

/// `/admin` (IP allow-list 10.0.0.0/8), `/` (no policies), `/shop`
/// (strip_prefix) and `/raw` (forward_raw_path).
async fn start() -> Result<Edge> {
    let api = |name: &str, prefix: &str| v1::Api {
        name: name.into(),
        path_prefix: prefix.into(),
        upstream: name.into(),
        ..Default::default()
    };
    let allow_ten = Kind::IpRestriction(v1::IpRestriction { allow: vec!["10.0.0.0/8".into()], deny: vec![] });
    Edge::start(
        vec![
            v1::Api { policies: vec![v1::Policy { kind: Some(allow_ten) }], ..api(ADMIN, "/admin") },
            api(OPEN, "/"),
            v1::Api { strip_prefix: true, ..api(SHOP, "/shop") },
            v1::Api { forward_raw_path: true, ..api(RAW, "/raw") },
        ],
        &[],
    )
    .await
}

/// What the gateway must do with a raw path.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// Forwarded: (the upstream that answers, the path it received).
    Upstream(&'static str, &'static str),
    /// Refused by the gateway with this status; no upstream sees it.
    Refused(u16),
}

use Want::{Refused, Upstream as To};

/// At least 40 raw paths with their canonical form (as the upstream got it) or refusal.
const PATHS: &[(&str, Want)] = &[
    ("/", To(OPEN, "/")),
    ("/users", To(OPEN, "/users")),
    // Issue 22's bypasses: each must meet /admin's IP restriction (403), never the open API.
    ("/admin/users", Refused(403)),
    ("/public/../admin/users", Refused(403)),
    ("/x/%2e%2e/admin/users", Refused(403)),
    ("/%61dmin/users", Refused(403)),
    ("/./admin/users", Refused(403)),
    ("/admin%2fusers", Refused(400)),
    // Variants of the same class.
    ("/admin%2Fusers", Refused(400)),
    ("/%2fadmin/users", Refused(400)),
    ("//admin/users", Refused(403)),
    ("/admin//users", Refused(403)),
    ("/x/%2E%2E/admin", Refused(403)),
    ("/x/.%2e/admin/", Refused(403)),
    ("/x/%2e./admin", Refused(403)),
    ("/admin/./users", Refused(403)),
    ("/%41dmin/users", To(OPEN, "/Admin/users")),
    ("/public/./a", To(OPEN, "/public/a")),
    ("/public//a///b", To(OPEN, "/public/a/b")),
    ("/public/a/../b", To(OPEN, "/public/b")),
    ("/public/a/..", To(OPEN, "/public/")),
    ("/public/a/.", To(OPEN, "/public/a/")),
    ("/..", Refused(400)),
    ("/public/../..", Refused(400)),
    ("/%2e%2e/admin", Refused(400)),
    ("/public/%2e%2e/%2e%2e/admin", Refused(400)),
    ("/a%zz", Refused(400)),
    ("/a%4", Refused(400)),
    ("/a%00b", Refused(400)),
    ("/public/..;/admin/users", Refused(400)),
    ("/public/.;x=1/admin", Refused(400)),
    ("/admin%5cusers", Refused(400)),
    ("/public%5C..%5Cadmin", Refused(400)),
    ("/public/%7euser", To(OPEN, "/public/~user")),
    ("/public/%41%42%43", To(OPEN, "/public/ABC")),
    ("/public/a%20b", To(OPEN, "/public/a%20b")),
    ("/public/caf%c3%a9", To(OPEN, "/public/caf%C3%A9")),
    ("/public/%252e%252e/admin", To(OPEN, "/public/%252e%252e/admin")),
    ("/public/a;b=c", To(OPEN, "/public/a;b=c")),
    ("/.well-known/x", To(OPEN, "/.well-known/x")),
    ("/public/...", To(OPEN, "/public/...")),
    ("/public/..a/b", To(OPEN, "/public/..a/b")),
    ("/admin%2e/users", To(OPEN, "/admin./users")),
    // strip_prefix removes the prefix from the canonical path.
    ("/shop/../shop/items", To(SHOP, "/items")),
    ("/shop/%69tems", To(SHOP, "/items")),
    ("/x/../shop", To(SHOP, "/")),
    ("/shop//a", To(SHOP, "/a")),
    // forward_raw_path: routed by the canonical path, forwarded as sent.
    ("/raw/a%2Fb", To(RAW, "/raw/a%2Fb")),
    ("/raw/x/../%61", To(RAW, "/raw/x/../%61")),
    ("/raw/../admin/users", Refused(403)),
    ("/raw/%2e%2e/admin", Refused(403)),
    ("/raw/../public%2Fx", Refused(400)),
];

#[tokio::test]
async fn raw_paths_reach_the_upstream_in_canonical_form_or_are_refused() -> Result<()> {
    let edge = start().await?;
    let mut expected: BTreeMap<&str, u64> = BTreeMap::new();
    let mut failures = Vec::new();
    for (raw, want) in PATHS {
        let response = exchange(edge.dp.http_addr, get_request(raw, "gateway.test", &[])).await?;
        let body = response.json();
        match want {
            To(server, path) => {
                *expected.entry(server).or_default() += 1;
                if response.status != 200 || body["server"] != *server || body["path"] != *path {
                    failures.push(format!("{raw}: want {server} {path}, got {} {body}", response.status));
                }
            }
            Refused(status) => {
                if response.status != *status || !response.is_problem() || body["status"] != *status {
                    failures.push(format!("{raw}: want {status} problem details, got {} {body}", response.status));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} paths wrong:\n{}", failures.len(), PATHS.len(), failures.join("\n"));
    // Nothing refused reached any upstream; the admin upstream saw nothing at all.
    let received = edge.received().await?;
    for name in [ADMIN, OPEN, SHOP, RAW] {
        assert_eq!(received[name], expected.get(name).copied().unwrap_or(0), "{name}: {received:?}");
    }
    // The access log shows the path that was routed and forwarded.
    let logged =
        || edge.dp.process.stdout().lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).collect::<Vec<_>>();
    crate::support::eventually("the access log line", std::time::Duration::from_millis(50), || async {
        logged().iter().any(|l| l["path"] == "/public/a/b" && l["api"] == OPEN)
    })
    .await
    .with_context(|| format!("{:?}", logged()))?;
    assert!(!logged().iter().any(|l| l["path"] == "/public//a///b"), "the raw path was logged");
    Ok(())
}

/// The query is not part of the path: it reaches the upstream untouched.
#[tokio::test]
async fn the_query_is_left_as_sent() -> Result<()> {
    let edge = start().await?;
    let response = exchange(edge.dp.http_addr, get_request("/public//x?q=%2e%2e/a&b=%2F", "g", &[])).await?;
    let body = response.json();
    assert_eq!(
        (response.status, &body["path"], &body["query"]),
        (200, &"/public/x".into(), &"q=%2e%2e/a&b=%2F".into())
    );
    Ok(())
}

/// Segments a generated path is made of: plain names, the prefixes of the
/// suite's APIs, dot segments raw and encoded, encoded separators, escapes.
const SEGMENTS: &[&str] = &[
    "admin", "public", "shop", "raw", "users", "x", "", ".", "..", "%2e", "%2E%2e", ".%2e", "%2e.", "%61dmin",
    "%73hop", "%2f", "%2F", "a%2fb", "%5C", "%7e", "~", "a;b", "..;", ".;x", "%00", "%zz", "%20", "%41",
];

/// The API whose prefix is the longest segment-wise prefix of `path`.
fn routed_api(path: &str) -> &'static str {
    let first = path.split('/').find(|s| !s.is_empty()).unwrap_or("");
    match first {
        "admin" => ADMIN,
        "shop" => SHOP,
        "raw" => RAW,
        _ => OPEN,
    }
}

/// For any path: the API that answers is the one the canonical path routes
/// to, the upstream receives the canonical path (for `/shop`, without its
/// prefix; for `/raw`, as sent), and a refused path reaches no upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_and_the_forwarded_path_agree_for_any_path() -> Result<()> {
    let edge = start().await?;
    let addr: SocketAddr = edge.dp.http_addr;
    let before = edge.received().await?;
    let forwarded = tokio::task::spawn_blocking(move || -> Result<u64> {
        let mut runner = TestRunner::new(Config { cases: 256, failure_persistence: None, ..Config::default() });
        let segments = prop::collection::vec(prop::sample::select(SEGMENTS), 0..7);
        let path = (segments, any::<bool>()).prop_map(|(segments, trailing)| {
            let mut path = format!("/{}", segments.join("/"));
            if trailing && path.len() > 1 {
                path.push('/');
            }
            path
        });
        let forwarded = std::cell::Cell::new(0u64);
        runner
            .run(&path, |raw| {
                let response = exchange_blocking(addr, &get_request(&raw, "gateway.test", &[]))
                    .map_err(|e| TestCaseError::fail(format!("{raw}: {e:#}")))?;
                let body = response.json();
                let canonical = sluice_proto::path::canonical_path(&raw);
                match response.status {
                    200 => {
                        forwarded.set(forwarded.get() + 1);
                        let canonical = canonical.map_err(|e| TestCaseError::fail(format!("{raw} forwarded: {e}")))?;
                        let api = routed_api(&canonical.path);
                        prop_assert_eq!(body["server"].as_str(), Some(api), "{} ({})", raw, canonical.path);
                        let received = body["path"].as_str().unwrap_or_default();
                        let want = match api {
                            RAW => raw.clone(),
                            SHOP => {
                                let rest = canonical.path.strip_prefix("/shop").unwrap_or_default();
                                if rest.starts_with('/') { rest.to_owned() } else { format!("/{rest}") }
                            }
                            _ => canonical.path.clone().into_owned(),
                        };
                        prop_assert_eq!(received, want.as_str(), "{}", raw);
                        prop_assert!(api == RAW || !canonical.encoded_separator, "{} forwarded with %2F", raw);
                    }
                    403 => {
                        let canonical = canonical.map_err(|e| TestCaseError::fail(format!("{raw} routed: {e}")))?;
                        prop_assert_eq!(routed_api(&canonical.path), ADMIN, "{} refused by IP", raw);
                        prop_assert!(response.is_problem());
                    }
                    400 => {
                        let separator = canonical.as_ref().is_ok_and(|c| c.encoded_separator);
                        prop_assert!(canonical.is_err() || separator, "{} refused as {:?}", raw, canonical);
                        prop_assert!(response.is_problem());
                    }
                    other => prop_assert!(false, "{}: status {} {}", raw, other, body),
                }
                Ok(())
            })
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(forwarded.get())
    })
    .await??;
    let after = edge.received().await?;
    let total = |counts: &BTreeMap<&str, u64>| counts.values().sum::<u64>();
    assert_eq!(total(&after) - total(&before), forwarded, "requests the gateway refused reached an upstream");
    assert_eq!(after[ADMIN], 0, "the admin upstream was reached");
    Ok(())
}
