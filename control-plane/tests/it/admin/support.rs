//! Test harness for the admin API: a real `Store` (a temp SQLite file, or a fresh PostgreSQL database per test),
//! the router served by `axum::serve` on 127.0.0.1:0, and a reqwest client talking to it over a socket.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sluice_control_plane::admin::{AdminState, ParseHook, router_with_parse_hook};
use sluice_control_plane::secrets::SecretBox;
use sluice_control_plane::store::Store;
use sluice_control_plane::tokens::TokenDigest;
use sluice_testkit::postgres::FreshDatabase;

pub const TOKEN: &str = "test-admin-token-0123456789";

/// Runs one scenario on SQLite and on PostgreSQL: `both!(name, scenario)` makes `name::sqlite` and
/// `name::postgres`. The PostgreSQL variant needs `SLUICE_TEST_DATABASE_URL`; without it the test says so and
/// passes, except under `CI=true`, where a missing database is a failure (`sluice_testkit::postgres`).
macro_rules! both {
    ($name:ident, $scenario:ident) => {
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                let server = $crate::admin::support::Server::sqlite().await;
                super::$scenario(&server).await;
                server.finish().await;
            }

            #[tokio::test]
            async fn postgres() {
                let Some(server) = $crate::admin::support::Server::postgres().await else { return };
                super::$scenario(&server).await;
                server.finish().await;
            }
        }
    };
}
pub(crate) use both;

pub struct Server {
    pub base: String,
    pub http: reqwest::Client,
    pub store: Store,
    serve: tokio::task::JoinHandle<()>,
    _dir: Option<tempfile::TempDir>,
    /// Dropped (database and all) with the server.
    _postgres: Option<FreshDatabase>,
}

/// A response read to the end.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts a problem-details answer with this status and problem type slug; returns the body.
    pub fn problem(&self, status: u16, slug: &str) -> Value {
        assert_eq!(self.status.as_u16(), status, "unexpected status; body: {}", self.text);
        assert_eq!(self.header("content-type"), Some("application/problem+json"), "body: {}", self.text);
        let body = self.json();
        assert_eq!(body["type"], format!("https://sluice.dev/problems/{slug}"), "body: {body}");
        assert_eq!(body["status"], status, "body: {body}");
        body
    }

    pub fn expect(&self, status: u16) -> Value {
        assert_eq!(self.status.as_u16(), status, "unexpected status; body: {}", self.text);
        if self.text.is_empty() { Value::Null } else { self.json() }
    }
}

fn secrets() -> SecretBox {
    SecretBox::from_key_material(&"42".repeat(32)).unwrap_or_else(|e| panic!("secret key: {e}"))
}

impl Server {
    pub async fn sqlite() -> Server {
        Self::sqlite_with_parse_hook(None).await
    }

    pub async fn postgres() -> Option<Server> {
        Self::postgres_with_parse_hook(None).await
    }

    /// A server whose request bodies run `hook` on the blocking pool before they are parsed.
    pub async fn sqlite_with_parse_hook(hook: Option<ParseHook>) -> Server {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store = Store::open(&url, secrets()).await.unwrap_or_else(|e| panic!("open {url}: {e}"));
        Self::start(store, Some(dir), None, hook).await
    }

    pub async fn postgres_with_parse_hook(hook: Option<ParseHook>) -> Option<Server> {
        let database = FreshDatabase::create("admin").await.unwrap_or_else(|e| panic!("{e:#}"))?;
        let store = Store::open(&database.url, secrets()).await.unwrap_or_else(|e| panic!("open postgres store: {e}"));
        Some(Self::start(store, None, Some(database), hook).await)
    }

    async fn start(
        store: Store,
        dir: Option<tempfile::TempDir>,
        postgres: Option<FreshDatabase>,
        hook: Option<ParseHook>,
    ) -> Server {
        let state = AdminState {
            store: store.clone(),
            admin_token: TokenDigest::of(TOKEN),
            stale_after: Duration::from_secs(30),
            telemetry: Default::default(),
        };
        let app = router_with_parse_hook(state, hook);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("local addr: {e}"));
        let serve = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap_or_else(|e| panic!("client: {e}"));
        Server { base: format!("http://{addr}"), http, store, serve, _dir: dir, _postgres: postgres }
    }

    /// Stops the server and closes the store; a PostgreSQL test database is dropped with `self`.
    pub async fn finish(self) {
        self.serve.abort();
        self.store.close().await;
    }

    /// An authenticated request with an optional JSON body.
    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Reply {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(body);
        }
        reply(request).await
    }

    /// An authenticated request with a raw body and content type.
    pub async fn raw(&self, method: Method, path: &str, content_type: &str, body: impl Into<reqwest::Body>) -> Reply {
        let request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .header(CONTENT_TYPE, content_type)
            .body(body);
        reply(request).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.call(Method::GET, path, None).await
    }
    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.call(Method::POST, path, Some(body)).await
    }
    pub async fn put(&self, path: &str, body: &Value) -> Reply {
        self.call(Method::PUT, path, Some(body)).await
    }
    pub async fn patch(&self, path: &str, body: &Value) -> Reply {
        self.raw(Method::PATCH, path, "application/merge-patch+json", body.to_string()).await
    }
    pub async fn delete(&self, path: &str) -> Reply {
        self.call(Method::DELETE, path, None).await
    }

    /// Creates the upstream `backend` (to 127.0.0.1:9001) that the API scenarios point at; the version that
    /// committed it.
    pub async fn backend(&self) -> u64 {
        let upstream = serde_json::json!({ "name": "backend", "targets": [{ "url": "http://127.0.0.1:9001" }] });
        self.post("/v1/upstreams", &upstream).await.expect(201);
        self.version().await
    }

    /// The latest committed configuration version, from the snapshot history.
    pub async fn version(&self) -> u64 {
        let page = self.get("/v1/snapshots?limit=1").await.expect(200);
        page["items"][0]["version"].as_u64().unwrap_or_else(|| panic!("no version in {page}"))
    }
}

pub async fn reply(request: reqwest::RequestBuilder) -> Reply {
    let response = request.send().await.unwrap_or_else(|e| panic!("request failed: {e}"));
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap_or_else(|e| panic!("reading the body: {e}"));
    Reply { status, headers, text }
}

/// The Fruitshop spec from the shared fixtures, read at test time.
pub fn fruitshop() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/fruitshop/fruitshop-v2-2-0.oas.yml");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// A self-signed certificate and its key, as PEM.
pub fn certificate_pem(dns_name: &str) -> (String, String) {
    let generated = rcgen::generate_simple_self_signed(vec![dns_name.to_string()])
        .unwrap_or_else(|e| panic!("generate certificate: {e}"));
    (generated.cert.pem(), generated.signing_key.serialize_pem())
}

/// Collects log output of the current thread, for asserting that no secret is ever logged.
#[derive(Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().map(|b| b.clone()).unwrap_or_default()).into_owned()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut captured) = self.0.lock() {
            captured.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
