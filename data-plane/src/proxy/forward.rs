//! Forwarding, after route match and the request side of the policy chain: rewrites the
//! request for the upstream (path, hop-by-hop and forwarding headers), picks a
//! target, sends with timeout and bounded retries, and prepares the response
//! (including the tunnel of an upgraded connection such as a WebSocket).

use futures_util::future::Either;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use hyper_util::rt::TokioIo;

use super::inbound::{self, HopByHop};
use super::log::Exchange;
use super::{Peer, ProxyOptions};
use crate::base::forwarding::{self, Forwarding};
use crate::base::http1_wire::{self, HOP_BY_HOP, HeadFields};
use crate::base::{BodyStatus, ClientFault, ProxyBody, ProxyError, RequestBody, empty_body_request};
use crate::routing::CompiledApi;
use crate::upstream::{InFlight, OwnHeads, SendError, Target, Tried};

/// Forwards the request and returns the upstream's response, ready for the client.
///
/// The rewrite happens here, before the future: the future then holds the
/// rewritten request alone, not it and the client's request (see `proxy::answer`
/// for why its size matters).
///
/// `taken`: what the inbound stage took from the hop-by-hop headers. A
/// protocol switch the API allows is asked of the upstream; a client that
/// accepts trailers (`TE: trailers`) is announced to an HTTP/2 upstream too
/// (gRPC servers may refuse a call without it).
#[allow(
    clippy::too_many_arguments,
    reason = "each is a part of the request; a struct of them would be moved once more"
)]
pub(super) fn forward<'a>(
    api: &'a CompiledApi,
    request: Request<RequestBody>,
    as_sent: Option<HeadFields<'a>>,
    raw_path: Option<PathAndQuery>,
    taken: HopByHop,
    peer: &'a Peer,
    options: &'a ProxyOptions,
    exchange: &'a mut Exchange,
) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + 'a {
    match Outgoing::rewrite(api, request, as_sent, raw_path, taken, peer, options, exchange) {
        Ok(outgoing) => Either::Left(send(api, outgoing, peer, exchange)),
        Err(error) => Either::Right(std::future::ready(Err(error))),
    }
}

/// The client's request rewritten for the upstream, up to what depends on the target.
pub(super) struct Outgoing<'a> {
    method: Method,
    path_and_query: PathAndQuery,
    headers: HeaderMap,
    /// Taken by the attempt that sends it; see `replayable`.
    body: Option<RequestBody>,
    /// A request without a body can be re-sent as is; one with a streamed
    /// body cannot (the first attempt consumes it), so it is never retried.
    replayable: bool,
    /// How hyper hands over the client's connection once we answer 101.
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// How the client's body ended; `None` for a request without one.
    body_status: Option<BodyStatus>,
    /// The forwarding fields and `Host`, when the HTTP/1.1 encoder writes
    /// them (see `OwnHeads::forwarding`); `None` when `headers` holds them.
    forwarding: Option<Forwarding<'a>>,
    /// The client's fields, when they stay as it sent them (see `HeadFields`); only with `forwarding`.
    as_sent: Option<HeadFields<'a>>,
}

impl<'a> Outgoing<'a> {
    /// `raw_path` is the client's path as sent, for an API that forwards it
    /// instead of the canonical one (the request's own URI).
    #[allow(clippy::too_many_arguments, reason = "as `forward`'s")]
    pub(super) fn rewrite(
        api: &CompiledApi,
        mut request: Request<RequestBody>,
        mut as_sent: Option<HeadFields<'a>>,
        raw_path: Option<PathAndQuery>,
        taken: HopByHop,
        peer: &'a Peer,
        options: &ProxyOptions,
        exchange: &Exchange,
    ) -> Result<Self, ProxyError> {
        // Must be taken before the request is consumed.
        let client_upgrade = taken.upgrade.is_some().then(|| hyper::upgrade::on(&mut request));
        let (parts, body) = request.into_parts();
        let path_and_query = match raw_path {
            // The query as the policies left it (an API key may have been taken out).
            Some(raw) => with_query(raw.path(), parts.uri.query())?,
            None => upstream_path(&api.prefix, api.strip_prefix, &parts.uri, as_sent)?,
        };
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        // HTTP/2 allows `te: trailers` and nothing else; HTTP/1.1 would need
        // it in `Connection` too, and trailers there are for the framing to carry.
        if taken.trailers && api.upstream.http2() {
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
        let forwarding = Forwarding {
            client: &peer.forwarded_for,
            scheme: options.scheme,
            via: forwarding::own_via(parts.version),
            preserve_host: api.preserve_host,
        };
        // Our HTTP/1.1 encoder writes the forwarding fields and `Host`
        // itself, sparing the map four insertions, unless something reads
        // them from the map: hyper (HTTP/2, upgrades), or a balancer hashing
        // on one. It takes the host asked for from `Host`, so not for a
        // request that names it in its URI (HTTP/2, absolute form).
        let encoder_writes = !api.upstream.http2()
            && taken.upgrade.is_none()
            && parts.uri.authority().is_none()
            && !api.upstream.picks_by_forwarding_field();
        // The client's fields stay out of the map only as far as the
        // encoder: not when something reads them before, the balancer or hyper.
        if !encoder_writes || api.upstream.picks_by_request_field() {
            inbound::into_map(&mut as_sent, &mut headers, &exchange.request_id, &mut None)?;
        }
        if let Some(upgrade) = taken.upgrade {
            upgrade.write_to(&mut headers);
        }
        if !encoder_writes {
            // HTTP/2 carries the host in the URI, HTTP/1.1 in `Host` (whose value is shared, not copied).
            let original_host = match parts.uri.authority() {
                Some(authority) => HeaderValue::from_str(authority.as_str()).ok(),
                None => headers.get(header::HOST).cloned(),
            };
            forwarding.write_into(&mut headers, original_host.as_ref());
            if api.preserve_host {
                if let Some(host) = original_host {
                    headers.insert(header::HOST, host);
                }
            } else if api.upstream.http2() {
                // HTTP/2 names the target in the URI; HTTP/1.1's `Host` is
                // replaced by the target's for each attempt (`for_target`).
                headers.remove(header::HOST);
            }
        }
        Ok(Outgoing {
            method: parts.method,
            path_and_query,
            headers,
            replayable: body.is_end_stream(),
            body: Some(body),
            client_upgrade,
            body_status: exchange.request_body.clone(),
            forwarding: encoder_writes.then_some(forwarding),
            as_sent,
        })
    }

    /// Why the client's body failed, when it did: then the exchange failed
    /// because of the client, not the target.
    fn client_fault(&self) -> Option<ClientFault> {
        self.body_status.as_ref().and_then(BodyStatus::fault)
    }

    /// Whether the client was still sending its body (not the target's fault
    /// that it could not answer yet).
    fn still_receiving(&self) -> bool {
        self.body_status.as_ref().is_some_and(BodyStatus::receiving)
    }

    fn idempotent(&self) -> bool {
        matches!(
            self.method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
        )
    }

    /// The request of one attempt on `target`. Only an attempt that may be
    /// followed by a retry (`for_retry`) copies the path and headers; the
    /// usual single attempt hands them over. Both share the client
    /// connection's read buffer, which must not outlive the hand-over: the
    /// buffer hyper reads the next request into is a new one until it does.
    fn for_target(
        &mut self,
        target: &Target,
        http2: bool,
        preserve_host: bool,
        for_retry: bool,
    ) -> Result<Request<RequestBody>, ProxyError> {
        let path_and_query = if for_retry {
            self.path_and_query.clone()
        } else {
            std::mem::replace(&mut self.path_and_query, PathAndQuery::from_static("/"))
        };
        // HTTP/2 names the target in the URI, HTTP/1.1 in `Host` (origin-form URI).
        let uri = if http2 {
            Uri::builder()
                .scheme(target.scheme.clone())
                .authority(target.authority.clone())
                .path_and_query(path_and_query)
                .build()
                .map_err(|e| ProxyError::Internal(format!("cannot build upstream URI: {e}")))?
        } else {
            Uri::from(path_and_query)
        };
        let body = match self.body.take() {
            Some(incoming) if !self.replayable => incoming,
            _ => empty_body_request(),
        };
        let mut request = Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = uri;
        *request.version_mut() = if http2 { Version::HTTP_2 } else { Version::HTTP_11 };
        let headers = if for_retry { self.headers.clone() } else { std::mem::take(&mut self.headers) };
        http1_wire::put_headers(request.headers_mut(), headers);
        let host_in_map = !http2 && self.forwarding.is_none();
        if host_in_map && (!preserve_host || !request.headers().contains_key(header::HOST)) {
            request.headers_mut().insert(header::HOST, target.host_header.clone());
        }
        Ok(request)
    }
}

/// Sends to a target picked per attempt, with the request timeout and bounded retries.
#[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see proxy::answer)")]
pub(super) fn send<'a>(
    api: &'a CompiledApi,
    mut outgoing: Outgoing<'a>,
    peer: &'a Peer,
    exchange: &'a mut Exchange,
) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + 'a {
    async move {
        let (pool, http2) = (&api.upstream, api.upstream.http2());
        let idempotent = outgoing.idempotent();
        pool.deposit_retry_budget();
        let mut attempt = 0;
        let mut tried = Tried::default();
        loop {
            let target = pool
                .pick(Some(peer.ip), &outgoing.headers, &mut tried)
                .ok_or_else(|| ProxyError::NoHealthyTarget { upstream: pool.name.clone() })?;
            exchange.upstream_target = Some(target.clone());
            let in_flight = InFlight::new(target.clone());
            let may_retry = idempotent && outgoing.replayable && attempt < api.retries;
            let request = outgoing.for_target(&target, http2, api.preserve_host, may_retry)?;
            let attempt_started = tokio::time::Instant::now();
            let deadline = attempt_started + api.request_timeout;
            let upgrade = outgoing.client_upgrade.is_some();
            let own = OwnHeads {
                forwarding: outgoing.forwarding,
                as_sent: outgoing.as_sent,
                // Out of the map only where no policy reads them or edits them but by setting its own.
                fields_as_sent: exchange.fields_as_sent && api.policies.answer_fields_set().is_some(),
            };
            match pool.send(&target, request, api.connect_timeout, upgrade, deadline, own).await {
                Ok(response) => {
                    let elapsed = attempt_started.elapsed();
                    pool.record_latency(elapsed);
                    exchange.upstream_status = Some(response.status());
                    exchange.upstream_elapsed = Some(elapsed);
                    pool.record_answer(&target, response.status());
                    return Ok(finish_response(response, outgoing.client_upgrade.take(), in_flight, exchange));
                }
                Err(SendError::TimedOut) if outgoing.still_receiving() || outgoing.client_fault().is_some() => {
                    // No target can answer a request whose body has not arrived.
                    return Err(ProxyError::ClientBody(ClientFault::TimedOut));
                }
                Err(SendError::TimedOut) => {
                    pool.record_failure(&target);
                    return Err(ProxyError::Timeout {
                        target: target.url.clone(),
                        timeout_ms: api.request_timeout.as_millis(),
                    });
                }
                Err(error) => {
                    if let Some(fault) = outgoing.client_fault() {
                        // The client's body broke the exchange: the target did nothing wrong.
                        tracing::debug!(upstream = %pool.name, %error, ?fault, "the client's body failed the exchange");
                        return Err(ProxyError::ClientBody(fault));
                    }
                    pool.record_failure(&target);
                    if error.may_resend() && may_retry && pool.withdraw_retry() {
                        attempt += 1;
                        tracing::debug!(upstream = %pool.name, target = %target.url, attempt, %error, request_id = %exchange.request_id, "no response; retrying elsewhere");
                        continue;
                    }
                    let (target, reason) = (target.url.clone(), error.to_string());
                    return Err(match error {
                        SendError::Connect(_) => ProxyError::Connect { target, reason },
                        SendError::Exchange(_) | SendError::Hyper(_) | SendError::TimedOut => {
                            ProxyError::Upstream { target, reason }
                        }
                    });
                }
            }
        }
    }
}

fn finish_response(
    mut response: Response<ProxyBody>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    in_flight: InFlight,
    exchange: &mut Exchange,
) -> Response<ProxyBody> {
    let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    match client_upgrade {
        Some(client_upgrade) if switching => {
            // The 101 keeps its Connection/Upgrade headers: the client needs them.
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                // The tunnel counts as in flight on its target for as long as it is open.
                let _in_flight = in_flight;
                match (client_upgrade.await, upstream_upgrade.await) {
                    (Ok(client), Ok(upstream)) => {
                        let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
                        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                            tracing::debug!(error = %e, "upgraded connection ended with an error");
                        }
                    }
                    (client, upstream) => tracing::debug!(
                        client_ok = client.is_ok(),
                        upstream_ok = upstream.is_ok(),
                        "upgrade failed on one side"
                    ),
                }
            });
        }
        _ => {
            strip_hop_by_hop(response.headers_mut());
            exchange.in_flight = Some(in_flight);
        }
    }
    // With a target's fields kept as sent, the client's writer adds the gateway's `Via` after them.
    if response.body().fields_as_sent().is_none() {
        let own = forwarding::own_via(response.version());
        forwarding::append_via(response.headers_mut(), own);
    }
    response
}

/// The path and query sent to the target: the client's, less the API's
/// prefix when it strips it. `as_sent`: the client's head, which a stripped
/// path still lying in it (the request's target as sent) shares, not copies.
fn upstream_path(
    prefix: &str,
    strip: bool,
    uri: &Uri,
    as_sent: Option<HeadFields<'_>>,
) -> Result<PathAndQuery, ProxyError> {
    let original = uri.path_and_query().map_or("/", PathAndQuery::as_str);
    if !strip || prefix.is_empty() {
        return Ok(uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/")));
    }
    let rest = original.strip_prefix(prefix).unwrap_or(original);
    if let Some(shared) = as_sent.filter(|_| rest.starts_with('/')).and_then(|head| head.share(rest.as_bytes()))
        && let Ok(path) = PathAndQuery::from_maybe_shared(shared)
    {
        return Ok(path);
    }
    let rewritten = if rest.starts_with('/') { rest.to_string() } else { format!("/{rest}") };
    PathAndQuery::try_from(rewritten).map_err(|e| ProxyError::BadRequest(format!("cannot rewrite path: {e}")))
}

fn with_query(path: &str, query: Option<&str>) -> Result<PathAndQuery, ProxyError> {
    let joined = match query {
        Some(query) => format!("{path}?{query}"),
        None => path.to_string(),
    };
    PathAndQuery::try_from(joined).map_err(|e| ProxyError::BadRequest(format!("cannot rewrite path: {e}")))
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none of these: one pass over the few names present
    // is cheaper than hashing all nine into the map to remove nothing.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name) || name == header::UPGRADE) {
        return;
    }
    // RFC 9112 §6.3: Transfer-Encoding frames a message that carries both; an
    // intermediary must drop the Content-Length before passing it on (hyper
    // frames the body again), or the next hop reads the body by the wrong one.
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    for name in named_in_connection(headers) {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

/// Headers named in `Connection`: hop-by-hop too, by the sender's say-so.
pub(super) fn named_in_connection(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn hop_by_hop_table() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("x-end-to-end", "kept"),
            ("trailer", "grpc-status"),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, vec!["x-end-to-end", "trailer"]);
    }

    #[test]
    fn transfer_encoding_drops_content_length() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        strip_hop_by_hop(&mut h);
        assert!(h.is_empty(), "{h:?}");
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h[header::CONTENT_LENGTH], "3");
    }

    #[test]
    fn strip_prefix_table() {
        let cases = [
            // Whether the path sent is the client's target or a part of it, shared: the rest is copied.
            ("/shop", true, "/shop/items?x=1", "/items?x=1", true),
            ("/shop", true, "/shop", "/", false),
            ("/shop", true, "/shop?x=1", "/?x=1", false),
            ("/shop", false, "/shop/items", "/shop/items", true),
            ("", true, "/items", "/items", true),
        ];
        for (prefix, strip, input, want, shared) in cases {
            let uri: Uri = input.parse().unwrap();
            assert_eq!(upstream_path(prefix, strip, &uri, None).unwrap().as_str(), want, "{prefix} {input}");
            // The same with the client's head, whose target the URI shares (as `proxy::http1` parses it):
            // a stripped path that still lies in it is shared, not copied.
            let head = Bytes::from(format!("GET {input} HTTP/1.1\r\n\r\n"));
            let target = head.slice(4..4 + input.len());
            let uri = Uri::from(PathAndQuery::from_maybe_shared(target).unwrap());
            let path = upstream_path(prefix, strip, &uri, Some(HeadFields::new(&head, &[]))).unwrap();
            assert_eq!(path.as_str(), want, "{prefix} {input}");
            assert_eq!(head.as_ptr_range().contains(&path.as_str().as_ptr()), shared, "{prefix} {input}");
        }
    }
}
