//! HTTP/1.1 to a target without a connection task: the request's own task
//! writes the request and reads the response head, and the response body
//! reads straight from the socket as the client takes it.
//!
//! Why not hyper's client connection: it runs each connection in a task of
//! its own and hands every message across channels (the request in, the
//! head out, each body chunk out), so a proxied request paid for two task
//! wake-ups and four channel hand-overs on this leg alone. Upgrades (101)
//! still go through hyper, which owns the hand-over of the socket.
//!
//! What a target may send is checked as strictly as hyper did (see
//! `tests/it/http1_responses.rs`): a head that is not HTTP/1.x, folded
//! (obs-fold) or too large, differing `Content-Length`s, a bad chunk size is
//! no answer; bytes past the end of a response are never read as the next
//! one's (the connection is closed instead of reused).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::either::Either;
use tokio_util::io::poll_read_buf;

use super::Target;
use crate::base::forwarding::{Forwarding, Prior, Replaced};
use crate::base::http1_wire::{self, Field, HeadFields, is_named, is_one_of};
use crate::base::{BodyEncoder, BodyError, BoxError, RequestBody, WriteBuffer};

/// The most a response head may take, status line and headers together.
const MAX_HEAD: usize = 64 * 1024;
/// The most header fields a response head may have.
const MAX_HEADERS: usize = 128;
/// The most a chunk-size line (with its extensions) or the trailer section may take.
const MAX_CHUNK_LINE: usize = 4 * 1024;
const MAX_TRAILERS: usize = 16 * 1024;
/// Request body bytes gathered before they are written out.
const WRITE_HIGH_WATER: usize = 64 * 1024;

/// The byte stream under a connection: TCP, or TLS over TCP (boxed: a TLS
/// session is kilobytes, a plain connection should not carry its room).
pub(super) type Io = Either<TcpStream, Box<tokio_rustls::client::TlsStream<TokioIo<TokioIo<TcpStream>>>>>;

/// Why an exchange got no usable response.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The connection closed or failed before any byte of a response: the
    /// target may never have seen the request.
    #[error("connection closed before a response: {0}")]
    NoResponse(io::Error),
    /// Part of a response head arrived, then the connection ended or failed.
    #[error("connection closed in the response head: {0}")]
    CutHead(io::Error),
    /// What arrived is not an acceptable HTTP/1.x response head.
    #[error("invalid response: {0}")]
    Invalid(&'static str),
    /// The client's request body failed while it was being sent.
    #[error("request body failed: {0}")]
    RequestBody(BoxError),
    /// No whole response head arrived by the request's deadline.
    #[error("no response before the request timeout")]
    TimedOut,
}

impl ExchangeError {
    /// Whether a request may go again (see `SendError::may_resend`): only
    /// when nothing of a response arrived.
    pub fn may_resend(&self) -> bool {
        matches!(self, ExchangeError::NoResponse(_))
    }
}

/// An open HTTP/1.1 connection to a target, idle or carrying one exchange.
pub(super) struct Connection {
    io: Io,
    /// Bytes read and not consumed yet.
    read: BytesMut,
    /// The request head and body being written.
    write: WriteBuffer,
    /// Where the last response head's fields are in `read`. Kept with the
    /// connection, not in the head: no allocation per response, and a head
    /// small enough to move cheaply through the polls that return it.
    fields: Vec<Field>,
    /// The timer of the exchange's deadline, made at the connection's first
    /// exchange and kept: a timer per request was filed in the runtime's
    /// timer wheel and taken out again every time, under the wheel's lock.
    /// It is moved only to an earlier deadline; a later one (each request's
    /// deadline is usually later than the last) is left in `ends_at`, and
    /// when the timer fires before it, `poll_deadline` moves it there then.
    /// So the timer is reset about once per request timeout, not once per
    /// request. While the connection is idle, the timer keeps the waker of
    /// the last request's task: the next exchange replaces it, or the old
    /// deadline wakes that task once for nothing. At most one such task per
    /// idle connection is kept, which is cheaper than clearing the waker at
    /// the end of every exchange.
    deadline: Option<Pin<Box<Sleep>>>,
    /// The deadline of the exchange in progress (or the last one).
    ends_at: Instant,
    /// While a response body reads from the connection: where the
    /// connection goes back to once the body has ended cleanly, and for how
    /// long it may then stay idle; `None` when it may not carry another request.
    return_to: Option<(Home, Duration)>,
    /// While a response body reads from the connection: the response head,
    /// when its fields were kept as the target sent them instead of in the
    /// response's header map (see `ResponseBody::fields_as_sent`).
    head_as_sent: Option<Bytes>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("buffered", &self.read.len()).finish_non_exhaustive()
    }
}

impl Connection {
    pub(super) fn new(io: Io) -> Box<Self> {
        Box::new(Connection {
            io,
            read: BytesMut::new(),
            write: WriteBuffer::default(),
            fields: Vec::new(),
            deadline: None,
            ends_at: Instant::now(),
            return_to: None,
            head_as_sent: None,
        })
    }

    /// Whether an idle connection may carry a request: the target has not
    /// closed it, and has sent nothing unasked (which could only be read as
    /// the next response). Never waits: it looks at what the socket has now.
    pub(super) fn still_open(&mut self) -> bool {
        if !self.read.is_empty() {
            return false;
        }
        http1_wire::make_room(&mut self.read);
        match &mut self.io {
            // A plain socket's readiness is looked at without registering a
            // waker (a lock of its waiter list), which the exchange does next anyway.
            Either::Left(tcp) => {
                matches!(tcp.try_read_buf(&mut self.read), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            Either::Right(_) => matches!(self.poll_fill(&mut Context::from_waker(Waker::noop())), Poll::Pending),
        }
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        http1_wire::make_room(&mut self.read);
        poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read)
    }

    /// Sends `request` and reads the response head, which must have come
    /// by `deadline`. The response body reads from this connection, which
    /// goes back to `home` when the body has ended cleanly and the
    /// connection may carry another request. `own`: what is written and
    /// kept here instead of in the header maps.
    ///
    /// The head is written before the future is made, so the future holds
    /// only what outlives the wait: not the request, nor `own` (see
    /// `proxy::answer` for why its size matters).
    #[allow(clippy::manual_async_fn, reason = "the future must not hold the arguments, see above")]
    pub(super) fn exchange(
        mut self: Box<Self>,
        request: Request<RequestBody>,
        home: Home,
        deadline: Instant,
        own: OwnHeads<'_>,
    ) -> impl Future<Output = Result<Response<ResponseBody>, ExchangeError>> + use<> {
        match self.deadline.as_mut() {
            // Fires first and is moved on then, if the exchange still waits (see `poll_deadline`).
            Some(timer) if timer.deadline() <= deadline => {}
            Some(timer) => timer.as_mut().reset(deadline),
            None => self.deadline = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
        self.ends_at = deadline;
        let (parts, body) = request.into_parts();
        let forwarding = own.forwarding.map(|forwarding| (forwarding, &home.host_header));
        let outgoing =
            encode_head(self.write.fill(), &parts.method, &parts.uri, &parts.headers, forwarding, own.as_sent, &body);
        let head_request = parts.method == Method::HEAD;
        let fields_as_sent = own.fields_as_sent;
        let body = (!matches!(outgoing, BodyEncoder::Done)).then_some(body);
        let mut sending = Sending { body, framing: outgoing, write_failed: None };
        // The request's map, emptied, carries the response's headers: hyper
        // parses the client's next request into the map of this response,
        // which then has room for what the forward adds, and neither side
        // allocates a map per message.
        let mut headers = parts.headers;
        headers.clear();
        async move {
            let head = std::future::poll_fn(|cx| match self.poll_exchange(cx, &mut sending) {
                Poll::Pending => self.poll_deadline(cx),
                done => done,
            })
            .await?;
            // A response that came before the request was all out leaves the
            // request half sent: the connection cannot carry another.
            let reusable = head.keep_alive && sending.body.is_none() && self.write.is_empty();
            self.into_response(head, headers, head_request, reusable, home, fields_as_sent)
        }
    }

    /// Writes the request while reading for the response head, so a target
    /// that answers before the whole body (a 413, a 401) is heard rather
    /// than deadlocked against.
    fn poll_exchange(&mut self, cx: &mut Context<'_>, sending: &mut Sending) -> Poll<Result<Head, ExchangeError>> {
        loop {
            let mut progressed = false;
            if sending.write_failed.is_none() {
                // Frames that are ready now are gathered into one write.
                let mut body_waiting = false;
                while let Some(body) = sending.body.as_mut()
                    && self.write.len() < WRITE_HIGH_WATER
                {
                    match Pin::new(body).poll_frame(cx) {
                        Poll::Ready(Some(Ok(frame))) => {
                            if let Ok(data) = frame.into_data() {
                                sending.framing.encode(self.write.fill(), &data).map_err(ExchangeError::RequestBody)?;
                            }
                        }
                        Poll::Ready(None) => {
                            sending.framing.finish(self.write.fill()).map_err(ExchangeError::RequestBody)?;
                            sending.body = None;
                        }
                        Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(ExchangeError::RequestBody(e))),
                        Poll::Pending => {
                            body_waiting = true;
                            break;
                        }
                    }
                    progressed = true;
                }
                match self.write.poll_write_out(&mut self.io, cx) {
                    // All out: more of the body, unless it is what we wait for
                    // (the return to pending needs a waker on one of the two).
                    Poll::Ready(Ok(())) => progressed |= sending.body.is_some() && !body_waiting,
                    Poll::Ready(Err(e)) => sending.write_failed = Some(e),
                    Poll::Pending => {}
                }
            }
            match self.poll_head(cx) {
                Poll::Ready(Ok(Some(head))) => return Poll::Ready(Ok(head)),
                // An interim (1xx) head was skipped: look for the final one.
                Poll::Ready(Ok(None)) => continue,
                Poll::Ready(Err(e)) => {
                    // The target closing on a request it did not read whole
                    // is reported as the write's failure, the first cause.
                    let e = match (e, sending.write_failed.take()) {
                        (ExchangeError::NoResponse(_), Some(write)) => ExchangeError::NoResponse(write),
                        (e, _) => e,
                    };
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => {}
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    }

    /// `Ready` once the exchange's deadline has passed.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<Result<Head, ExchangeError>> {
        let Some(timer) = self.deadline.as_mut() else { return Poll::Pending };
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= self.ends_at {
                return Poll::Ready(Err(ExchangeError::TimedOut));
            }
            // An earlier exchange's deadline: on to this one's.
            timer.as_mut().reset(self.ends_at);
        }
        Poll::Pending
    }

    /// Reads until a whole head is buffered and parses it; `Ok(None)` for an
    /// interim response, which is consumed and skipped.
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Head>, ExchangeError>> {
        loop {
            if !self.read.is_empty() {
                match parse_head(&self.read, &mut self.fields)? {
                    Some(head) if head.status.is_informational() => {
                        // 101 is never asked for here (upgrades go through hyper).
                        if head.status == StatusCode::SWITCHING_PROTOCOLS {
                            return Poll::Ready(Err(ExchangeError::Invalid("101 to a request without Upgrade")));
                        }
                        self.read.advance(head.length);
                        return Poll::Ready(Ok(None));
                    }
                    Some(head) => return Poll::Ready(Ok(Some(head))),
                    None if self.read.len() >= MAX_HEAD => {
                        return Poll::Ready(Err(ExchangeError::Invalid("response head too large")));
                    }
                    None => {}
                }
            }
            let started = !self.read.is_empty();
            let result = ready!(self.poll_fill(cx));
            let cut = |e: io::Error| if started { ExchangeError::CutHead(e) } else { ExchangeError::NoResponse(e) };
            match result {
                Ok(0) => return Poll::Ready(Err(cut(io::ErrorKind::UnexpectedEof.into()))),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(cut(e))),
            }
        }
    }

    /// Turns the parsed head into the response, its body reading from this connection.
    fn into_response(
        mut self: Box<Self>,
        head: Head,
        mut headers: HeaderMap,
        head_request: bool,
        reusable: bool,
        home: Home,
        as_sent: bool,
    ) -> Result<Response<ResponseBody>, ExchangeError> {
        let bytes = self.read.split_to(head.length).freeze();
        let framing =
            if head_request || head.status == StatusCode::NO_CONTENT || head.status == StatusCode::NOT_MODIFIED {
                Framing::Length(0)
            } else {
                head.framing
            };
        // Kept as sent only with a body still to come: the fields' positions
        // are kept in the connection, which its end hands to the next
        // request. Nothing hop-by-hop may be in it: those fields go no further.
        let kept_as_sent = as_sent && !head.hop_by_hop && !framing.is_done();
        if !kept_as_sent {
            // Room for what the proxy adds (`Via`, the request ID) without growing the map.
            headers.reserve(self.fields.len() + 2);
            http1_wire::append_fields(&mut headers, &bytes, &self.fields)
                .map_err(|_| ExchangeError::Invalid("invalid header field"))?;
        }
        let keep_for = super::connections::idle_limit(head.keep_alive_field.map(|(start, end)| &bytes[start..end]));
        let reusable = reusable && !matches!(framing, Framing::UntilClose);
        self.return_to = reusable.then_some((home, keep_for));
        self.head_as_sent = kept_as_sent.then_some(bytes);
        let mut body = ResponseBody { connection: Some(self), framing, failure: None };
        if body.framing.is_done() {
            body.release();
        }
        let mut response = Response::new(body);
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        http1_wire::put_headers(response.headers_mut(), headers);
        Ok(response)
    }
}

/// Where a connection goes back to after its response: the target it was opened to.
pub(super) type Home = std::sync::Arc<Target>;

/// What an exchange writes or keeps itself, without the header maps, when
/// its caller leaves that to it (all off by default, as on HTTP/2 and for
/// upgrades, which go through hyper and the maps).
#[derive(Clone, Copy, Debug, Default)]
pub struct OwnHeads<'a> {
    /// The forwarding fields and `Host` are written into the request head
    /// here: the request's map holds the client's fields as they came, the
    /// ones these replace included (see `base::forwarding`).
    pub forwarding: Option<Forwarding<'a>>,
    /// The request's fields as the client sent them, written after those
    /// of its map (see `HeadFields`); only with `forwarding`.
    pub as_sent: Option<HeadFields<'a>>,
    /// The response's fields may stay as the target sent them, out of its
    /// map (see `ResponseBody::fields_as_sent`).
    pub fields_as_sent: bool,
}

/// The request body on its way out, and its framing on the wire.
struct Sending {
    body: Option<RequestBody>,
    framing: BodyEncoder,
    /// Why the request could not be written whole: nothing more is sent,
    /// and the target may still answer.
    write_failed: Option<io::Error>,
}

/// Writes the request head into `out` and says how the body follows. Any
/// `Content-Length` or `Transfer-Encoding` the request carries is replaced
/// by the framing of the body actually sent. With `forwarding` (and the
/// target's own `Host`), the forwarding fields and `Host` are written here,
/// in place of the client's (see `OwnHeads::forwarding`).
fn encode_head(
    out: &mut Vec<u8>,
    method: &Method,
    uri: &http::Uri,
    headers: &HeaderMap,
    forwarding: Option<(Forwarding<'_>, &HeaderValue)>,
    as_sent: Option<HeadFields<'_>>,
    body: &RequestBody,
) -> BodyEncoder {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    // `Host` first, as a client writes it (RFC 9112 §3.2).
    if let Some((forwarding, target_host)) = forwarding {
        let client_host = match as_sent {
            Some(fields) => fields.values("host").next(),
            None => headers.get(header::HOST).map(HeaderValue::as_bytes),
        };
        http1_wire::write_line(out, header::HOST.as_str().as_bytes(), forwarding.host(client_host, target_host));
    }
    let mut declared = None;
    let mut prior = Prior::default();
    for (name, value) in headers {
        if name == header::CONTENT_LENGTH {
            declared = http1_wire::content_length(value.as_bytes().trim_ascii());
            continue;
        }
        if name == header::TRANSFER_ENCODING {
            continue;
        }
        if forwarding.is_some()
            && let Some(replaced) = Replaced::of(name)
        {
            prior.note(replaced, value.as_bytes());
            continue;
        }
        http1_wire::write_field(out, name, value);
    }
    // Held to `proxy::inbound::fields_stay_as_sent`: of the fields this
    // leg replaces, only `Host` (written above), `Content-Length` and a
    // `Connection` of the client's own connection options may be among them.
    let moved = as_sent.map_or(&[][..], HeadFields::moved);
    for (name, value) in as_sent.iter().flat_map(|fields| fields.iter()) {
        if is_one_of(name, moved) {
            // Written from the map above, as the policies left it.
        } else if is_named(name, "content-length") {
            declared = http1_wire::content_length(value);
        } else if is_named(name, "host") {
            prior.note(Replaced::Host, value);
        } else if !is_named(name, "connection") {
            http1_wire::write_line(out, name, value);
        }
    }
    if let Some((name, value)) = as_sent.and_then(HeadFields::added) {
        http1_wire::write_line(out, name.as_str().as_bytes(), value);
    }
    if let Some((forwarding, _)) = forwarding {
        forwarding.write_lines(out, headers, &prior);
    }
    let outgoing = if body.is_end_stream() {
        // An empty body is still said for methods that carry one, and when the client said so.
        if declared.is_some() || matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
            out.extend_from_slice(b"content-length: 0\r\n");
        }
        BodyEncoder::Done
    } else {
        BodyEncoder::announce(out, body.size_hint().exact().or(declared))
    };
    out.extend_from_slice(b"\r\n");
    outgoing
}

/// A parsed response head: its length in the read buffer and what frames its body (its fields are in `Connection::fields`).
struct Head {
    length: usize,
    status: StatusCode,
    version: Version,
    framing: Framing,
    keep_alive: bool,
    /// A field that describes this hop only is present (see `http1_wire::is_hop_by_hop`).
    hop_by_hop: bool,
    /// Where the value of the first `Keep-Alive` field is (the target's idle timeout, see `idle_limit`).
    keep_alive_field: Option<(usize, usize)>,
}

/// `None` while the head is incomplete. Where the header fields are goes
/// into `fields`.
fn parse_head(buffer: &[u8], fields: &mut Vec<Field>) -> Result<Option<Head>, ExchangeError> {
    // Left uninitialised: httparse fills what it uses, and setting all of
    // them first would cost more than the parse of a usual head.
    let mut slots = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let length =
        match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut response, buffer, &mut slots) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(ExchangeError::Invalid("too many header fields")),
            Err(_) => return Err(ExchangeError::Invalid("malformed response head")),
        };
    let code = response.code.unwrap_or_default();
    let status = StatusCode::from_u16(code).map_err(|_| ExchangeError::Invalid("bad status code"))?;
    let version = if response.version == Some(0) { Version::HTTP_10 } else { Version::HTTP_11 };
    fields.clear();
    let mut lengths = None::<u64>;
    let mut chunked = None::<bool>;
    let mut connection_close = false;
    let mut connection_keep_alive = false;
    let mut keep_alive_field = None;
    let mut hop_by_hop = false;
    for field in response.headers.iter() {
        let name = field.name.as_bytes();
        hop_by_hop |= http1_wire::is_hop_by_hop(name);
        if name.eq_ignore_ascii_case(b"content-length") {
            for value in field.value.split(|b| *b == b',') {
                let n = http1_wire::content_length(value.trim_ascii())
                    .ok_or(ExchangeError::Invalid("bad Content-Length"))?;
                if lengths.is_some_and(|seen| seen != n) {
                    return Err(ExchangeError::Invalid("differing Content-Length values"));
                }
                lengths = Some(n);
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Only the last coding decides: chunked last frames the body, anything else runs to the close.
            let last = field.value.rsplit(|b| *b == b',').next().unwrap_or_default().trim_ascii();
            chunked = Some(last.eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in field.value.split(|b| *b == b',') {
                let token = token.trim_ascii();
                connection_close |= token.eq_ignore_ascii_case(b"close");
                connection_keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if keep_alive_field.is_none() && name.eq_ignore_ascii_case(b"keep-alive") {
            keep_alive_field = Some(http1_wire::range(buffer, field.value));
        }
        fields.push(Field::of(buffer, field));
    }
    // RFC 9112 §6.3: Transfer-Encoding wins over Content-Length; without either the body runs to the close.
    let framing = match (chunked, lengths) {
        (Some(true), _) => Framing::Chunked(Chunked::Size),
        (Some(false), _) => Framing::UntilClose,
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::UntilClose,
    };
    let keep_alive = !connection_close && (version == Version::HTTP_11 || connection_keep_alive);
    Ok(Some(Head { length, status, version, framing, keep_alive, hop_by_hop, keep_alive_field }))
}

/// How a response body's end is known.
#[derive(Debug)]
enum Framing {
    /// This many bytes still to come.
    Length(u64),
    Chunked(Chunked),
    /// Whatever comes until the target closes.
    UntilClose,
    Ended,
}

impl Framing {
    fn is_done(&self) -> bool {
        matches!(self, Framing::Length(0) | Framing::Ended)
    }
}

/// Where a chunked body's decoder stands.
#[derive(Debug)]
enum Chunked {
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    Trailers,
}

/// A response body read from its connection as it is polled. Small (what
/// lasts only while the body reads is kept in the connection): it travels
/// unboxed in every response from an HTTP/1.1 target (`base::ProxyBody`).
pub struct ResponseBody {
    connection: Option<Box<Connection>>,
    framing: Framing,
    /// A failure to report at the next poll (see `fail`).
    failure: Option<&'static str>,
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody").field("framing", &self.framing).finish_non_exhaustive()
    }
}

impl ResponseBody {
    /// The target's header fields, as (name, value) in the order and the
    /// spelling it sent them, when the response's header map was left
    /// without them (`Connection::exchange`'s `as_sent`); they then hold no
    /// hop-by-hop field. `None` when they are in the map. Asked for before
    /// the body is first polled: its end gives the connection, which keeps
    /// where the fields are, to the next request.
    pub fn fields_as_sent(&self) -> Option<impl Iterator<Item = (&[u8], &[u8])>> {
        let connection = self.connection.as_ref()?;
        let head = connection.head_as_sent.as_ref()?;
        Some(
            connection
                .fields
                .iter()
                .map(|field| (&head[field.name.0..field.name.1], &head[field.value.0..field.value.1])),
        )
    }

    /// The body has ended: the connection goes back for reuse when it can,
    /// unless the target sent more than the response (which must never be
    /// read as the next one).
    fn release(&mut self) {
        self.framing = Framing::Ended;
        let Some(mut connection) = self.connection.take() else { return };
        // The head's bytes would keep the connection's read buffer shared.
        connection.head_as_sent = None;
        if let Some((home, keep_for)) = connection.return_to.take()
            && connection.read.is_empty()
        {
            home.connections.put_idle(connection, keep_for);
        }
    }

    /// Fails the body on the next poll, not this one: what was read before
    /// the failure (the head, the first bytes) reaches the client first, since
    /// hyper writes out what it has when a body is pending and drops it
    /// unsent when the body fails. The client then learns of the loss by
    /// the connection closing short of the announced end.
    fn fail(&mut self, why: &'static str, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.framing = Framing::Ended;
        self.connection = None;
        self.failure = Some(why);
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// The next frame: data or trailers, `None` at the end.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(why) = self.failure.take() {
            return Poll::Ready(Some(Err(BodyError::new(why))));
        }
        loop {
            let Some(connection) = self.connection.as_mut() else {
                self.framing = Framing::Ended;
                return Poll::Ready(None);
            };
            let buffered = &mut connection.read;
            let step = match &mut self.framing {
                Framing::Ended => return Poll::Ready(None),
                Framing::Length(0) => Step::End,
                Framing::Length(left) if !buffered.is_empty() => {
                    let n = (*left).min(buffered.len() as u64) as usize;
                    *left -= n as u64;
                    Step::Data(buffered.split_to(n).freeze())
                }
                Framing::UntilClose if !buffered.is_empty() => Step::Data(buffered.split().freeze()),
                Framing::Chunked(state) => match decode_chunked(state, buffered) {
                    Ok(step) => step,
                    Err(why) => return self.fail(why, cx),
                },
                Framing::Length(_) | Framing::UntilClose => Step::Fill,
            };
            match step {
                Step::Data(data) => {
                    if matches!(self.framing, Framing::Length(0)) {
                        self.release();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Step::Trailers(trailers) => {
                    self.release();
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                Step::End => {
                    self.release();
                    return Poll::Ready(None);
                }
                Step::Fill => match ready!(connection.poll_fill(cx)) {
                    Ok(0) if matches!(self.framing, Framing::UntilClose) => {
                        // The close is this body's end; the connection is spent.
                        connection.return_to = None;
                        self.release();
                        return Poll::Ready(None);
                    }
                    Ok(0) => return self.fail("the target closed the connection before the end of the body", cx),
                    Ok(_) => {}
                    Err(_) => return self.fail("the connection failed before the end of the body", cx),
                },
            }
        }
    }
}

/// What the body decoder does next.
enum Step {
    Data(Bytes),
    Trailers(HeaderMap),
    End,
    /// More bytes are needed from the socket.
    Fill,
}

/// Decodes what `buffered` holds of a chunked body (RFC 9112 §7.1).
fn decode_chunked(state: &mut Chunked, buffered: &mut BytesMut) -> Result<Step, &'static str> {
    loop {
        match state {
            Chunked::Size => {
                let Some(end) = buffered.iter().position(|b| *b == b'\n') else {
                    return if buffered.len() > MAX_CHUNK_LINE {
                        Err("chunk-size line too long")
                    } else {
                        Ok(Step::Fill)
                    };
                };
                let size = chunk_size(&buffered[..end])?;
                buffered.advance(end + 1);
                *state = if size == 0 { Chunked::Trailers } else { Chunked::Data(size) };
            }
            Chunked::Data(left) => {
                if buffered.is_empty() {
                    return Ok(Step::Fill);
                }
                let n = (*left).min(buffered.len() as u64) as usize;
                *left -= n as u64;
                if *left == 0 {
                    *state = Chunked::DataEnd;
                }
                return Ok(Step::Data(buffered.split_to(n).freeze()));
            }
            Chunked::DataEnd => match buffered.first() {
                None => return Ok(Step::Fill),
                Some(b'\n') => {
                    buffered.advance(1);
                    *state = Chunked::Size;
                }
                Some(b'\r') if buffered.len() < 2 => return Ok(Step::Fill),
                Some(b'\r') if buffered[1] == b'\n' => {
                    buffered.advance(2);
                    *state = Chunked::Size;
                }
                Some(_) => return Err("chunk data longer than its size"),
            },
            Chunked::Trailers => {
                if buffered.starts_with(b"\r\n") || buffered.starts_with(b"\n") {
                    buffered.advance(if buffered[0] == b'\r' { 2 } else { 1 });
                    return Ok(Step::End);
                }
                let mut slots = [httparse::EMPTY_HEADER; 32];
                return match httparse::parse_headers(buffered, &mut slots) {
                    Ok(httparse::Status::Complete((length, fields))) => {
                        let mut trailers = HeaderMap::with_capacity(fields.len());
                        for field in fields.iter() {
                            let name =
                                HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| "invalid trailer field")?;
                            let value = HeaderValue::from_bytes(field.value).map_err(|_| "invalid trailer field")?;
                            trailers.append(name, value);
                        }
                        buffered.advance(length);
                        Ok(Step::Trailers(trailers))
                    }
                    Ok(httparse::Status::Partial) if buffered.len() > MAX_TRAILERS => Err("trailers too large"),
                    Ok(httparse::Status::Partial) => Ok(Step::Fill),
                    Err(_) => Err("malformed trailers"),
                };
            }
        }
    }
}

/// A chunk-size line without its LF: hex digits, then optional extensions
/// (`;name=value`, ignored but checked for control bytes), then an optional CR.
fn chunk_size(line: &[u8]) -> Result<u64, &'static str> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err("bad chunk size");
    }
    let rest = line[digits..].trim_ascii_start();
    if !(rest.is_empty() || rest[0] == b';') || rest.iter().any(|b| b.is_ascii_control() && *b != b'\t') {
        return Err("bad chunk extension");
    }
    let mut size = 0u64;
    for digit in &line[..digits] {
        let value = (*digit as char).to_digit(16).ok_or("bad chunk size")?;
        size = size * 16 + u64::from(value);
    }
    Ok(size)
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.get_mut().poll_next(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.failure.is_none() && self.framing.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        if self.failure.is_some() {
            return SizeHint::default();
        }
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Ended => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http_body_util::{BodyExt as _, StreamBody};
    use sluice_proto::v1;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;
    use crate::tls::CertificateSet;
    use crate::upstream::UpstreamPool;

    /// A connection to a loopback "target" (the far end of the socket,
    /// which the test reads and writes by hand), and the target's pool
    /// entry the connection goes back to.
    async fn loopback() -> (Box<Connection>, TcpStream, Arc<Target>, Arc<UpstreamPool>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let near = TcpStream::connect(address).await.unwrap();
        let (far, _) = listener.accept().await.unwrap();
        let spec = v1::Upstream {
            name: "u".into(),
            targets: vec![v1::Target { url: format!("http://{address}"), weight: 1 }],
            ..Default::default()
        };
        let pool = UpstreamPool::build(&spec, &CertificateSet::default(), None).unwrap();
        (Connection::new(Either::Left(near)), far, pool.targets()[0].clone(), pool)
    }

    /// A deadline no test reaches.
    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn get(path: &str) -> Request<RequestBody> {
        let mut request = Request::get(path).body(crate::base::empty_body_request()).unwrap();
        request.headers_mut().insert(header::HOST, HeaderValue::from_static("t"));
        request
    }

    /// Reads from the far end until `until` has arrived, returning all of it.
    async fn read_until(far: &mut TcpStream, until: &[u8]) -> Vec<u8> {
        let mut seen = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = far.read(&mut chunk).await.unwrap();
            assert_ne!(n, 0, "closed after {:?}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&chunk[..n]);
            // Only the new bytes (and what `until` may straddle) are looked through.
            let from = seen.len().saturating_sub(n + until.len());
            if seen[from..].windows(until.len()).any(|w| w == until) {
                return seen;
            }
        }
    }

    #[tokio::test]
    async fn the_writer_puts_the_forwarding_fields_and_host_in_place_of_the_clients() {
        let client = HeaderValue::from_static("10.0.0.9");
        for (preserve_host, host) in [(false, None), (true, Some("shop.example"))] {
            let (connection, mut far, target, _pool) = loopback().await;
            let mut request = get("/p");
            request.headers_mut().clear();
            for (name, value) in [
                ("host", "shop.example"),
                ("accept", "*/*"),
                ("x-forwarded-for", "1.2.3.4"),
                ("via", "1.0 edge"),
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "evil.example"),
                ("x-forwarded-for", "5.6.7.8"),
                ("x-forwarded-port", "1"),
            ] {
                request.headers_mut().append(HeaderName::from_static(name), HeaderValue::from_static(value));
            }
            let forwarding = Forwarding { client: &client, scheme: "http", via: "1.1 sluice", preserve_host };
            let own = OwnHeads { forwarding: Some(forwarding), as_sent: None, fields_as_sent: false };
            let exchange = connection.exchange(request, target.clone(), later(), own);
            let (sent, _) = tokio::join!(read_until(&mut far, b"\r\n\r\n"), async {
                // The exchange waits for an answer that never comes; the head is what is looked at.
                tokio::time::timeout(Duration::from_millis(200), exchange).await.ok();
            });
            let host = host.map_or_else(|| target.host_header.to_str().unwrap().to_owned(), str::to_owned);
            let want = format!(
                "GET /p HTTP/1.1\r\nhost: {host}\r\naccept: */*\r\nx-forwarded-port: 1\r\n\
                 x-forwarded-for: 1.2.3.4, 5.6.7.8, 10.0.0.9\r\nx-forwarded-proto: http\r\n\
                 x-forwarded-host: shop.example\r\nvia: 1.0 edge, 1.1 sluice\r\n\r\n"
            );
            assert_eq!(String::from_utf8_lossy(&sent), want, "preserve_host {preserve_host}");
        }
    }

    #[tokio::test]
    async fn fields_kept_as_sent_go_out_less_what_this_leg_replaces_with_the_gateways_request_id() {
        let client = HeaderValue::from_static("10.0.0.9");
        let (head, fields) = http1_wire::fields_of(
            "Host: Shop.example\r\nAccept: */*\r\nConnection: keep-alive\r\nContent-Length: 3\r\nX-Custom:  a b \r\n\r\n",
        );
        for (preserve_host, host) in [(false, None), (true, Some("Shop.example"))] {
            let (connection, mut far, target, _pool) = loopback().await;
            let mut request = Request::new(crate::base::full_body_request(Bytes::from_static(b"abc")));
            *request.method_mut() = Method::POST;
            *request.uri_mut() = http::Uri::from_static("/p");
            // What the gateway adds: a request ID.
            let forwarding = Forwarding { client: &client, scheme: "http", via: "1.1 sluice", preserve_host };
            let id_field = HeaderName::from_static("x-request-id");
            let as_sent = Some(HeadFields::new(&head, &fields).adding(&id_field, b"id-1"));
            let own = OwnHeads { forwarding: Some(forwarding), as_sent, fields_as_sent: false };
            let exchange = connection.exchange(request, target.clone(), later(), own);
            let (sent, _) = tokio::join!(read_until(&mut far, b"\r\n\r\nabc"), async {
                tokio::time::timeout(Duration::from_millis(200), exchange).await.ok();
            });
            let host = host.map_or_else(|| target.host_header.to_str().unwrap().to_owned(), str::to_owned);
            let want = format!(
                "POST /p HTTP/1.1\r\nhost: {host}\r\nAccept: */*\r\nX-Custom: a b\r\nx-request-id: id-1\r\n\
                 x-forwarded-for: 10.0.0.9\r\nx-forwarded-proto: http\r\nx-forwarded-host: Shop.example\r\n\
                 via: 1.1 sluice\r\ncontent-length: 3\r\n\r\nabc"
            );
            assert_eq!(String::from_utf8_lossy(&sent), want, "preserve_host {preserve_host}");
        }
    }

    #[tokio::test]
    async fn fields_moved_into_the_map_go_out_as_the_policies_left_them_and_only_from_there() {
        let client = HeaderValue::from_static("10.0.0.9");
        let (head, fields) = http1_wire::fields_of(
            "Host: Shop.example\r\nAuthorization: Basic eDp5\r\nAccept: */*\r\nX-Tenant: a\r\n\r\n",
        );
        // Authentication's credentials, and a rate limit keyed by `Host` and by `X-Tenant`.
        let moved = [header::AUTHORIZATION, header::HOST, HeaderName::from_static("x-tenant")];
        for (preserve_host, host) in [(false, None), (true, Some("Shop.example"))] {
            let (connection, mut far, target, _pool) = loopback().await;
            // The client's `Host` is among its fields, not in the map.
            let mut request = Request::get("/p").body(crate::base::empty_body_request()).unwrap();
            let as_sent = HeadFields::new(&head, &fields).moving(&moved, request.headers_mut()).unwrap();
            // What authentication does in the map: the credentials out, the consumer in.
            request.headers_mut().remove(header::AUTHORIZATION);
            request.headers_mut().insert("x-consumer-username", HeaderValue::from_static("ann"));
            let forwarding = Forwarding { client: &client, scheme: "http", via: "1.1 sluice", preserve_host };
            let own = OwnHeads { forwarding: Some(forwarding), as_sent: Some(as_sent), fields_as_sent: false };
            let exchange = connection.exchange(request, target.clone(), later(), own);
            let (sent, _) = tokio::join!(read_until(&mut far, b"\r\n\r\n"), async {
                tokio::time::timeout(Duration::from_millis(200), exchange).await.ok();
            });
            let host = host.map_or_else(|| target.host_header.to_str().unwrap().to_owned(), str::to_owned);
            let want = format!(
                "GET /p HTTP/1.1\r\nhost: {host}\r\nx-tenant: a\r\nx-consumer-username: ann\r\nAccept: */*\r\n\
                 x-forwarded-for: 10.0.0.9\r\nx-forwarded-proto: http\r\nx-forwarded-host: Shop.example\r\n\
                 via: 1.1 sluice\r\n\r\n"
            );
            assert_eq!(String::from_utf8_lossy(&sent), want, "preserve_host {preserve_host}");
        }
    }

    #[tokio::test]
    async fn a_connection_carries_one_exchange_after_another_and_goes_back_idle() {
        let (connection, mut far, target, _pool) = loopback().await;
        let exchange = tokio::spawn(connection.exchange(get("/one?x=1"), target.clone(), later(), OwnHeads::default()));
        let request = read_until(&mut far, b"\r\n\r\n").await;
        assert_eq!(request, b"GET /one?x=1 HTTP/1.1\r\nhost: t\r\n\r\n");
        far.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Seen: yes\r\n\r\nhello").await.unwrap();
        let response = exchange.await.unwrap().unwrap();
        assert_eq!(response.headers()["x-seen"], "yes");
        assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "hello");

        let connection = target.connections.take_idle().expect("back on the idle stack at the body's end");
        let exchange = tokio::spawn(connection.exchange(get("/two"), target.clone(), later(), OwnHeads::default()));
        read_until(&mut far, b"GET /two HTTP/1.1\r\n").await;
        far.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n").await.unwrap();
        let body = exchange.await.unwrap().unwrap().into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "abc");
        assert!(target.connections.take_idle().is_some(), "a chunked body's end frees it too");
    }

    #[tokio::test]
    async fn an_exchange_ends_at_its_deadline_also_on_a_reused_connection() {
        // Answered well before its deadline, which then passes while the connection is idle.
        let (connection, mut far, target, _pool) = loopback().await;
        let soon = Instant::now() + Duration::from_millis(50);
        let exchange = tokio::spawn(connection.exchange(get("/one"), target.clone(), soon, OwnHeads::default()));
        read_until(&mut far, b"\r\n\r\n").await;
        far.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await.unwrap();
        exchange.await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;

        // The next exchange on it is not cut short by the old deadline.
        let connection = target.connections.take_idle().expect("idle after the 204");
        let exchange = tokio::spawn(connection.exchange(get("/two"), target.clone(), later(), OwnHeads::default()));
        read_until(&mut far, b"GET /two HTTP/1.1\r\n").await;
        far.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await.unwrap();
        exchange.await.unwrap().unwrap();

        // A deadline earlier than the last one, to a target that never answers.
        times_out_after(&target, "/three", Duration::from_millis(100)).await;
        read_until(&mut far, b"GET /three HTTP/1.1\r\n").await;
        assert!(target.connections.take_idle().is_none(), "a connection that timed out is not reused");
    }

    #[tokio::test]
    async fn a_later_deadline_outlasts_the_timer_set_for_an_earlier_one() {
        let (connection, mut far, target, _pool) = loopback().await;
        let exchange = tokio::spawn(connection.exchange(
            get("/one"),
            target.clone(),
            Instant::now() + Duration::from_millis(50),
            OwnHeads::default(),
        ));
        read_until(&mut far, b"\r\n\r\n").await;
        far.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await.unwrap();
        exchange.await.unwrap().unwrap();

        // The first deadline passes while this exchange waits for its answer, which comes before its own.
        let connection = target.connections.take_idle().expect("idle after the 204");
        let started = Instant::now();
        let exchange = tokio::spawn(connection.exchange(
            get("/two"),
            target.clone(),
            started + Duration::from_millis(400),
            OwnHeads::default(),
        ));
        read_until(&mut far, b"GET /two HTTP/1.1\r\n").await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        far.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await.unwrap();
        let outcome = exchange.await.unwrap();
        assert!(outcome.is_ok(), "cut short by the earlier exchange's deadline: {outcome:?}");

        // With no answer, it ends at its own deadline, not before.
        times_out_after(&target, "/three", Duration::from_millis(300)).await;
    }

    /// Sends `path` on the target's idle connection with a deadline `after`
    /// from now, to a far end that does not answer: the exchange times out,
    /// and not before its deadline.
    async fn times_out_after(target: &Arc<Target>, path: &str, after: Duration) {
        let connection = target.connections.take_idle().expect("idle after the second 204");
        let started = Instant::now();
        let exchange = connection.exchange(get(path), target.clone(), started + after, OwnHeads::default());
        let outcome = tokio::time::timeout(Duration::from_secs(10), exchange).await.expect("ended by its deadline");
        assert!(matches!(outcome, Err(ExchangeError::TimedOut)), "{outcome:?}");
        assert!(started.elapsed() >= after);
    }

    #[tokio::test]
    async fn bytes_past_the_response_or_a_close_keep_a_connection_from_reuse() {
        let (connection, mut far, target, _pool) = loopback().await;
        let exchange = tokio::spawn(connection.exchange(get("/"), target.clone(), later(), OwnHeads::default()));
        read_until(&mut far, b"\r\n\r\n").await;
        far.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n").await.unwrap();
        let body = exchange.await.unwrap().unwrap().into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok");
        assert!(target.connections.take_idle().is_none(), "the extra bytes would answer the next request");

        let (connection, mut far, target, _pool) = loopback().await;
        let exchange = tokio::spawn(connection.exchange(get("/"), target.clone(), later(), OwnHeads::default()));
        read_until(&mut far, b"\r\n\r\n").await;
        far.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await.unwrap();
        exchange.await.unwrap().unwrap();
        drop(far);
        // The close reaches the socket before the idle connection is looked at again.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(target.connections.take_idle().is_none(), "a connection the target closed while idle is passed over");
    }

    #[tokio::test]
    async fn an_upload_larger_than_the_socket_buffers_goes_out_whole() {
        const SIZE: usize = 16 * 1024 * 1024;
        let (connection, mut far, target, _pool) = loopback().await;
        let frames =
            (0..SIZE / (64 * 1024)).map(|_| Ok::<_, BoxError>(Frame::data(Bytes::from(vec![b'x'; 64 * 1024]))));
        let body = RequestBody::boxed(StreamBody::new(futures_util::stream::iter(frames)));
        let mut request = Request::put("/upload").body(body).unwrap();
        request.headers_mut().insert(header::HOST, HeaderValue::from_static("t"));
        let exchange = tokio::spawn(connection.exchange(request, target.clone(), later(), OwnHeads::default()));
        // A slow start fills the socket buffers, so writes wait for room.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let received = tokio::time::timeout(Duration::from_secs(10), async {
            let mut received = read_until(&mut far, b"0\r\n\r\n").await.len();
            received -= b"0\r\n\r\n".len();
            far.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await.unwrap();
            received
        })
        .await
        .expect("the whole upload arrives");
        assert!(received > SIZE, "{received} bytes with the chunk framing, for {SIZE} of body");
        let response = exchange.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(target.connections.take_idle().is_some());
    }

    #[tokio::test]
    async fn an_answer_before_the_whole_upload_is_heard_and_the_connection_dropped() {
        let (connection, mut far, target, _pool) = loopback().await;
        // An upload that never ends: the target answers without reading it.
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let body = RequestBody::boxed(StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(receiver)));
        let mut request = Request::post("/upload").body(body).unwrap();
        request.headers_mut().insert(header::HOST, HeaderValue::from_static("t"));
        let feeder = tokio::spawn(async move {
            while sender.send(Ok(Frame::data(Bytes::from(vec![b'x'; 64 * 1024])))).await.is_ok() {}
        });
        let exchange = tokio::spawn(connection.exchange(request, target.clone(), later(), OwnHeads::default()));
        let head = read_until(&mut far, b"\r\n\r\n").await;
        assert!(head.starts_with(b"POST /upload HTTP/1.1\r\n"));
        assert!(head.windows(26).any(|w| w == b"transfer-encoding: chunked"), "no length known: chunked");
        far.write_all(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n").await.unwrap();
        let response =
            tokio::time::timeout(Duration::from_secs(5), exchange).await.expect("heard before the upload ends");
        assert_eq!(response.unwrap().unwrap().status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(target.connections.take_idle().is_none(), "half an upload is on the connection");
        feeder.abort();
    }

    fn decode_all(wire: &[u8]) -> Result<(Vec<u8>, Option<HeaderMap>, usize), &'static str> {
        let mut buffered = BytesMut::from(wire);
        let mut state = Chunked::Size;
        let mut data = Vec::new();
        loop {
            match decode_chunked(&mut state, &mut buffered)? {
                Step::Data(bytes) => data.extend_from_slice(&bytes),
                Step::Trailers(trailers) => return Ok((data, Some(trailers), buffered.len())),
                Step::End => return Ok((data, None, buffered.len())),
                Step::Fill => return Err("incomplete"),
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_and_bad_framing_is_refused() {
        assert_eq!(decode_all(b"5\r\nhello\r\n0\r\n\r\n"), Ok((b"hello".to_vec(), None, 0)));
        assert_eq!(decode_all(b"5;ext=1\r\nhello\r\n0\r\n\r\nleft"), Ok((b"hello".to_vec(), None, 4)));
        assert_eq!(decode_all(b"A\nhellohello\n0\n\n"), Ok((b"hellohello".to_vec(), None, 0)));
        let (_, trailers, _) = decode_all(b"1\r\nx\r\n0\r\ngrpc-status: 0\r\n\r\n").unwrap_or_default();
        assert_eq!(trailers.unwrap_or_default()["grpc-status"], "0");
        assert_eq!(decode_all(b"zz\r\nhello\r\n"), Err("bad chunk size"));
        assert_eq!(decode_all(b"5 x\r\nhello\r\n"), Err("bad chunk extension"));
        assert_eq!(decode_all(b"2\r\nhello\r\n"), Err("chunk data longer than its size"));
        assert_eq!(decode_all(b"ffffffffffffffff0\r\n"), Err("bad chunk size"));
        assert_eq!(decode_all(b"5\r\nhel"), Err("incomplete"));
    }

    fn head(wire: &str) -> Result<Head, &'static str> {
        match parse_head(wire.as_bytes(), &mut Vec::new()) {
            Ok(Some(head)) => Ok(head),
            Ok(None) => Err("partial"),
            Err(ExchangeError::Invalid(why)) => Err(why),
            Err(_) => Err("other"),
        }
    }

    #[test]
    fn response_heads_frame_their_bodies() {
        let cases: [(&str, Result<&str, &str>); 11] = [
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", Ok("Length(5) keep-alive=true")),
            ("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", Ok("Length(5) keep-alive=true")),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                Err("differing Content-Length values"),
            ),
            ("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", Err("bad Content-Length")),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                Ok("Chunked(Size) keep-alive=true"),
            ),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", Ok("UntilClose keep-alive=true")),
            ("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n", Ok("Length(1) keep-alive=false")),
            ("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", Ok("Length(1) keep-alive=false")),
            ("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n", Ok("Length(1) keep-alive=true")),
            ("HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\n\r\n", Err("malformed response head")),
            ("HTTP/1.1 200 OK\r\nContent-Len", Err("partial")),
        ];
        for (wire, want) in cases {
            let framing = head(wire).map(|h| format!("{:?} keep-alive={}", h.framing, h.keep_alive));
            assert_eq!(framing.as_deref().map_err(|e| *e), want, "{wire:?}");
        }
    }
}
