//! The proxy path in-process, over real sockets: the data plane of
//! `gateway` fed with hand-built snapshots, and tiny echo upstreams that can
//! be killed and restarted on the same port.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sluice_proto::v1;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::gateway::Gateway;
use crate::support::{client, metric_sum, send, serve_http1};

/// A relay for one connection to `target` that passes on the client's first
/// `first` bytes alone, pauses, then relays the rest both ways.
async fn relay_splitting_after(target: SocketAddr, first: usize) -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let Ok((mut client, _)) = listener.accept().await else { return };
        let Ok(mut server) = TcpStream::connect(target).await else { return };
        let _ = server.set_nodelay(true);
        let mut head = vec![0; first];
        if client.read_exact(&mut head).await.is_err() || server.write_all(&head).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    });
    Ok(addr)
}

/// An echo server: answers every request with JSON naming itself and
/// describing what it received. `/slow` waits (600 ms, or `?ms=`), `/health` is a probe target,
/// and `Connection: upgrade` switches to a raw byte echo.
struct Upstream {
    addr: SocketAddr,
    /// How many `/slow` requests have arrived so far.
    slow_requests: watch::Receiver<usize>,
    task: JoinHandle<()>,
}

impl Upstream {
    async fn start(name: &'static str) -> Result<Self> {
        Self::start_on(name, "127.0.0.1:0".parse()?).await
    }

    async fn start_on(name: &'static str, addr: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (slow_arrived, slow_requests) = watch::channel(0);
        let slow_arrived = Arc::new(slow_arrived);
        // A killed upstream really goes away: aborting the task closes its connections.
        let task = serve_http1(listener, move |req| {
            if req.uri().path().ends_with("/slow") {
                slow_arrived.send_modify(|n| *n += 1);
            }
            echo(name, req)
        });
        Ok(Upstream { addr, slow_requests, task })
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn kill(&self) {
        self.task.abort();
    }
}

/// Waits until a `/slow` request has reached one of `upstreams`: from then on
/// it is in flight on the gateway.
async fn slow_request_arrived(upstreams: &[&Upstream]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while upstreams.iter().all(|upstream| *upstream.slow_requests.borrow() == 0) {
        if Instant::now() > deadline {
            bail!("the slow request never reached the upstream");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

async fn echo(name: &'static str, mut req: http::Request<Incoming>) -> Result<http::Response<Full<Bytes>>, Infallible> {
    if req.headers().contains_key(http::header::UPGRADE) {
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = on_upgrade.await {
                let (mut r, mut w) = tokio::io::split(TokioIo::new(upgraded));
                let _ = tokio::io::copy(&mut r, &mut w).await;
            }
        });
        let response = http::Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", "echo")
            .body(Full::new(Bytes::new()));
        return Ok(response.unwrap_or_default());
    }
    if req.uri().path().ends_with("/slow") {
        // 600 ms, or as long as `?ms=` asks.
        let ms = req.uri().query().and_then(|q| q.strip_prefix("ms=")).and_then(|ms| ms.parse().ok());
        tokio::time::sleep(Duration::from_millis(ms.unwrap_or(600))).await;
    }
    let headers: HashMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let body = json!({
        "upstream": name,
        "method": req.method().as_str(),
        "path": req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/"),
        "headers": headers,
    });
    Ok(http::Response::new(Full::new(Bytes::from(body.to_string()))))
}

fn upstream(name: &str, targets: &[&Upstream]) -> v1::Upstream {
    v1::Upstream {
        name: name.into(),
        targets: targets.iter().map(|t| v1::Target { url: t.url(), weight: 1 }).collect(),
        ..Default::default()
    }
}

fn api(name: &str, prefix: &str, upstream: &str) -> v1::Api {
    v1::Api { name: name.into(), path_prefix: prefix.into(), upstream: upstream.into(), ..Default::default() }
}

fn snapshot(version: u64, apis: Vec<v1::Api>, upstreams: Vec<v1::Upstream>) -> v1::Snapshot {
    v1::Snapshot { version, apis, upstreams, ..Default::default() }
}

#[tokio::test]
async fn routes_by_host_path_and_method_with_problem_details() -> Result<()> {
    let a = Upstream::start("a").await?;
    let b = Upstream::start("b").await?;
    let s = snapshot(
        1,
        vec![
            v1::Api { strip_prefix: true, ..api("shop", "/shop", "ua") },
            v1::Api { hosts: vec!["admin.example.com".into()], methods: vec!["GET".into()], ..api("admin", "/", "ub") },
            v1::Api { hosts: vec!["*.wild.test".into()], preserve_host: true, ..api("wild", "/", "ub") },
            v1::Api {
                paths: vec!["/catalog/items/{id}".into()],
                methods: vec!["GET".into(), "PUT".into()],
                ..api("items", "/catalog", "ua")
            },
        ],
        vec![upstream("ua", &[&a]), upstream("ub", &[&b])],
    );
    let proxy = Gateway::start(&s).await?;
    let c = client();

    let (status, _, body) = send(c.get(proxy.url("/shop/products?q=1")).header("x-forwarded-for", "1.2.3.4")).await?;
    assert_eq!(status, 200);
    assert_eq!(body["upstream"], "a");
    assert_eq!(body["path"], "/products?q=1", "strip_prefix keeps the query");
    assert_eq!(body["headers"]["x-forwarded-for"], "1.2.3.4, 127.0.0.1");
    assert_eq!(body["headers"]["x-forwarded-proto"], "http");
    assert_eq!(body["headers"]["x-forwarded-host"], proxy.http.to_string());
    assert_eq!(body["headers"]["host"], a.addr.to_string(), "Host is the target's without preserve_host");
    assert!(body["headers"]["via"].as_str().unwrap_or("").contains("sluice"));

    // h2c with prior knowledge reaches the same route, forwarded as HTTP/1.1.
    let h2 = reqwest::Client::builder().http2_prior_knowledge().build()?;
    let response = h2.get(proxy.url("/shop/h2")).send().await?;
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    let body: Value = response.json().await?;
    assert_eq!((body["upstream"].as_str(), body["path"].as_str()), (Some("a"), Some("/h2")));
    assert_eq!(body["headers"]["via"], "2 sluice");
    // Its host came in `:authority`, not `Host`: the forwarding fields name it all the same.
    assert_eq!(body["headers"]["x-forwarded-host"], proxy.http.to_string());
    assert_eq!(body["headers"]["host"], a.addr.to_string());
    // So does one whose first bytes arrive alone, too few to tell HTTP/2 from HTTP/1.1.
    let relay = relay_splitting_after(proxy.http, 5).await?;
    let response = h2.get(format!("http://{relay}/shop/h2-in-pieces")).send().await?;
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    let body: Value = response.json().await?;
    assert_eq!(body["path"], "/h2-in-pieces");

    let (status, _, body) = send(c.get(proxy.url("/")).header("host", "admin.example.com")).await?;
    assert_eq!((status, body["upstream"].as_str()), (200, Some("b")));

    let (status, _, body) = send(c.get(proxy.url("/x")).header("host", "deep.down.wild.test:8080")).await?;
    assert_eq!((status, body["upstream"].as_str()), (200, Some("b")));
    assert_eq!(body["headers"]["host"], "deep.down.wild.test:8080", "preserve_host");

    let (status, _, body) = send(c.get(proxy.url("/catalog/items/42"))).await?;
    assert_eq!((status, body["upstream"].as_str(), body["path"].as_str()), (200, Some("a"), Some("/catalog/items/42")));

    // Wrong method: 405 with Allow and a problem body.
    for (req, allow) in [
        (c.post(proxy.url("/")).header("host", "admin.example.com"), "GET"),
        (c.delete(proxy.url("/catalog/items/42")), "GET, PUT"),
    ] {
        let (status, headers, body) = send(req).await?;
        assert_eq!(status, 405);
        assert_eq!(headers["allow"], allow);
        assert_eq!(headers["content-type"], "application/problem+json");
        assert_eq!(body["status"], 405);
    }
    // Unknown route: 404 problem.
    for path in ["/nothing", "/catalog/other", "/shopping"] {
        let (status, headers, body) = send(c.get(proxy.url(path))).await?;
        assert_eq!(status, 404, "{path}");
        assert_eq!(headers["content-type"], "application/problem+json");
        assert_eq!(body["title"], "No route matches the request");
    }
    proxy.shutdown().await
}

/// A pick by a header or a cookie reads the client's field, also for a
/// request whose fields otherwise stay out of the header map until the
/// target's writer (an API without policies).
#[tokio::test]
async fn a_consistent_hash_on_a_header_or_cookie_keeps_each_client_on_one_target() -> Result<()> {
    let (a, b, c_up) = (Upstream::start("a").await?, Upstream::start("b").await?, Upstream::start("c").await?);
    let hashed = |name: &str, source: v1::HashSource, on: &str| {
        let mut pool = upstream(name, &[&a, &b, &c_up]);
        pool.set_balance(v1::Balance::ConsistentHash);
        pool.hash_on = Some(v1::HashOn { source: source as i32, name: on.into() });
        pool
    };
    let pools = vec![
        hashed("by-header", v1::HashSource::Header, "x-user"),
        hashed("by-cookie", v1::HashSource::Cookie, "session"),
    ];
    let s = snapshot(1, vec![api("header", "/header", "by-header"), api("cookie", "/cookie", "by-cookie")], pools);
    let proxy = Gateway::start(&s).await?;
    let c = client();
    for (path, field) in [("/header", "x-user"), ("/cookie", "cookie")] {
        let mut seen: HashMap<String, HashSet<String>> = HashMap::new();
        for user in 0..8 {
            let value =
                if field == "cookie" { format!("theme=dark; session=user{user}") } else { format!("user{user}") };
            for _ in 0..4 {
                let (status, _, body) = send(c.get(proxy.url(path)).header(field, &value)).await?;
                assert_eq!(status, 200);
                seen.entry(value.clone()).or_default().insert(body["upstream"].as_str().unwrap_or("?").to_owned());
            }
        }
        for (value, targets) in &seen {
            assert_eq!(targets.len(), 1, "{path} {value}: {targets:?}");
        }
    }
    proxy.shutdown().await
}

#[tokio::test]
async fn round_robin_spreads_and_health_checks_eject_and_readmit() -> Result<()> {
    let a = Upstream::start("a").await?;
    let b = Upstream::start("b").await?;
    let c_up = Upstream::start("c").await?;
    let mut pool = upstream("u", &[&a, &b, &c_up]);
    pool.health_check = Some(v1::ActiveHealthCheck {
        path: "/health".into(),
        interval_ms: 100,
        timeout_ms: 200,
        healthy_threshold: 2,
        unhealthy_threshold: 2,
    });
    let s = snapshot(1, vec![api("all", "/", "u")], vec![pool]);
    let proxy = Gateway::start(&s).await?;
    let c = client();

    let mut counts: HashMap<String, usize> = HashMap::new();
    for _ in 0..30 {
        let (status, _, body) = send(c.get(proxy.url("/rr"))).await?;
        assert_eq!(status, 200);
        *counts.entry(body["upstream"].as_str().unwrap_or("?").to_string()).or_default() += 1;
    }
    assert_eq!(counts, HashMap::from([("a".into(), 10), ("b".into(), 10), ("c".into(), 10)]));

    // Kill c: the checks eject it, after which every request succeeds on a or b.
    let c_addr = c_up.addr;
    c_up.kill();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut clean_streak = 0;
    while clean_streak < 12 {
        if Instant::now() > deadline {
            bail!("c was not ejected in time");
        }
        let (status, _, body) = send(c.get(proxy.url("/rr"))).await?;
        if status == 200 && body["upstream"] != "c" {
            clean_streak += 1;
        } else {
            clean_streak = 0;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Bring c back on the same port: the checks re-admit it.
    let _c_again = Upstream::start_on("c", c_addr).await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _, body) = send(c.get(proxy.url("/rr"))).await?;
        assert_eq!(status, 200);
        if body["upstream"] == "c" {
            break;
        }
        if Instant::now() > deadline {
            bail!("c was not re-admitted in time");
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    proxy.shutdown().await
}

#[tokio::test]
async fn upstream_failures_map_to_502_503_504_quickly() -> Result<()> {
    let slow = Upstream::start("slow").await?;
    // A port with nothing listening: bind, note the address, close.
    let closed = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    let dead = v1::Upstream {
        name: "dead".into(),
        targets: vec![v1::Target { url: format!("http://{closed}"), weight: 1 }],
        passive_health_check: Some(v1::PassiveHealthCheck {
            consecutive_failures: 1,
            ejection_ms: 10_000,
            unhealthy_statuses: vec![],
        }),
        ..Default::default()
    };
    let s = snapshot(
        1,
        vec![api("dead", "/dead", "dead"), v1::Api { request_timeout_ms: 200, ..api("slow", "/slow-api", "slow") }],
        vec![dead, upstream("slow", &[&slow])],
    );
    let proxy = Gateway::start(&s).await?;
    let c = client();

    let started = Instant::now();
    let (status, headers, body) = send(c.get(proxy.url("/dead/x"))).await?;
    assert_eq!(status, 502);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(body["request_id"].is_string());
    assert!(!body.to_string().contains(&closed.to_string()), "no internals in the body: {body}");
    // Passive ejection after one failure: now nothing is healthy.
    let (status, _, _) = send(c.get(proxy.url("/dead/x"))).await?;
    assert_eq!(status, 503);
    assert!(started.elapsed() < Duration::from_secs(2), "failures must be quick: {:?}", started.elapsed());

    let (status, _, body) = send(c.get(proxy.url("/slow-api/slow"))).await?;
    assert_eq!((status, body["status"].as_u64()), (504, Some(504)));
    proxy.shutdown().await
}

#[tokio::test]
async fn snapshot_swaps_under_load_drop_nothing_and_in_flight_finishes_on_old_table() -> Result<()> {
    let a = Upstream::start("a").await?;
    let b = Upstream::start("b").await?;
    let build = |version: u64, with_old: bool| {
        let mut apis = vec![v1::Api { retries: (version % 3) as u32, ..api("main", "/main", "u") }];
        if with_old {
            apis.push(api("old", "/old", "u"));
        }
        snapshot(version, apis, vec![upstream("u", &[&a, &b])])
    };
    let proxy = Gateway::start(&build(1, true)).await?;
    let c = client();
    let swaps = || async {
        let metrics = client().get(format!("http://{}/metrics", proxy.ops)).send().await?.text().await?;
        Ok::<_, anyhow::Error>(metric_sum(&metrics, "sluice_snapshot_swaps_total").unwrap_or(0.0))
    };
    let swaps_before = swaps().await?;

    // A slow request starts on table 1; the API it uses is removed meanwhile.
    let slow = tokio::spawn(send(c.get(proxy.url("/old/slow"))));
    slow_request_arrived(&[&a, &b]).await?;

    let mut load = JoinSet::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    for _ in 0..4 {
        let (c, url, stop_rx) = (c.clone(), proxy.url("/main/ping"), stop_rx.clone());
        load.spawn(async move {
            let mut sent = 0usize;
            while !*stop_rx.borrow() {
                let response = c.get(&url).send().await.context("request failed")?;
                if response.status() != 200 {
                    bail!("status {} during swaps", response.status());
                }
                sent += 1;
            }
            Ok::<_, anyhow::Error>(sent)
        });
    }
    for version in 2..=101 {
        proxy.apply(&build(version, false)).await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(swaps().await? - swaps_before, 100.0, "every snapshot was swapped in");
    let _ = stop_tx.send(true);
    let mut total = 0;
    while let Some(result) = load.join_next().await {
        total += result??;
    }
    assert!(total > 50, "too little load: {total}");

    let (status, _, body) = slow.await??;
    assert_eq!((status, body["path"].as_str()), (200, Some("/old/slow")), "in-flight request finished on table 1");
    let (status, _, _) = send(c.get(proxy.url("/old/x"))).await?;
    assert_eq!(status, 404, "the new table no longer routes /old");
    proxy.shutdown().await
}

#[tokio::test]
async fn upgrade_is_tunnelled_and_shutdown_is_graceful() -> Result<()> {
    let a = Upstream::start("a").await?;
    let proxy = Gateway::start(&snapshot(1, vec![api("ws", "/", "u")], vec![upstream("u", &[&a])])).await?;

    let mut stream = TcpStream::connect(proxy.http).await?;
    stream.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n").await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await? == 0 {
            bail!("connection closed during the handshake: {}", String::from_utf8_lossy(&head));
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    stream.write_all(b"ping through the tunnel").await?;
    let mut echoed = [0u8; 23];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut echoed)).await??;
    assert_eq!(&echoed, b"ping through the tunnel");

    // A slow request in flight when shutdown starts still completes.
    let c = client();
    let slow = tokio::spawn(send(c.get(proxy.url("/slow"))));
    slow_request_arrived(&[&a]).await?;
    let addr = proxy.http;
    proxy.shutdown().await?;
    let (status, _, _) = slow.await??;
    assert_eq!(status, 200);
    assert!(TcpStream::connect(addr).await.is_err(), "listener closed after shutdown");
    Ok(())
}

/// An upstream that counts the connections it accepted and can close every
/// open one at once, the way a server's keep-alive timeout closes idle ones.
struct CountingUpstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    /// Connections accepted and not yet closed.
    open: Arc<AtomicUsize>,
    close_all: tokio::sync::watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl CountingUpstream {
    async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (close_all, closing) = tokio::sync::watch::channel(0u64);
        let (counter, still_open) = (accepted.clone(), open.clone());
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                still_open.fetch_add(1, Ordering::SeqCst);
                let still_open = still_open.clone();
                let mut closing = closing.clone();
                closing.mark_unchanged();
                connections.spawn(async move {
                    let service = service_fn(move |req| echo("counting", req));
                    let connection =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = connection => {}
                        _ = closing.changed() => {}
                    }
                    still_open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Ok(CountingUpstream { addr, accepted, open, close_all, task })
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Closes every open connection and waits until they are all closed.
    async fn close_all(&self) -> Result<()> {
        self.close_all.send_modify(|generation| *generation += 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.open.load(Ordering::SeqCst) > 0 {
            if Instant::now() > deadline {
                bail!("the upstream's connections did not close");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}

impl Drop for CountingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn upstream_connections_are_reused_and_ones_closed_by_the_upstream_replaced() -> Result<()> {
    let up = CountingUpstream::start().await?;
    let target = v1::Target { url: format!("http://{}", up.addr), weight: 1 };
    let u = v1::Upstream { name: "u".into(), targets: vec![target], ..Default::default() };
    let proxy = Gateway::start(&snapshot(1, vec![api("a", "/", "u")], vec![u])).await?;
    let c = client();

    // One request after another: one upstream connection carries them all,
    // bodies both ways included.
    for i in 0..20 {
        let (status, _, body) = send(c.post(proxy.url(&format!("/seq/{i}"))).body(format!("body {i}"))).await?;
        assert_eq!((status, body["path"].as_str()), (200, Some(format!("/seq/{i}").as_str())));
    }
    assert_eq!(up.accepted(), 1, "sequential requests must reuse the upstream connection");

    // Concurrent requests need more connections, but never more than requests.
    let mut concurrent = JoinSet::new();
    for i in 0..10 {
        concurrent.spawn(send(c.get(proxy.url(&format!("/par/{i}")))));
    }
    while let Some(result) = concurrent.join_next().await {
        assert_eq!(result??.0, 200);
    }
    let after_burst = up.accepted();
    assert!((1..=11).contains(&after_burst), "{after_burst} connections for 10 concurrent requests");

    // The upstream closes every idle connection: the next requests go out on
    // new connections instead of failing on the closed ones.
    up.close_all().await?;
    for i in 0..5 {
        let (status, _, _) = send(c.get(proxy.url(&format!("/after-close/{i}")))).await?;
        assert_eq!(status, 200, "request {i} after the upstream closed its connections");
    }
    assert_eq!(up.accepted(), after_burst + 1, "one new connection serves the requests that follow");
    proxy.shutdown().await
}

/// A raw HTTP/1.1 upstream that counts the connections it accepts and reads
/// each request head; then, while `drops_left` is above zero, it closes the
/// connection without answering, otherwise it sends `answer`.
async fn raw_upstream(
    drops_left: Arc<AtomicUsize>,
    answer: &'static [u8],
) -> Result<(SocketAddr, Arc<AtomicUsize>, JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let drops_left = drops_left.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&chunk[..n]),
                        }
                    }
                    head.clear();
                    if drops_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                        return;
                    }
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok((addr, accepted, task))
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

#[tokio::test]
async fn a_request_without_a_response_is_retried_only_when_it_may_be_sent_again() -> Result<()> {
    let drops_left = Arc::new(AtomicUsize::new(0));
    let (addr, _, upstream_task) = raw_upstream(drops_left.clone(), OK).await?;
    let target = v1::Target { url: format!("http://{addr}"), weight: 1 };
    let u = v1::Upstream { name: "u".into(), targets: vec![target], ..Default::default() };
    let apis = vec![v1::Api { retries: 1, ..api("retry", "/retry", "u") }, api("once", "/once", "u")];
    let proxy = Gateway::start(&snapshot(1, apis, vec![u])).await?;
    let c = client();

    // The target closes the connection instead of answering: a GET with
    // retries allowed goes again and gets the answer.
    drops_left.store(1, Ordering::SeqCst);
    let response = c.get(proxy.url("/retry/x")).send().await?;
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await?, "ok");
    assert_eq!(drops_left.load(Ordering::SeqCst), 0, "the first attempt reached the target");

    // Without retries it is a 502...
    drops_left.store(1, Ordering::SeqCst);
    assert_eq!(c.get(proxy.url("/once/x")).send().await?.status(), 502);
    // ...and so is a request with a body, which is never sent twice.
    drops_left.store(1, Ordering::SeqCst);
    assert_eq!(c.post(proxy.url("/retry/x")).body("order #1").send().await?.status(), 502);
    assert_eq!(drops_left.load(Ordering::SeqCst), 0);

    upstream_task.abort();
    proxy.shutdown().await
}

#[tokio::test]
async fn a_connection_is_not_reused_past_the_keep_alive_timeout_the_upstream_announces() -> Result<()> {
    // Node.js servers announce `Keep-Alive: timeout=5` and close idle
    // connections then; here 2 s, which the proxy takes as 1 s.
    let answer = b"HTTP/1.1 200 OK\r\nkeep-alive: timeout=2\r\ncontent-length: 2\r\n\r\nok";
    let (addr, accepted, upstream_task) = raw_upstream(Arc::new(AtomicUsize::new(0)), answer).await?;
    let target = v1::Target { url: format!("http://{addr}"), weight: 1 };
    let u = v1::Upstream { name: "u".into(), targets: vec![target], ..Default::default() };
    let proxy = Gateway::start(&snapshot(1, vec![api("a", "/", "u")], vec![u])).await?;
    let c = client();

    for _ in 0..3 {
        assert_eq!(c.get(proxy.url("/x")).send().await?.status(), 200);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "reused within the announced timeout");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(c.get(proxy.url("/x")).send().await?.status(), 200);
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "a new connection once the announced timeout is near");

    upstream_task.abort();
    proxy.shutdown().await
}

/// Reads until the proxy closes the connection: what arrived, and when the
/// first bytes and the close came (measured from `since`).
async fn read_until_closed(stream: &mut TcpStream, since: Instant) -> Result<(String, Option<Duration>, Duration)> {
    let mut received = Vec::new();
    let mut first = None;
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .context("the proxy kept an idle connection open")??;
        if n == 0 {
            return Ok((String::from_utf8_lossy(&received).into_owned(), first, since.elapsed()));
        }
        first.get_or_insert_with(|| since.elapsed());
        received.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn idle_client_connections_are_closed_but_slow_requests_are_not() -> Result<()> {
    let a = Upstream::start("a").await?;
    let snap = snapshot(1, vec![api("shop", "/shop", "backend")], vec![upstream("backend", &[&a])]);
    let idle_timeout = Duration::from_secs(1);
    let proxy =
        Gateway::start_with(&snap, |settings| settings.client_idle_timeout_secs = idle_timeout.as_secs()).await?;

    // A request that takes longer than the idle timeout (the upstream waits
    // 1.5 s) is answered; the kept-alive connection closes once it has been
    // idle for the timeout after that.
    let mut stream = TcpStream::connect(proxy.http).await?;
    let started = Instant::now();
    stream.write_all(b"GET /shop/slow?ms=1500 HTTP/1.1\r\nhost: test\r\n\r\n").await?;
    let (received, answered, closed) = read_until_closed(&mut stream, started).await?;
    assert!(received.starts_with("HTTP/1.1 200"), "the slow request is answered: {received}");
    let answered = answered.context("no response")?;
    assert!(answered >= Duration::from_millis(1500), "answered after the upstream's delay");
    // Half the timeout as margin: the two sides' clocks start a little apart.
    let margin = idle_timeout / 2;
    assert!(closed >= answered + margin, "closed {closed:?}, answered {answered:?}: too early");

    // A client that never finishes its request head is cut off too, and nothing reaches the upstream.
    let mut stream = TcpStream::connect(proxy.http).await?;
    let started = Instant::now();
    stream.write_all(b"GET /shop/never HTTP/1.1\r\nhost: te").await?;
    let (received, _, closed) = read_until_closed(&mut stream, started).await?;
    assert!(!received.starts_with("HTTP/1.1 200"), "an unfinished request is not forwarded: {received}");
    assert!(closed >= margin, "closed after {closed:?}, before the timeout");

    // So is one that never sends a byte.
    let mut stream = TcpStream::connect(proxy.http).await?;
    let started = Instant::now();
    let (received, _, closed) = read_until_closed(&mut stream, started).await?;
    assert_eq!(received, "", "nothing was asked, nothing is answered");
    assert!(closed >= margin, "closed after {closed:?}, before the timeout");

    // A connection in use keeps being served.
    let c = client();
    for _ in 0..3 {
        assert_eq!(c.get(proxy.url("/shop/x")).send().await?.status(), 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    proxy.shutdown().await
}
