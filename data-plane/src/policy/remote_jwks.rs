//! JWKS documents of `jwt.jwks_url`: fetched by the data plane itself, off
//! the request path. One source per URL serves every API that names it and
//! outlives snapshot swaps (a swap must not refetch, nor leave a gap without
//! keys). Its task refreshes the document as `Cache-Control: max-age` says,
//! within bounds, and early when a token names a `kid` the document lacks
//! (at most once per `--jwks-min-refresh-interval-secs`, so a client cannot
//! make the data plane hammer the identity provider). When a fetch fails
//! the last good document keeps serving and the task retries with backoff.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sluice_proto::v1;
use tokio::sync::Notify;

use crate::backoff::Backoff;
use crate::tls::{CertificateSet, UpstreamTls};

/// A refresh sooner than this after the last one is not asked of the issuer,
/// whatever its `max-age`; nor later than the longest.
const SHORTEST_MAX_AGE: Duration = Duration::from_secs(60);
const LONGEST_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// When the issuer sends no `max-age`.
const DEFAULT_MAX_AGE: Duration = Duration::from_secs(600);
/// Real key sets are a few kilobytes.
const MAX_DOCUMENT_BYTES: usize = 512 * 1024;
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_LONGEST: Duration = Duration::from_secs(300);
pub const DEFAULT_MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(30);

type FetchClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Every URL's source, shared by the policies compiled from any snapshot.
#[derive(Debug)]
pub struct RemoteJwksSources {
    sources: Mutex<HashMap<String, Weak<RemoteJwks>>>,
    min_refresh_interval: Duration,
}

impl Default for RemoteJwksSources {
    fn default() -> Self {
        RemoteJwksSources::new(DEFAULT_MIN_REFRESH_INTERVAL)
    }
}

impl RemoteJwksSources {
    pub fn new(min_refresh_interval: Duration) -> Self {
        RemoteJwksSources { sources: Mutex::default(), min_refresh_interval }
    }

    /// The source of `url`, started on first use. Outside a tokio runtime
    /// (unit tests compiling a table) nothing is fetched.
    pub fn source(&self, url: &str) -> Arc<RemoteJwks> {
        let mut sources = self.sources.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(source) = sources.get(url).and_then(Weak::upgrade) {
            return source;
        }
        sources.retain(|_, source| source.strong_count() > 0);
        let source = Arc::new(RemoteJwks {
            url: url.to_string(),
            document: ArcSwapOption::empty(),
            wake: Arc::new(Notify::new()),
            created: Instant::now(),
            last_early_refresh_ms: AtomicU64::new(0),
            min_refresh_interval: self.min_refresh_interval,
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(refresh(Arc::downgrade(&source), source.wake.clone(), url.to_string()));
        }
        sources.insert(url.to_string(), Arc::downgrade(&source));
        source
    }
}

/// One URL's latest good document. Dropped with the last policy naming it,
/// which ends its task.
#[derive(Debug)]
pub struct RemoteJwks {
    url: String,
    document: ArcSwapOption<Fetched>,
    wake: Arc<Notify>,
    created: Instant,
    /// Milliseconds after `created` of the last refresh a token asked for (0: none yet).
    last_early_refresh_ms: AtomicU64,
    min_refresh_interval: Duration,
}

impl RemoteJwks {
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The latest good document; `None` before the first fetch succeeds.
    pub fn document(&self) -> Option<Arc<Fetched>> {
        self.document.load_full()
    }

    /// A token named a key the document lacks: the issuer may have rotated
    /// its keys, so fetch again now, unless that was asked for recently.
    pub fn refresh_early(&self) {
        let now = u64::try_from(self.created.elapsed().as_millis()).unwrap_or(u64::MAX).max(1);
        let last = self.last_early_refresh_ms.load(Ordering::Relaxed);
        let interval = u64::try_from(self.min_refresh_interval.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < interval {
            return;
        }
        if self.last_early_refresh_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            self.wake.notify_one();
        }
    }

    fn store(&self, text: String) {
        let generation = self.document.load().as_ref().map_or(1, |held| held.generation + 1);
        self.document.store(Some(Arc::new(Fetched { generation, text })));
    }
}

impl Drop for RemoteJwks {
    /// The last policy naming the URL is gone: wake the task so that it ends now rather than at its next fetch.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

/// A document as fetched, checked to be a usable key set.
#[derive(Debug)]
pub struct Fetched {
    /// Counts the documents taken, so a policy re-reads its keys only when it changed.
    pub generation: u64,
    pub text: String,
}

/// Why a fetch failed; logged and counted, never shown to clients.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("cannot build the request: {0}")]
    Request(#[from] http::Error),
    #[error("no answer: {0}")]
    Send(#[from] hyper_util::client::legacy::Error),
    #[error("no answer within {FETCH_TIMEOUT:?}")]
    TimedOut,
    #[error("the issuer answered {0}")]
    Status(http::StatusCode),
    #[error("the document could not be read (larger than {MAX_DOCUMENT_BYTES} bytes?): {0}")]
    Body(Box<dyn std::error::Error + Send + Sync>),
    #[error("the document is not a usable JWKS: {0}")]
    Unusable(String),
}

/// The source's task: fetch, wait for the document's age or an early refresh, repeat; after a failure retry with
/// backoff. Ends when no policy holds the source any more.
async fn refresh(source: Weak<RemoteJwks>, wake: Arc<Notify>, url: String) {
    let client = match fetch_client() {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%url, %error, "cannot fetch JWKS documents: no TLS client");
            return;
        }
    };
    let mut retry = Backoff::new(RETRY_FIRST, RETRY_LONGEST);
    loop {
        let wait = match fetch(&client, &url).await {
            Ok((document, max_age)) => {
                let Some(source) = source.upgrade() else { return };
                retry.reset();
                tracing::debug!(%url, ?max_age, "fetched the JWKS document");
                metrics::counter!("sluice_jwks_fetches_total", "url" => url.clone(), "result" => "ok").increment(1);
                source.store(document);
                max_age
            }
            Err(error) => {
                if source.strong_count() == 0 {
                    return;
                }
                let delay = retry.next_delay();
                tracing::warn!(%url, %error, retry_in = ?delay, "cannot fetch the JWKS document; the last good keys stay in use");
                metrics::counter!("sluice_jwks_fetches_total", "url" => url.clone(), "result" => "error").increment(1);
                delay
            }
        };
        // Wakes on an early refresh too; the source bounds how often that is asked.
        let _ = tokio::time::timeout(wait, wake.notified()).await;
        if source.strong_count() == 0 {
            return;
        }
    }
}

/// Plain HTTP or HTTPS against the system's roots, like an upstream without TLS settings.
fn fetch_client() -> Result<FetchClient, crate::tls::UpstreamTlsError> {
    let tls = UpstreamTls::compile(&v1::Upstream::default(), &CertificateSet::default(), true)?;
    Ok(Client::builder(TokioExecutor::new()).build(tls.connector(HttpConnector::new(), false)))
}

async fn fetch(client: &FetchClient, url: &str) -> Result<(String, Duration), FetchError> {
    let request = http::Request::get(url)
        .header(http::header::ACCEPT, "application/jwk-set+json, application/json")
        .header(http::header::USER_AGENT, "sluice-data-plane")
        .body(Empty::new())?;
    let exchange = async {
        let response = client.request(request).await?;
        if !response.status().is_success() {
            return Err(FetchError::Status(response.status()));
        }
        let max_age = max_age(response.headers());
        let body = Limited::new(response.into_body(), MAX_DOCUMENT_BYTES).collect().await.map_err(FetchError::Body)?;
        Ok((body.to_bytes(), max_age))
    };
    let (body, max_age) = tokio::time::timeout(FETCH_TIMEOUT, exchange).await.map_err(|_| FetchError::TimedOut)??;
    let document = String::from_utf8(body.to_vec()).map_err(|e| FetchError::Unusable(e.to_string()))?;
    // Checked here, once, with no algorithm filter: a policy then takes the keys its algorithms accept.
    sluice_proto::jwt::jwks_keys(&document, &[]).map_err(|e| FetchError::Unusable(e.to_string()))?;
    Ok((document, max_age))
}

/// `Cache-Control: max-age`, within bounds; the default without one.
fn max_age(headers: &http::HeaderMap) -> Duration {
    let seconds = headers
        .get_all(http::header::CACHE_CONTROL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|directive| directive.trim().strip_prefix("max-age=")?.trim_matches('"').parse::<u64>().ok());
    seconds.map_or(DEFAULT_MAX_AGE, |s| Duration::from_secs(s).clamp(SHORTEST_MAX_AGE, LONGEST_MAX_AGE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_is_read_and_bounded() {
        let headers = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::CACHE_CONTROL, value.parse().unwrap());
            headers
        };
        assert_eq!(max_age(&http::HeaderMap::new()), DEFAULT_MAX_AGE);
        assert_eq!(max_age(&headers("public, max-age=3600")), Duration::from_secs(3600));
        assert_eq!(max_age(&headers("max-age=5")), SHORTEST_MAX_AGE);
        assert_eq!(max_age(&headers("max-age=99999999")), LONGEST_MAX_AGE);
        assert_eq!(max_age(&headers("no-store")), DEFAULT_MAX_AGE);
    }

    #[test]
    fn early_refreshes_are_bounded_in_rate() {
        let sources = RemoteJwksSources::new(Duration::from_secs(3600));
        let source = sources.source("http://127.0.0.1:1/keys");
        assert!(Arc::ptr_eq(&source, &sources.source("http://127.0.0.1:1/keys")), "one source per URL");
        source.refresh_early();
        let first = source.last_early_refresh_ms.load(Ordering::Relaxed);
        assert_ne!(first, 0);
        std::thread::sleep(Duration::from_millis(5));
        source.refresh_early();
        assert_eq!(source.last_early_refresh_ms.load(Ordering::Relaxed), first, "asked again too soon");
    }

    /// An issuer answering every request with a usable one-key document, fresh for an hour.
    async fn issuer() -> String {
        use base64::Engine as _;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.public_key_raw());
        let body = format!(r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"{x}"}}]}}"#);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/keys", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0u8; 2048];
                let _ = stream.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncache-control: max-age=3600\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(format!("{head}{body}").as_bytes()).await;
            }
        });
        url
    }

    #[tokio::test]
    async fn the_task_ends_with_the_last_policy_naming_the_url() {
        let sources = RemoteJwksSources::default();
        let source = sources.source(&issuer().await);
        let wake = source.wake.clone();
        tokio::time::timeout(Duration::from_secs(10), async {
            while source.document().is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the document was fetched");
        // Held by the source, its task (now waiting out the hour's max-age) and the test.
        assert_eq!(Arc::strong_count(&wake), 3);
        drop(source);
        tokio::time::timeout(Duration::from_secs(10), async {
            while Arc::strong_count(&wake) > 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the refresh task ended without waiting out the max-age");
    }
}
