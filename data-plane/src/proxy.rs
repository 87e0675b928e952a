//! The proxy listeners, the data plane's request path from accept to response:
//! accept (plain, or TLS with the certificate picked by SNI) -> HTTP/1.1
//! (`http1` for the usual request, hyper for the rest) or HTTP/2 (hyper) ->
//! load the routing table once -> the canonical path and host
//! (`inbound`) -> route match -> the API's policy
//! chain (`policy`) around the forward to an upstream target -> access log,
//! metrics and the request's span (`trace`). Graceful: on shutdown it stops
//! accepting and lets open connections finish.

mod balance;
mod client_body;
mod connection;
mod forward;
mod http1;
mod idle;
mod inbound;
mod log;
mod tls_server;
mod when_woken;
pub mod workers;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use sluice_proto::path::PathError;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

pub use inbound::{DEFAULT_HEADER_LIMITS, HeaderLimits};
pub use log::LoggedBody;
pub use tls_server::{TlsSetupError, tls_server_config};

use crate::base::http1_wire::HeadFields;
use crate::base::{BodyStatus, Origin, ProxyBody, ProxyError, RequestBody, RequestId};
use crate::policy::{Findings, RequestContext};
use crate::routing::{CompiledApi, RouteMiss, RoutingTable, TableStore};
use crate::trace::Tracer;
use balance::Seat;
use connection::Protocols;
use idle::ActiveRequest;
use inbound::HopByHop;
use log::{Exchange, RequestPath};

/// Settings of the proxy listener (from the data plane's settings).
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// Write one JSON line per request to stdout.
    pub access_log: bool,
    /// Sent upstream in `X-Forwarded-Proto`: the scheme this listener serves.
    pub scheme: &'static str,
    /// A client connection with no request in flight for this long is closed
    /// (this also bounds how long a client may take to send a request head).
    pub idle_timeout: Duration,
    /// What a client's request headers may be.
    pub headers: HeaderLimits,
    /// The longest a client may take to send a request's whole body,
    /// counted from its head (see `client_body`).
    pub client_body_timeout: Duration,
    /// The header carrying the request ID in both directions (see `base::RequestId`).
    pub request_id_header: HeaderName,
    /// Starts each request's span; `None` (tracing off) costs a request nothing.
    pub tracer: Option<Arc<Tracer>>,
}

/// How long an idle client connection is kept open unless configured.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The request-ID header unless configured.
pub const DEFAULT_REQUEST_ID_HEADER: &str = "x-request-id";

/// How long a client may take to send a request body unless configured.
pub const DEFAULT_CLIENT_BODY_TIMEOUT: Duration = Duration::from_secs(60);

impl ProxyOptions {
    /// The same options for the HTTPS listener.
    fn over_tls(self) -> Self {
        ProxyOptions { scheme: "https", ..self }
    }
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            access_log: true,
            scheme: "http",
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            headers: DEFAULT_HEADER_LIMITS,
            client_body_timeout: DEFAULT_CLIENT_BODY_TIMEOUT,
            request_id_header: HeaderName::from_static(DEFAULT_REQUEST_ID_HEADER),
            tracer: None,
        }
    }
}

/// Back-off after a failed accept (e.g. out of file descriptors), so the loop
/// does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// A client that connects and never finishes its handshake must not hold a
/// task and a socket forever.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

struct Shared {
    tables: Arc<TableStore>,
    options: ProxyOptions,
}

/// The accept loop of one proxy worker on one listener; `tls` set means a
/// handshake first. On `shutdown` it stops accepting, asks every open
/// connection to close after its in-flight requests, and returns once they
/// all have. The worker accepts through its `seat`, only while it has its
/// share of the connections (see `balance`).
async fn serve_listener(
    listener: TcpListener,
    tables: Arc<TableStore>,
    options: ProxyOptions,
    tls: Option<TlsAcceptor>,
    seat: Seat,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let protocols = Arc::new(Protocols::new(tls.is_some(), &options.headers));
    let shared = Arc::new(Shared { tables, options });
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection task holds a sender; `recv` returns None once all are gone.
    let (open_tx, mut open_rx) = mpsc::channel::<()>(1);

    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = accept(&listener, &seat) => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        // Proxied traffic is latency-bound; small writes must not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let protocols = protocols.clone();
        let stop_rx = stop_rx.clone();
        // Dropped when the connection ends: tells shutdown, and the worker balance.
        let open = (open_tx.clone(), seat.hold());
        // Two task types, not one with a branch: a task is as large as its
        // largest state, and a plain connection must not carry the room a TLS
        // handshake and session need (kilobytes per open connection).
        match &tls {
            None => {
                tokio::spawn(async move {
                    connection::serve(stream, peer, shared, &protocols, stop_rx).await;
                    drop(open);
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // The handshake runs in the connection's task so a slow
                    // client never stalls the accept loop; shutdown abandons it.
                    let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream));
                    tokio::select! {
                        result = handshake => match result {
                            Ok(Ok(stream)) => connection::serve(stream, peer, shared, &protocols, stop_rx).await,
                            Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                            Err(_) => debug!(%peer, "TLS handshake timed out"),
                        },
                        () = workers::stopped(stop_rx.clone()) => {}
                    }
                    drop(open);
                });
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(open_tx);
    let _ = open_rx.recv().await;
    Ok(())
}

async fn accept(listener: &TcpListener, seat: &Seat) -> std::io::Result<(TcpStream, SocketAddr)> {
    seat.turn().await;
    listener.accept().await
}

/// The client's address, with its `X-Forwarded-For` form built once per
/// connection, and the connection's TLS version.
#[derive(Debug, Clone)]
struct Peer {
    ip: IpAddr,
    forwarded_for: HeaderValue,
    tls: Option<&'static str>,
}

impl Peer {
    fn new(ip: IpAddr, tls: Option<&'static str>) -> Self {
        // An address always makes a valid header value; the fallback is never used.
        let forwarded_for = HeaderValue::from_str(&ip.to_string()).unwrap_or(HeaderValue::from_static("unknown"));
        Peer { ip, forwarded_for, tls }
    }
}

/// One request, from its head to the response ready for the client, for
/// hyper's connections: the exchange goes with the response's body, which
/// hyper polls after this has returned. `body` is the status of the
/// request's body, when it has one (see `client_body::watch`); `started` is
/// when its head had arrived.
#[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see answer)")]
fn handle(
    mut request: Request<RequestBody>,
    body: Option<BodyStatus>,
    started: Instant,
    shared: Arc<Shared>,
    peer: Peer,
    active: ActiveRequest,
) -> impl Future<Output = Result<Response<LoggedBody>, Infallible>> {
    async move {
        let (mut exchange, echo) = begin(&mut request, body, started, &shared, &peer, active, false, None);
        let response = answer(request, None, echo, &shared, &peer, &mut exchange).await;
        Ok(response.map(|body| LoggedBody::new(body, exchange)))
    }
}

/// What every request starts with, before anything can refuse it: its ID
/// (the client's, or a new one) and span, and the exchange that follows it
/// to its log line. Also the client's ID as a header value, to echo, when
/// the request's fields are in its map. `fields_as_sent`: see
/// `log::Exchange::fields_as_sent`; `as_sent`: the request's fields when
/// they are not in its map (see `HeadFields`); they hold no ID (see
/// `inbound::fields_stay_as_sent`), so a new one goes with them.
#[allow(clippy::too_many_arguments, reason = "each is a part of the request")]
fn begin(
    request: &mut Request<RequestBody>,
    body: Option<BodyStatus>,
    started: Instant,
    shared: &Shared,
    peer: &Peer,
    active: ActiveRequest,
    fields_as_sent: bool,
    as_sent: Option<HeadFields<'_>>,
) -> (Exchange, Option<HeaderValue>) {
    let (request_id, echo) = match as_sent {
        Some(_) => (RequestId::make(), None),
        None => {
            let (id, echo) = inbound::request_id(request.headers_mut(), &shared.options.request_id_header);
            (id, Some(echo))
        }
    };
    // A refusal is traced too. The span's `traceparent` replaces the
    // client's here, so the upstream receives it with the other headers.
    let trace = shared.options.tracer.as_ref().and_then(|tracer| tracer.start(request.headers_mut()));
    let access_log = shared.options.access_log;
    let exchange = Exchange {
        active,
        request_id,
        started,
        client: peer.ip,
        tls: peer.tls,
        version: request.version(),
        method: request.method().clone(),
        // The path as sent shares the client connection's read buffer (see `RequestPath`).
        path: match request.uri().path_and_query() {
            Some(sent) if fields_as_sent => RequestPath::Sent(sent.clone()),
            _ => RequestPath::Copied(request.uri().path().into()),
        },
        host: None,
        user_agent: access_log
            .then(|| match as_sent {
                Some(fields) => fields.values("user-agent").next().map(log::user_agent),
                None => request.headers().get(header::USER_AGENT).map(|value| log::user_agent(value.as_bytes())),
            })
            .flatten(),
        api: None,
        upstream_target: None,
        upstream_status: None,
        upstream_elapsed: None,
        request_body: body,
        consumer: None,
        rate_count: None,
        status: StatusCode::OK,
        grpc_status: None,
        access_log,
        fields_as_sent,
        in_flight: None,
        table: None,
        trace,
    };
    (exchange, echo)
}

/// A request `begin` has made `exchange` of, answered: the response is
/// ready for the client, and `exchange` knows what the log line needs but
/// the end of the body. `echo` and `as_sent`: see `begin`.
///
/// Not an `async fn`, and neither are the steps it awaits: an async fn's
/// future holds each argument twice (as passed, and moved into the body),
/// and this future is held in every open connection's task (`http1`) or
/// allocation (hyper), so every byte counts once per open connection. For
/// the same reason the block uses its arguments as bound here: rebound in
/// the block (`let mut request = request`), one is held twice too.
#[allow(clippy::manual_async_fn, reason = "see the doc comment")]
fn answer<'a>(
    request: Request<RequestBody>,
    as_sent: Option<HeadFields<'a>>,
    mut echo: Option<HeaderValue>,
    shared: &'a Shared,
    peer: &'a Peer,
    exchange: &'a mut Exchange,
) -> impl Future<Output = Response<ProxyBody>> + 'a {
    async move {
        let id_field = &shared.options.request_id_header;
        // Its bytes, not `as_str`, which checks them again as UTF-8.
        let id_text = exchange.request_id;
        let as_sent = as_sent.map(|fields| fields.adding(id_field, id_text.as_ref()));
        let routed = route_and_forward(request, as_sent, &mut echo, shared, peer, exchange).await;
        let mut response = match routed {
            Ok(response) => response,
            Err(error) => {
                let request_id = exchange.request_id.as_str();
                match error.origin() {
                    Origin::Client => debug!(%error, request_id, "request rejected"),
                    Origin::Upstream => {
                        warn!(%error, request_id, api = exchange.api.as_ref().map(|api| api.name.as_str()), "upstream failure")
                    }
                    Origin::Internal => warn!(%error, request_id, "internal proxy error"),
                }
                error.to_response(&exchange.path, request_id)
            }
        };
        // The gateway's ID replaces any the upstream sent: the client must see
        // the one in the logs. So do the policies' fields (`Findings::rate_count`).
        // A target's fields kept as sent get both from the client's writer, after them.
        if response.body().fields_as_sent().is_none() {
            let echo = echo.unwrap_or_else(|| exchange.request_id.to_header());
            response.headers_mut().insert(id_field, echo);
            if let (Some(api), Some(count)) = (&exchange.api, exchange.rate_count) {
                api.policies.set_answer_fields(count, response.headers_mut());
            }
        }
        exchange.status = response.status();
        // gRPC runs over HTTP/2 only: an HTTP/1.1 response is not looked into.
        if exchange.version == http::Version::HTTP_2 {
            exchange.grpc_status = log::grpc_status(response.headers());
        }
        response
    }
}

#[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see proxy::answer)")]
fn route_and_forward<'a>(
    mut request: Request<RequestBody>,
    as_sent: Option<HeadFields<'a>>,
    id_value: &'a mut Option<HeaderValue>,
    shared: &'a Shared,
    peer: &'a Peer,
    exchange: &'a mut Exchange,
) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + 'a {
    async move {
        // One load per request: the whole request, body streaming included, runs
        // on this table even if a newer one is swapped in meanwhile.
        let table = shared.tables.load().ok_or(ProxyError::NotReady)?;
        exchange.table = Some(table.clone());
        // Before routing: routing, policies, validation, the access log and the
        // upstream all see this one path.
        let canonical = inbound::canonicalize_path(&mut request, exchange)?;
        // Before any policy: hop-by-hop headers, and those a client may not
        // send, are gone before auth or header rules set theirs.
        // Fields kept as sent hold nothing it would take (see `inbound::fields_stay_as_sent`).
        let mut taken = match as_sent {
            Some(_) => HopByHop::default(),
            None => inbound::clean_headers(
                request.headers_mut(),
                &shared.options.headers,
                &shared.options.request_id_header,
            )?,
        };
        let host = inbound::request_host(&request, as_sent)?;
        let host = host.as_ref().map(|host| host.name.as_ref());
        if exchange.access_log {
            exchange.host = host.map(Box::from);
        }
        let routed = table.route(host, request.uri().path(), request.method());
        if canonical.encoded_separator && !routed.as_ref().is_ok_and(|api| api.forward_raw_path) {
            return Err(PathError::EncodedSeparator.into());
        }
        let api = match routed {
            Ok(api) => api.clone(),
            Err(RouteMiss::NotFound) => {
                return Err(ProxyError::NoRoute {
                    method: exchange.method.to_string(),
                    path: exchange.path.to_string(),
                });
            }
            Err(RouteMiss::MethodNotAllowed { allow }) => match preflight_route(&table, host, &request, as_sent) {
                Some(api) => api,
                None => {
                    return Err(ProxyError::MethodNotAllowed {
                        method: exchange.method.to_string(),
                        path: exchange.path.to_string(),
                        allow,
                    });
                }
            },
        };
        let raw_path = canonical.raw.filter(|_| api.forward_raw_path);
        taken.upgrade = taken.upgrade.and_then(|upgrade| upgrade.allowed(api.allow_h2c_upgrade));
        exchange.api = Some(api.clone());
        let (api, options) = (api.as_ref(), &shared.options);
        // Without policies, straight to the send (a client-sent
        // X-Consumer-Username is already gone, see `inbound`): the chain's
        // future is larger than the send's it wraps, and would be built and
        // moved anyway. Rewritten here, the request is not moved into
        // `forward`'s future and the send's moved out of it.
        if api.policies.is_empty() {
            let outgoing = forward::Outgoing::rewrite(api, request, as_sent, raw_path, taken, peer, options, exchange)?;
            return forward::send(api, outgoing, peer, exchange).await;
        }
        // The policies read and change the request's fields in its map: only
        // those they name, where they name them all (the rest stay as sent).
        let as_sent = match (api.policies.request_fields_read(), as_sent) {
            (Some(read), Some(fields)) => Some(inbound::moved_into_map(fields, read, request.headers_mut())?),
            (_, mut as_sent) => {
                inbound::into_map(&mut as_sent, request.headers_mut(), &exchange.request_id, id_value)?;
                as_sent
            }
        };
        let body = exchange.request_body.clone();
        let (path, request_id) = (exchange.path.clone(), exchange.request_id);
        let context =
            RequestContext { instance: &path, request_id: &request_id, client_ip: peer.ip, body: body.as_ref() };
        let mut findings = Findings::default();
        let result = {
            let exchange = &mut *exchange;
            api.policies
                .apply(request, context, &mut findings, move |request| {
                    forward::forward(api, request, as_sent, raw_path, taken, peer, options, exchange)
                })
                .await
        };
        exchange.consumer = findings.consumer;
        exchange.rate_count = findings.rate_count;
        result
    }
}

/// A CORS preflight is an OPTIONS request about another method, which the
/// API may not route; it belongs to the API serving the method it asks
/// about, when that API's CORS policy answers preflights.
fn preflight_route<B>(
    table: &RoutingTable,
    host: Option<&str>,
    request: &Request<B>,
    as_sent: Option<HeadFields<'_>>,
) -> Option<Arc<CompiledApi>> {
    if request.method() != Method::OPTIONS {
        return None;
    }
    let requested = match as_sent {
        Some(fields) if fields.values("origin").next().is_some() => {
            fields.values("access-control-request-method").next()
        }
        None if request.headers().contains_key(header::ORIGIN) => {
            request.headers().get(header::ACCESS_CONTROL_REQUEST_METHOD).map(HeaderValue::as_bytes)
        }
        _ => None,
    }?;
    let method = Method::from_bytes(requested).ok()?;
    let api = table.route(host, request.uri().path(), &method).ok()?;
    api.policies.answers_preflights().then(|| api.clone())
}
