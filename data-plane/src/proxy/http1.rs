//! HTTP/1.1 on the client leg for the usual request, read and answered in
//! the connection's own task; hyper for everything else.
//!
//! Why not hyper's server connection for every request: its dispatcher moves
//! each request's future into its slot twice, and parses and encodes through
//! layers built for every case, which cost a proxied request more user-space
//! instructions than the gateway's own work on it (bench/RESULTS.md).
//!
//! The usual request is an HTTP/1.1 request in origin form, with its body
//! framed by one `Content-Length` (or none), and no `Transfer-Encoding`,
//! `Expect`, `Upgrade` or `TE`. A body that has arrived with its head is
//! handed over whole; the rest of one is read as the request path asks for
//! it (see [`StreamedBody`]). Any other request,
//! including any head httparse refuses or that is still incomplete past
//! [`MAX_HEAD`], hands the connection to hyper from that request on, with
//! the bytes read so far put back in front of the socket ([`Rewind`]): the
//! hard cases (smuggling attempts, chunked or slow uploads, 100-continue,
//! upgrades, over-long heads answered 431) keep hyper's answers, which the
//! conformance suite (`tests/it/http1_requests.rs`) writes down. What this
//! module answers itself follows the same table.

use std::io;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body as _, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio_util::io::poll_read_buf;

use super::idle::ConnectionActivity;
use super::log::{Exchange, LoggedBody};
use super::when_woken::WhenWoken;
use super::{Peer, ProxyOptions, Shared, answer, begin, client_body, inbound};
use crate::base::forwarding::own_via;
use crate::base::http1_wire::{self, Field, HeadFields};
use crate::base::{
    BodyEncoder, BodyStatus, BoxError, ProxyBody, RequestBody, RequestId, WriteBuffer, empty_body_request,
    full_body_request,
};
use crate::policy::{PolicyChain, RateCount};

/// A head still incomplete at this size goes to hyper, which reads on to
/// the configured header limit and answers 431 past it.
const MAX_HEAD: usize = 16 * 1024;
/// Header fields in one head, as hyper allows; more go to hyper (431).
const MAX_HEADERS: usize = 100;
/// Response bytes gathered before they are written out.
const WRITE_HIGH_WATER: usize = 64 * 1024;
/// How long the close of a connection may wait for the client's socket.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// How a connection served here ended.
pub(super) enum Served<S> {
    /// Closed: by the client, after a response that closes it, on a failure, or by `ending`.
    Closed,
    /// A request this module does not answer: hyper serves the connection from it on.
    HandOff(Rewind<S>),
}

/// Serves requests on `stream` until the connection closes, `ending`
/// resolves (idle, or shutdown: then after the request in flight), or a
/// request needs hyper.
pub(super) async fn serve<S, E>(
    stream: S,
    shared: &Arc<Shared>,
    client: &Peer,
    activity: &Arc<ConnectionActivity>,
    ending: &mut WhenWoken<E>,
) -> Served<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
    E: Future + Unpin,
{
    let mut connection = ClientConnection {
        stream,
        read: BytesMut::new(),
        write: WriteBuffer::default(),
        fields: Vec::new(),
        headers: HeaderMap::new(),
    };
    // Set once `ending` has resolved (see `poll_ended`): the request in flight is the last.
    let mut ended = false;
    loop {
        let next = std::future::poll_fn(|cx| {
            if poll_ended(ending, &mut ended, cx) {
                // Idle, or shutting down between requests: nothing is in flight.
                return Poll::Ready(Next::Close);
            }
            connection.poll_request(cx)
        })
        .await;
        // Taken out of the buffer here, after the wait: a request built in
        // the read's poll would be moved out through each layer of it.
        let taken = match next {
            Next::Head(head) => connection.take_request(head, &shared.options),
            Next::HandOff => None,
            Next::Close => break,
        };
        let Some(Taken { mut request, started, body, feed, meta, head }) = taken else {
            return Served::HandOff(connection.hand_off());
        };
        // Lent to the request while it is handled: the next head's fields go in again after.
        let fields = std::mem::take(&mut connection.fields);
        let as_sent = head.as_ref().map(|head| HeadFields::new(head, &fields));
        // Kept here until the response has been written, not moved through it (it is large).
        let (mut exchange, echo) = begin(&mut request, body, started, shared, client, activity.begin(), true, as_sent);
        let response = {
            let mut response = pin!(answer(request, as_sent, echo, shared, client, &mut exchange));
            std::future::poll_fn(|cx| {
                poll_ended(ending, &mut ended, cx);
                loop {
                    if let Poll::Ready(response) = response.as_mut().poll(cx) {
                        return Poll::Ready(response);
                    }
                    if !connection.poll_feed(cx, feed.as_ref()) {
                        return Poll::Pending;
                    }
                }
            })
            .await
        };
        connection.fields = fields;
        // Closed after this answer: when the client asks, on shutdown, and when
        // its body was not read to the end (the rest would be taken for the next request).
        let keep_alive = meta.keep_alive && !ended && feed.as_ref().is_none_or(|feed| lock(feed).complete());
        let replaced = &shared.options.request_id_header;
        let written = connection.respond(response, &mut exchange, meta.head, keep_alive, feed.as_ref(), replaced).await;
        if written.is_err() || !keep_alive {
            break;
        }
    }
    // A clean end for a TLS client (close_notify), bounded: a client that
    // reads nothing more must not hold the task.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection.stream.shutdown()).await;
    Served::Closed
}

/// Whether `ending` has resolved, now or before (`ended`); once it has, it is not polled again.
fn poll_ended<E: Future + Unpin>(ending: &mut WhenWoken<E>, ended: &mut bool, cx: &mut Context<'_>) -> bool {
    if !*ended && Pin::new(ending).poll(cx).is_ready() {
        *ended = true;
    }
    *ended
}

/// What the connection has read next.
enum Next {
    /// A whole request head, parsed.
    Head(Head),
    HandOff,
    Close,
}

/// A request taken out of the read buffer.
struct Taken {
    request: Request<RequestBody>,
    /// When its head had arrived.
    started: Instant,
    /// The status of its body, when it has one (see `client_body`).
    body: Option<BodyStatus>,
    /// Where the rest of its body comes from, when it has not all arrived.
    feed: Option<Arc<Mutex<Feed>>>,
    meta: Meta,
    /// The request's head, when its fields stay there (see
    /// `inbound::fields_stay_as_sent`): they are where the connection's
    /// `fields` says, and not in the request's map.
    head: Option<Bytes>,
}

/// What answering a request needs to know of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meta {
    /// A HEAD request: the response's head alone is sent.
    head: bool,
    /// The client did not ask to close after this request.
    keep_alive: bool,
}

/// A parsed request head.
struct Head {
    /// Bytes of the head.
    length: usize,
    /// Bytes of the body after it.
    body: u64,
    method: Method,
    target: (usize, usize),
    meta: Meta,
}

struct ClientConnection<S> {
    stream: S,
    /// Bytes read and not consumed yet.
    read: BytesMut,
    /// The response being written.
    write: WriteBuffer,
    /// Where the last request head's fields are in `read` (kept, not allocated per request).
    fields: Vec<Field>,
    /// The last response's header map, emptied: the next request's headers
    /// go into it (the upstream's response then reuses the request's, see
    /// `upstream::http1`), so no message allocates a map of its own.
    headers: HeaderMap,
}

impl<S: AsyncRead + AsyncWrite + Unpin> ClientConnection<S> {
    /// Reads until a whole request head is buffered; `Next::Close` when the
    /// client closes (or the read fails) between requests.
    fn poll_request(&mut self, cx: &mut Context<'_>) -> Poll<Next> {
        loop {
            if !self.read.is_empty() {
                match parse_head(&self.read, &mut self.fields) {
                    Parsed::Complete(head) => return Poll::Ready(Next::Head(head)),
                    Parsed::Partial if self.read.len() < MAX_HEAD => {}
                    Parsed::Partial | Parsed::Other => return Poll::Ready(Next::HandOff),
                }
            }
            http1_wire::make_room(&mut self.read);
            match ready!(poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.read)) {
                Ok(0) if self.read.is_empty() => return Poll::Ready(Next::Close),
                // Closed in the middle of a head: hyper answers what it has, as before.
                Ok(0) => return Poll::Ready(Next::HandOff),
                Ok(_) => {}
                Err(_) => return Poll::Ready(Next::Close),
            }
        }
    }

    /// The request of `head`, taken out of the read buffer with what has
    /// arrived of its body; `None` when it goes to hyper after all.
    fn take_request(&mut self, head: Head, options: &ProxyOptions) -> Option<Taken> {
        let started = Instant::now();
        let arrived =
            usize::try_from(head.body).map_or(self.read.len(), |body| (head.length + body).min(self.read.len()));
        let bytes = self.read.split_to(arrived).freeze();
        let Some(path_and_query) = PathAndQuery::from_maybe_shared(bytes.slice(head.target.0..head.target.1)).ok()
        else {
            return self.put_back(bytes);
        };
        let mut headers = std::mem::take(&mut self.headers);
        let as_sent = inbound::fields_stay_as_sent(HeadFields::new(&bytes, &self.fields), options);
        if !as_sent {
            // Room for what the forward adds (`X-Forwarded-*`, `Via`) without growing the map.
            headers.reserve(self.fields.len() + 4);
            if http1_wire::append_fields(&mut headers, &bytes, &self.fields).is_err() {
                return self.put_back(bytes);
            }
        }
        let arrived = bytes.len() - head.length;
        // The body first, so the request is made once with it (not made, then moved into one with it).
        let (request_body, body, feed) = if head.body == 0 {
            (empty_body_request(), None, None)
        } else if arrived as u64 == head.body {
            // The whole body has arrived: there is nothing left to wait for or fail.
            (full_body_request(bytes.slice(head.length..)), Some(BodyStatus::arrived(head.body)), None)
        } else {
            let feed = Arc::new(Mutex::new(Feed {
                data: (arrived > 0).then(|| bytes.slice(head.length..)),
                remaining: head.body - arrived as u64,
                waiting: None,
                failed: false,
            }));
            let streamed = StreamedBody { feed: feed.clone() };
            let (request_body, status) = client_body::watch_body(streamed, options.client_body_timeout, started.into());
            (request_body, status, Some(feed))
        };
        let mut request = Request::new(request_body);
        *request.method_mut() = head.method;
        *request.uri_mut() = Uri::from(path_and_query);
        *request.version_mut() = Version::HTTP_11;
        http1_wire::put_headers(request.headers_mut(), headers);
        Some(Taken { request, started, body, feed, meta: head.meta, head: as_sent.then_some(bytes) })
    }

    /// A request found unfit only once taken out of the buffer goes back in front of it, for hyper.
    fn put_back(&mut self, taken: Bytes) -> Option<Taken> {
        let mut read = BytesMut::with_capacity(taken.len() + self.read.len());
        read.extend_from_slice(&taken);
        read.extend_from_slice(&self.read);
        self.read = read;
        None
    }

    fn hand_off(self) -> Rewind<S> {
        Rewind { prefix: self.read.freeze(), stream: self.stream }
    }

    /// Writes `response`: its head, then its body as the body yields it.
    /// An error means the connection cannot carry another request (the
    /// client went, or the body failed after the head was sent: the client
    /// learns of it by the close). `replaced`: the header the gateway sets
    /// in every response (the request ID), whose target's value goes no further.
    async fn respond(
        &mut self,
        response: Response<ProxyBody>,
        exchange: &mut Exchange,
        head_request: bool,
        keep_alive: bool,
        feed: Option<&Arc<Mutex<Feed>>>,
        replaced: &HeaderName,
    ) -> io::Result<()> {
        let (parts, body) = response.into_parts();
        let exact = body.size_hint().exact();
        // Before the body is polled (see `ResponseBody::fields_as_sent`).
        let policies = exchange.api.as_ref().map(|api| &api.policies);
        let as_sent = body.fields_as_sent().map(|fields| AsSent {
            fields,
            replaced,
            set_by_policies: policies.and_then(|policies| policies.answer_fields_set()).unwrap_or(&[]),
            policy_values: policies.zip(exchange.rate_count),
            via: own_via(parts.version),
            request_id: Some(&exchange.request_id),
        });
        let mut encoder =
            encode_head(self.write.fill(), parts.status, &parts.headers, as_sent, exact, head_request, keep_alive);
        let mut headers = parts.headers;
        headers.clear();
        http1_wire::put_headers(&mut self.headers, headers);
        let body = LoggedBody::new(body, exchange);
        if encoder.is_done() {
            // Never polled: a HEAD answer or a 204 sends no body, whatever the body holds.
            drop(body);
            std::future::poll_fn(|cx| self.write.poll_write_out(&mut self.stream, cx)).await?;
        } else {
            let mut body = pin!(body);
            // The request body is still fed: an HTTP/2 target may read it while it answers.
            std::future::poll_fn(|cx| {
                while self.poll_feed(cx, feed) {}
                self.poll_body(cx, body.as_mut(), &mut encoder)
            })
            .await?;
        }
        Ok(())
    }

    /// Writes the body's frames, gathering those ready into one write.
    fn poll_body(
        &mut self,
        cx: &mut Context<'_>,
        mut body: Pin<&mut LoggedBody<&mut Exchange>>,
        encoder: &mut BodyEncoder,
    ) -> Poll<io::Result<()>> {
        loop {
            if self.write.len() >= WRITE_HIGH_WATER {
                ready!(self.write.poll_write_out(&mut self.stream, cx))?;
            }
            match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers are dropped: a client that did not say `TE: trailers` is served here.
                    if let Some(data) = frame.data_ref() {
                        encoder.encode(self.write.fill(), data).map_err(io::Error::other)?;
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(io::Error::other(e))),
                Poll::Ready(None) => {
                    encoder.finish(self.write.fill()).map_err(io::Error::other)?;
                    return self.write.poll_write_out(&mut self.stream, cx);
                }
                Poll::Pending if self.write.is_empty() => return Poll::Pending,
                // Out with what is gathered while the body waits; then look again.
                Poll::Pending => ready!(self.write.poll_write_out(&mut self.stream, cx))?,
            }
        }
    }

    /// Reads more of a streamed request body when its reader waits for it;
    /// `true` when it got some (or learnt it will get no more).
    fn poll_feed(&mut self, cx: &mut Context<'_>, feed: Option<&Arc<Mutex<Feed>>>) -> bool {
        let Some(feed) = feed else { return false };
        let mut state = lock(feed);
        // Only for a reader that waits: one that has not taken the last
        // chunk, or reads nothing now, holds the client back (backpressure).
        if state.waiting.is_none() || state.data.is_some() || state.complete() || state.failed {
            return false;
        }
        http1_wire::make_room(&mut self.read);
        match poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.read) {
            Poll::Pending => return false,
            Poll::Ready(Ok(0) | Err(_)) => state.failed = true,
            Poll::Ready(Ok(_)) => {
                // Bytes past the body are the next request's: they stay.
                let take = usize::try_from(state.remaining).map_or(self.read.len(), |left| left.min(self.read.len()));
                state.data = Some(self.read.split_to(take).freeze());
                state.remaining -= take as u64;
            }
        }
        if let Some(waiting) = state.waiting.take()
            && !waiting.will_wake(cx.waker())
        {
            // Read in another task (an HTTP/2 target's connection); in this one it is polled next anyway.
            waiting.wake();
        }
        true
    }
}

/// What a connection hands a streamed request body, and the body asks of it.
struct Feed {
    /// Read and not taken by the body yet.
    data: Option<Bytes>,
    /// Not read from the connection yet.
    remaining: u64,
    /// The body's reader, waiting for `data`.
    waiting: Option<Waker>,
    /// The connection ended or failed before the body's end.
    failed: bool,
}

impl Feed {
    /// Whether every byte of the body has been read off the connection.
    fn complete(&self) -> bool {
        self.remaining == 0
    }
}

fn lock(feed: &Mutex<Feed>) -> std::sync::MutexGuard<'_, Feed> {
    feed.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A request body the connection reads as this asks for it. Its reader
/// usually runs in the connection's own task (the forward to an HTTP/1.1
/// target), so a chunk is read while that task is polled anyway; the lock
/// is for an HTTP/2 target's connection, which reads it from its own.
struct StreamedBody {
    feed: Arc<Mutex<Feed>>,
}

impl http_body::Body for StreamedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut feed = lock(&self.feed);
        if let Some(data) = feed.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if feed.complete() {
            return Poll::Ready(None);
        }
        if feed.failed {
            return Poll::Ready(Some(Err("the connection closed before the end of the request body".into())));
        }
        feed.waiting = Some(cx.waker().clone());
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        let feed = lock(&self.feed);
        feed.data.is_none() && feed.complete()
    }

    fn size_hint(&self) -> SizeHint {
        let feed = lock(&self.feed);
        SizeHint::with_exact(feed.remaining + feed.data.as_ref().map_or(0, |data| data.len() as u64))
    }
}

enum Parsed {
    Complete(Head),
    Partial,
    /// Not a request this module answers (see the module's doc).
    Other,
}

/// Parses a request head at the front of `buffer`; where its fields are goes into `fields`.
fn parse_head(buffer: &[u8], fields: &mut Vec<Field>) -> Parsed {
    // Left uninitialised: httparse fills what it uses (see `upstream::http1`).
    let mut slots = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let length =
        match httparse::ParserConfig::default().parse_request_with_uninit_headers(&mut request, buffer, &mut slots) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) => return Parsed::Partial,
            Err(_) => return Parsed::Other,
        };
    let (Some(method), Some(target), Some(1)) = (request.method, request.path, request.version) else {
        return Parsed::Other;
    };
    if !target.starts_with('/') {
        return Parsed::Other;
    }
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Other;
    };
    if method == Method::CONNECT {
        return Parsed::Other;
    }
    fields.clear();
    let mut content_length = None::<u64>;
    let mut keep_alive = true;
    for field in request.headers.iter() {
        let name = field.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            // One length of digits alone; a repeat, a list or a sign is hyper's to judge.
            match content_length {
                None => {
                    content_length = Some(match http1_wire::content_length(field.value) {
                        Some(n) => n,
                        None => return Parsed::Other,
                    })
                }
                Some(_) => return Parsed::Other,
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            keep_alive &=
                !field.value.split(|b| *b == b',').any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"));
        } else if [&b"transfer-encoding"[..], b"expect", b"upgrade", b"te"]
            .iter()
            .any(|other| name.eq_ignore_ascii_case(other))
        {
            return Parsed::Other;
        }
        fields.push(Field::of(buffer, field));
    }
    let body = content_length.unwrap_or(0);
    let head = method == Method::HEAD;
    Parsed::Complete(Head {
        length,
        body,
        method,
        target: http1_wire::range(buffer, target.as_bytes()),
        meta: Meta { head, keep_alive },
    })
}

/// Writes the response head into `out` and says how the body follows.
///
/// The framing is the gateway's: a body of known size (`exact`) gets its
/// `Content-Length`, another is chunked. A HEAD answer and a 304 keep the
/// `Content-Length` they carry (it describes the resource) and send no body;
/// a 1xx or 204 has neither. `Date` is added where the response has none.
/// A target's fields kept as it sent them (`as_sent`) go first, then the
/// map's: what the gateway adds to a list field such as `Via` follows
/// what came before it.
fn encode_head<'a>(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    as_sent: Option<AsSent<'_, impl Iterator<Item = (&'a [u8], &'a [u8])>>>,
    exact: Option<u64>,
    head_request: bool,
    keep_alive: bool,
) -> BodyEncoder {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let no_content = status.is_informational() || status == StatusCode::NO_CONTENT;
    let bodiless = no_content || head_request || status == StatusCode::NOT_MODIFIED;
    let (mut dated, mut declared) = (false, None);
    if let Some(AsSent { fields, replaced, set_by_policies, policy_values, via, request_id }) = as_sent {
        // No hop-by-hop field is among them (see `ResponseBody::fields_as_sent`).
        let replaced = replaced.as_str().as_bytes();
        for (name, value) in fields {
            if name.eq_ignore_ascii_case(replaced) || http1_wire::is_one_of(name, set_by_policies) {
                continue;
            }
            if name.eq_ignore_ascii_case(b"content-length") {
                declared = http1_wire::content_length(value);
                if !bodiless || no_content {
                    continue;
                }
            }
            dated |= name.eq_ignore_ascii_case(b"date");
            http1_wire::write_line(out, name, value);
        }
        // What the map path gives them (`forwarding::append_via`, `proxy::answer`),
        // without a map: `Via` after the target's, the gateway's request ID in place of the target's.
        http1_wire::write_line(out, b"via", via.as_bytes());
        if let Some(id) = request_id {
            http1_wire::write_line(out, replaced, id.as_ref());
        }
        if let Some((policies, count)) = policy_values {
            policies.write_answer_fields(count, out);
        }
    }
    for (name, value) in headers {
        if name == header::TRANSFER_ENCODING || name == header::CONNECTION {
            continue;
        }
        if name == header::CONTENT_LENGTH {
            declared = http1_wire::content_length(value.as_bytes());
            if !bodiless || no_content {
                continue;
            }
        }
        dated |= name == header::DATE;
        http1_wire::write_field(out, name, value);
    }
    if !dated {
        date::write(out);
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    let encoder = if bodiless { BodyEncoder::Done } else { BodyEncoder::announce(out, exact.or(declared)) };
    out.extend_from_slice(b"\r\n");
    encoder
}

/// A target's header fields as it sent them, and what the gateway adds to
/// them: its `Via` entry, and its request ID under the name `replaced`.
/// The fields named in `set_by_policies` are left out: the API's policies
/// set their own (see `PolicyChain::answer_fields_set`), from
/// `policy_values` when the request was forwarded under a rate limit.
struct AsSent<'r, I> {
    fields: I,
    replaced: &'r HeaderName,
    set_by_policies: &'r [HeaderName],
    policy_values: Option<(&'r PolicyChain, RateCount)>,
    via: &'static str,
    request_id: Option<&'r RequestId>,
}

/// The `Date` header, formatted once a second per thread.
mod date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static CACHED: RefCell<(u64, Vec<u8>)> = const { RefCell::new((0, Vec::new())) };
    }

    pub(super) fn write(out: &mut Vec<u8>) {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
        CACHED.with_borrow_mut(|(cached_second, line)| {
            if *cached_second != second || line.is_empty() {
                *cached_second = second;
                line.clear();
                line.extend_from_slice(b"date: ");
                line.extend_from_slice(httpdate::fmt_http_date(now).as_bytes());
                line.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(line);
        });
    }
}

/// A stream with bytes already read from it put back in front: what hyper
/// reads first when it takes a connection over.
pub(super) struct Rewind<S> {
    prefix: Bytes,
    stream: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use http::header::{HeaderName, HeaderValue};

    use super::*;

    /// The head's length, the body's, what answering needs and the fields, as text.
    type Summary = (usize, u64, Meta, Vec<(String, String)>);

    fn parsed(wire: &str) -> Result<Summary, &'static str> {
        let mut fields = Vec::new();
        match parse_head(wire.as_bytes(), &mut fields) {
            Parsed::Complete(head) => {
                let text = |(a, b): (usize, usize)| wire[a..b].to_string();
                let fields = fields.iter().map(|f| (text(f.name), text(f.value))).collect();
                Ok((head.length, head.body, head.meta, fields))
            }
            Parsed::Partial => Err("partial"),
            Parsed::Other => Err("other"),
        }
    }

    #[test]
    fn usual_requests_are_answered_here_and_the_rest_goes_to_hyper() {
        let (length, body, meta, fields) =
            parsed("POST /a?b=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET").unwrap();
        assert_eq!((length, body, meta.head, meta.keep_alive), (52, 5, false, true));
        assert_eq!(fields, [("Host".into(), "x".into()), ("Content-Length".into(), "5".into())]);
        let (_, body, meta, _) = parsed("HEAD / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n").unwrap();
        assert_eq!((body, meta.head, meta.keep_alive), (0, true, false));
        assert_eq!(parsed("GET / HTTP/1.1\r\nHost: x\r\n"), Err("partial"));
        for other in [
            "GET / HTTP/1.0\r\n\r\n",
            "GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
            "CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
            "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello",
            "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello",
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\nhello",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n",
            "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            "GET / HTTP/1.1\r\nTE: trailers\r\n\r\n",
            "GET / HTTP/1.1\r\nX-Folded: a\r\n b\r\n\r\n",
            "G@T / HTTP/1.1\r\n\r\n",
        ] {
            assert!(matches!(parsed(other), Err("other")), "{other:?}");
        }
    }

    fn head_of(status: StatusCode, headers: &[(&str, &'static str)], body: &str, head_request: bool) -> String {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_static(value));
        }
        let mut out = Vec::new();
        let none = None::<AsSent<'_, std::iter::Empty<(&[u8], &[u8])>>>;
        encode_head(&mut out, status, &map, none, Some(body.len() as u64), head_request, true);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_targets_fields_as_sent_go_first_less_its_framing_id_and_policy_fields_then_the_gateways() {
        let mut map = HeaderMap::new();
        map.insert("ratelimit-limit", HeaderValue::from_static("5"));
        let ours = RequestId::parse(b"ours").unwrap();
        let fields: [(&[u8], &[u8]); 7] = [
            (b"Content-Type", b"text/plain"),
            (b"Content-Length", b"99"),
            (b"X-Request-ID", b"theirs"),
            (b"RateLimit-Limit", b"999"),
            (b"Via", b"1.0 inner"),
            (b"RATELIMIT-POLICY", b"999;w=1"),
            (b"Date", b"then"),
        ];
        let replaced = HeaderName::from_static("x-request-id");
        let set_by_policies = [HeaderName::from_static("ratelimit-limit"), HeaderName::from_static("ratelimit-policy")];
        let as_sent = Some(AsSent {
            fields: fields.into_iter(),
            replaced: &replaced,
            set_by_policies: &set_by_policies,
            policy_values: None,
            via: "1.1 sluice",
            request_id: Some(&ours),
        });
        let mut out = Vec::new();
        let encoder = encode_head(&mut out, StatusCode::OK, &map, as_sent, Some(5), false, true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nVia: 1.0 inner\r\nDate: then\r\n\
             via: 1.1 sluice\r\nx-request-id: ours\r\nratelimit-limit: 5\r\ncontent-length: 5\r\n\r\n"
        );
        assert!(matches!(encoder, BodyEncoder::Length(5)));
    }

    #[test]
    fn response_heads_carry_the_gateways_framing() {
        let dated = |head: &str| head.contains("\r\ndate: ");
        let head = head_of(StatusCode::OK, &[("content-length", "99"), ("x-a", "1")], "hello", false);
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\nx-a: 1\r\n") && head.ends_with("content-length: 5\r\n\r\n"),
            "{head}"
        );
        assert!(dated(&head));
        let head = head_of(StatusCode::OK, &[("content-length", "1000"), ("date", "then")], "", true);
        assert_eq!(head, "HTTP/1.1 200 OK\r\ncontent-length: 1000\r\ndate: then\r\n\r\n");
        let head = head_of(StatusCode::NO_CONTENT, &[("content-length", "5"), ("date", "then")], "", false);
        assert_eq!(head, "HTTP/1.1 204 No Content\r\ndate: then\r\n\r\n");
        let head = head_of(StatusCode::NOT_MODIFIED, &[("content-length", "9"), ("date", "then")], "", false);
        assert_eq!(head, "HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\ndate: then\r\n\r\n");
    }

    /// What hyper's HTTP/1.1 server, as the gateway configures it, makes of
    /// `wire`'s first request: method, target, header fields (sorted) and
    /// body (`None` when it did not arrive whole); `None` when it refuses it.
    type Seen = (String, String, Vec<(String, Vec<u8>)>, Option<Vec<u8>>);

    async fn hyper_sees(wire: Vec<u8>) -> Option<Seen> {
        use http_body_util::{BodyExt as _, Empty};
        use tokio::io::AsyncWriteExt as _;
        let seen = Arc::new(Mutex::new(None::<Seen>));
        let service = {
            let seen = seen.clone();
            hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                let seen = seen.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    let mut fields: Vec<(String, Vec<u8>)> =
                        parts.headers.iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect();
                    fields.sort();
                    // A body cut short by the end of `wire` never ends: the client stays open.
                    let whole = tokio::time::timeout(Duration::from_millis(50), body.collect()).await;
                    let body = whole.ok().and_then(Result::ok).map(|whole| whole.to_bytes().to_vec());
                    let mut seen = seen.lock().unwrap();
                    if seen.is_none() {
                        *seen = Some((parts.method.to_string(), parts.uri.to_string(), fields, body));
                    }
                    Ok::<_, std::convert::Infallible>(Response::new(Empty::<Bytes>::new()))
                }
            })
        };
        // The client stays open (hyper drops a request whose client has
        // closed) until hyper has served or refused the first request.
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        client.write_all(&wire).await.unwrap();
        let connection =
            hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(server), service);
        let served = async {
            while seen.lock().unwrap().is_none() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::select! {
            _ = connection => {}
            () = served => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        drop(client);
        seen.lock().unwrap().take()
    }

    fn requests() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        use proptest::sample::select;
        let methods = ["GET", "POST", "HEAD", "DELETE", "OPTIONS", "G@T", "get", "CONNECT"];
        let targets = ["/", "/a?b=1", "/x/../y", "*", "http://h/p", "/%2F", "/a b", "/\u{fc}", "/a\"b", "/{x}"];
        let versions = ["HTTP/1.1", "HTTP/1.0", "HTTP/1.2", "HTTP/2.0", "http/1.1"];
        let ends = ["\r\n", "\n"];
        let fields = [
            "Host: g",
            "Content-Length: 5",
            "Content-Length: 0",
            "Content-Length: 05",
            "Content-Length: 5, 5",
            "Content-Length:5",
            "Content-Length : 5",
            "content-length: 3",
            "Content-Length: 18446744073709551616",
            "Transfer-Encoding: chunked",
            "Connection: close",
            "Connection: keep-alive, x-a",
            "X-A: b\tc ",
            "X-Folded: a\r\n b",
            "X_U: 1",
            "Bad Name: x",
            ": empty",
            "X-Obs: caf\u{e9}",
            "X-Ctl: a\u{1}b",
            "Expect: 100-continue",
            "Upgrade: websocket",
            "TE: trailers",
            "X-Empty:",
        ];
        let bodies = ["", "hello", "helloGET / HTTP/1.1\r\n\r\n", "hel"];
        (
            select(methods.to_vec()),
            select(targets.to_vec()),
            select(versions.to_vec()),
            select(ends.to_vec()),
            proptest::collection::vec(select(fields.to_vec()), 0..6),
            select(bodies.to_vec()),
        )
            .prop_map(|(method, target, version, end, fields, body)| {
                let mut wire = format!("{method} {target} {version}{end}");
                for field in fields {
                    wire.push_str(field);
                    wire.push_str(end);
                }
                wire.push_str(end);
                wire.push_str(body);
                wire.into_bytes()
            })
    }

    /// A differential check of the parser: whatever this module takes as a
    /// usual request, hyper takes too and reads the same way (method,
    /// target, fields, and the body it frames). What this module leaves to
    /// hyper needs no check: hyper answers it as before.
    #[test]
    fn every_request_answered_here_is_one_hyper_reads_the_same() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let config = proptest::test_runner::Config { cases: 512, ..Default::default() };
        proptest::proptest!(config, |(wire in requests())| {
            let mut fields = Vec::new();
            let Parsed::Complete(head) = parse_head(&wire, &mut fields) else { return Ok(()) };
            let text = |(a, b): (usize, usize)| wire[a..b].to_vec();
            let mut ours: Vec<(String, Vec<u8>)> = fields
                .iter()
                .map(|f| (String::from_utf8_lossy(&text(f.name)).to_ascii_lowercase(), text(f.value)))
                .collect();
            ours.sort();
            let body_end = head.length + usize::try_from(head.body).unwrap();
            let body = wire.get(head.length..body_end).map(<[u8]>::to_vec);
            let seen = runtime.block_on(hyper_sees(wire.clone()));
            let wire_text = String::from_utf8_lossy(&wire);
            let Some((method, target, theirs, their_body)) = seen else {
                return Err(proptest::test_runner::TestCaseError::fail(format!("hyper refuses {wire_text:?}")));
            };
            proptest::prop_assert_eq!(method.as_str(), head.method.as_str(), "{:?}", wire_text);
            proptest::prop_assert_eq!(target.as_bytes(), &wire[head.target.0..head.target.1], "{:?}", wire_text);
            proptest::prop_assert_eq!(theirs, ours, "{:?}", wire_text);
            if body.is_some() {
                proptest::prop_assert_eq!(their_body, body, "{:?}", wire_text);
            }
        });
    }
}
