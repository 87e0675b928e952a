//! The inbound stage, between parsing and route match: the request as the
//! rest of the path will see it. The path is put in canonical form and the
//! host checked and normalised (both by the rules of `sluice_proto`), so that
//! routing, every policy, validation, the access log and the upstream agree
//! on which resource is asked for; a request with no canonical form gets 400
//! here and goes no further. Then the headers: sizes checked (431),
//! hop-by-hop headers (and every header `Connection` names) removed, and
//! headers only the gateway may set dropped, all before any policy runs, so
//! a client can neither delete nor forge what auth or header rules set.
//! Before all of it, the request ID: the client's when well-formed, else a
//! new one, so even a request refused here is answered with it.

use http::header::{Entry, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Uri, Version, header};
use sluice_proto::host::{CanonicalHost, HostError, canonical_host, canonical_host_field};
use sluice_proto::path::canonical_path;

use super::ProxyOptions;
use super::forward::named_in_connection;
use super::log::{Exchange, RequestPath};
use crate::base::forwarding::Replaced;
use crate::base::http1_wire::{HOP_BY_HOP, HeadFields, is_hop_by_hop, is_named};
use crate::base::{ProxyError, RequestId};
use crate::policy::{X_CONSUMER_USERNAME, X_CONSUMER_USERNAME_SPELLED};

/// What a client's request headers may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderLimits {
    /// All header lines together, in bytes (name, value and 4 bytes of framing each).
    pub total: u32,
    /// One header's name and value, in bytes.
    pub field: u32,
    /// Pass headers whose names hold `_` (dropped otherwise).
    pub underscores: bool,
}

/// 64 KiB in all, 16 KiB per header; underscores dropped (as nginx).
pub const DEFAULT_HEADER_LIMITS: HeaderLimits = HeaderLimits { total: 64 * 1024, field: 16 * 1024, underscores: false };

impl HeaderLimits {
    /// hyper's HTTP/1.1 read buffer may grow to hold a head of `total`
    /// bytes plus the request line; a longer head is answered 431 by hyper.
    pub(super) fn read_buffer(&self) -> usize {
        (self.total as usize).saturating_add(8 * 1024)
    }

    /// What the field `name: value` (their lengths) counts against `total`:
    /// its line, with 4 bytes of framing; `None` when it is over `field`.
    fn counted(&self, name: usize, value: usize) -> Option<usize> {
        let size = name + value;
        (size <= self.field as usize).then_some(size + 4)
    }
}

/// Never removed because a client named them in `Connection`: hyper framed
/// the body by them (and the size limit and validation read them), and the
/// host has been routed by.
const FRAMING: [HeaderName; 3] = [header::CONTENT_LENGTH, header::TRANSFER_ENCODING, header::HOST];

/// What the hop-by-hop strip took that the forward may need again.
#[derive(Default)]
pub(super) struct HopByHop {
    /// The client asks to switch protocols (see [`Upgrade::allowed`]).
    pub upgrade: Option<Upgrade>,
    /// The client accepts trailers (`TE: trailers`), as gRPC clients say.
    pub trailers: bool,
}

/// A client's wish to switch protocols, held across the hop-by-hop strip
/// until the API is known.
pub(super) struct Upgrade {
    protocol: HeaderValue,
    http2_settings: Option<HeaderValue>,
}

const HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");

/// The request's ID and the value echoed to the client. The client's one
/// header named `name` is kept when it is a well-formed ID (so a caller's ID
/// reaches the upstream and the logs as it sent it); absent, repeated or
/// malformed, it is replaced by a new ID, in the request too, which then
/// carries it upstream.
pub(super) fn request_id(headers: &mut HeaderMap, name: &HeaderName) -> (RequestId, HeaderValue) {
    // One lookup of the name, whether the client sent it or not.
    let entry = headers.entry(name);
    if let Entry::Occupied(sent) = &entry {
        let mut values = sent.iter();
        if let (Some(value), None) = (values.next(), values.next())
            && let Some(id) = RequestId::parse(value.as_bytes())
        {
            // Shared, not copied: the response head that holds it is written long
            // before the read buffer behind it is reused.
            return (id, value.clone());
        }
    }
    let id = RequestId::make();
    let value = id.to_header();
    match entry {
        Entry::Occupied(mut sent) => {
            sent.insert(value.clone());
        }
        Entry::Vacant(absent) => {
            absent.insert(value.clone());
        }
    }
    (id, value)
}

/// The inbound header stage. Returns the protocol the client asks to switch
/// to, for [`Upgrade::allowed`] once the API is known, and whether it accepts trailers. One pass over the
/// headers finds what needs doing; a request with nothing to remove, the
/// usual case, is left alone. The request-ID header stays even when the
/// client names it in `Connection`: the gateway set or checked it.
pub(super) fn clean_headers(
    headers: &mut HeaderMap,
    limits: &HeaderLimits,
    request_id: &HeaderName,
) -> Result<HopByHop, ProxyError> {
    let (mut total, mut hop_by_hop, mut underscores, mut gateway_set) = (0usize, false, false, false);
    for (name, value) in headers.iter() {
        let spelled = name.as_str().as_bytes();
        total += limits
            .counted(spelled.len(), value.len())
            .ok_or(ProxyError::HeadersTooLarge { limit: limits.field, what: "one request header" })?;
        hop_by_hop |= HOP_BY_HOP.contains(name) || name == header::UPGRADE;
        underscores |= holds_underscore(spelled);
        gateway_set |= name == X_CONSUMER_USERNAME;
    }
    if total > limits.total as usize {
        return Err(ProxyError::HeadersTooLarge { limit: limits.total, what: "the request headers" });
    }
    let mut taken = HopByHop::default();
    if hop_by_hop {
        only_chunked(headers)?;
        taken.upgrade = upgrade_protocol(headers)
            .map(|protocol| Upgrade { protocol, http2_settings: headers.get(HTTP2_SETTINGS).cloned() });
        taken.trailers = headers
            .get_all(header::TE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("trailers"));
        for name in named_in_connection(headers) {
            if !FRAMING.contains(&name) && name != request_id {
                headers.remove(name);
            }
        }
        // Transfer-Encoding stays until the forward: the policies read the framing.
        for name in HOP_BY_HOP.iter().filter(|name| **name != header::TRANSFER_ENCODING) {
            headers.remove(name);
        }
        headers.remove(header::UPGRADE);
    }
    if gateway_set {
        headers.remove(X_CONSUMER_USERNAME);
    }
    if underscores && !limits.underscores {
        let named: Vec<HeaderName> = headers.keys().filter(|name| name.as_str().contains('_')).cloned().collect();
        for name in named {
            headers.remove(name);
        }
    }
    Ok(taken)
}

/// Whether a request's fields may stay as the client sent them, out of a
/// header map, until they are written for the target (see `HeadFields`).
/// Only when this stage and the forward would change nothing in them: the
/// sizes within `limits`, no field this stage takes out (hop-by-hop, with
/// names holding `_`, set by the gateway alone), none the forward joins
/// or replaces but `Host`, no request ID (the gateway checks it), and no
/// tracing (the span replaces `traceparent`). A `Connection` that lists
/// only the connection's own options (`keep-alive`, `close`) names no
/// other field: the target's encoder leaves it out. Any other request
/// takes the map, where all of it is done.
pub(super) fn fields_stay_as_sent(fields: HeadFields<'_>, options: &ProxyOptions) -> bool {
    if options.tracer.is_some() {
        return false;
    }
    let (limits, request_id) = (&options.headers, options.request_id_header.as_str().as_bytes());
    let mut total = 0usize;
    for (name, value) in fields.iter() {
        let Some(counted) = limits.counted(name.len(), value.len()) else { return false };
        total += counted;
        if !field_stays_as_sent(name, value, request_id) {
            return false;
        }
    }
    total <= limits.total as usize
}

/// Puts fields kept as sent into the request's map, for a step that reads
/// or changes them there, with the request ID `id` the gateway adds:
/// `id_value` holds its header value once made (the response's takes it too).
pub(super) fn into_map(
    as_sent: &mut Option<HeadFields<'_>>,
    headers: &mut HeaderMap,
    id: &RequestId,
    id_value: &mut Option<HeaderValue>,
) -> Result<(), ProxyError> {
    let Some(fields) = as_sent.take() else { return Ok(()) };
    // httparse held them to the grammar the map's types check again: this
    // does not fail, but a field it refuses is refused, never passed on.
    fields.append_to(headers).map_err(|e| ProxyError::BadRequest(e.to_string()))?;
    if let Some((name, _)) = fields.added() {
        headers.insert(name, id_value.get_or_insert_with(|| id.to_header()).clone());
    }
    Ok(())
}

/// Moves the fields named `read` out of those kept as sent into the
/// request's map, for the policies that read or change them there (see
/// `PolicyChain::request_fields_read`); the others stay as sent.
pub(super) fn moved_into_map<'f>(
    fields: HeadFields<'f>,
    read: &'f [HeaderName],
    headers: &mut HeaderMap,
) -> Result<HeadFields<'f>, ProxyError> {
    // As in `into_map`: httparse held them to the grammar the map checks again.
    fields.moving(read, headers).map_err(|e| ProxyError::BadRequest(e.to_string()))
}

/// One field's part of `fields_stay_as_sent`.
#[inline]
fn field_stays_as_sent(name: &[u8], value: &[u8], request_id: &[u8]) -> bool {
    if holds_underscore(name) || (name.len() == request_id.len() && name.eq_ignore_ascii_case(request_id)) {
        return false;
    }
    if is_named(name, "connection") {
        let own_option = |option: &[u8]| {
            option.is_empty() || option.eq_ignore_ascii_case(b"keep-alive") || option.eq_ignore_ascii_case(b"close")
        };
        return value.split(|b| *b == b',').map(<[u8]>::trim_ascii).all(own_option);
    }
    // Each by length first: this runs on every field of most requests.
    !(is_hop_by_hop(name)
        || Replaced::of_spelled(name).is_some_and(|replaced| replaced != Replaced::Host)
        || is_named(name, X_CONSUMER_USERNAME_SPELLED))
}

/// Whether `name` holds a `_`: eight bytes at a time (a byte at a time
/// was most of `fields_stay_as_sent`'s cost), the last word overlapping
/// the one before where the length is not a multiple of 8.
fn holds_underscore(name: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH_BITS: u64 = u64::from_ne_bytes([0x80; 8]);
    const UNDERSCORES: u64 = u64::from_ne_bytes([b'_'; 8]);
    // A zero byte in `word ^ UNDERSCORES` is a `_` in `word` (the classic has-zero-byte test, exact as a yes or no).
    let holds = |at: usize| {
        name.get(at..at + 8).and_then(|word| <[u8; 8]>::try_from(word).ok()).is_some_and(|word| {
            let x = u64::from_ne_bytes(word) ^ UNDERSCORES;
            x.wrapping_sub(ONES) & !x & HIGH_BITS != 0
        })
    };
    match name.len() {
        0..8 => name.contains(&b'_'),
        length => (0..length - 8).step_by(8).any(holds) || holds(length - 8),
    }
}

/// `Some(protocol)` when the client asks to switch protocols (WebSocket).
fn upgrade_protocol(headers: &HeaderMap) -> Option<HeaderValue> {
    let wants_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    if wants_upgrade { headers.get(header::UPGRADE).cloned() } else { None }
}

/// A request's `Transfer-Encoding` must be `chunked` alone. hyper frames the
/// body by a list that ends in `chunked` and takes nothing else off it, and
/// the forward re-frames the body for the upstream without the header, so
/// another coding first (`gzip, chunked`) would reach the upstream still
/// encoded with nothing saying so, and `chunked, chunked` would hand it one
/// layer of chunk framing as data. RFC 9112 §6.1: a coding the gateway does
/// not implement is answered 501. (hyper has already refused with 400 a list
/// not ending in `chunked`, and any `Transfer-Encoding` on HTTP/1.0.)
fn only_chunked(headers: &HeaderMap) -> Result<(), ProxyError> {
    let mut codings = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|value| value.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|coding| !coding.is_empty());
    match (codings.next(), codings.next()) {
        (None, _) => Ok(()),
        (Some(coding), None) if coding.eq_ignore_ascii_case(b"chunked") => Ok(()),
        _ => {
            let all = headers.get_all(header::TRANSFER_ENCODING).iter();
            let listed: Vec<String> = all.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()).collect();
            Err(ProxyError::TransferCoding(listed.join(", ")))
        }
    }
}

impl Upgrade {
    /// The switch if the API allows it: any, but `h2c` only where
    /// `allow_h2c` (an upstream that speaks it would otherwise get a raw
    /// tunnel the gateway cannot see into).
    pub(super) fn allowed(self, allow_h2c: bool) -> Option<Upgrade> {
        let h2c = self.protocol.to_str().is_ok_and(|p| p.split(',').any(|p| p.trim().eq_ignore_ascii_case("h2c")));
        if h2c && !allow_h2c {
            return None;
        }
        Some(Upgrade { http2_settings: self.http2_settings.filter(|_| h2c), ..self })
    }

    /// Asks the upstream for the switch, in the headers of the request it gets.
    pub(super) fn write_to(self, headers: &mut HeaderMap) {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, self.protocol);
        if let Some(settings) = self.http2_settings {
            headers.insert(HTTP2_SETTINGS, settings);
        }
    }
}

/// What canonicalising the request path found.
pub(super) struct Canonicalized {
    /// The client's path and query, when the request now carries another path.
    pub raw: Option<PathAndQuery>,
    /// The path holds an encoded `/` or `\`: refused unless the API forwards raw paths.
    pub encoded_separator: bool,
}

/// Puts the canonical form of the request's path in its URI (and in the
/// exchange, for the access log and problem details). A path that already is
/// canonical, the usual case, is left alone without allocating.
pub(super) fn canonicalize_path<B>(
    request: &mut Request<B>,
    exchange: &mut Exchange,
) -> Result<Canonicalized, ProxyError> {
    let canonical = canonical_path(request.uri().path())?;
    let encoded_separator = canonical.encoded_separator;
    if !canonical.changed() {
        return Ok(Canonicalized { raw: None, encoded_separator });
    }
    let path = canonical.path.into_owned();
    exchange.path = RequestPath::Copied(path.as_str().into());
    let path_and_query = match request.uri().query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let mut parts = request.uri().clone().into_parts();
    let canonical = PathAndQuery::try_from(path_and_query).map_err(|e| ProxyError::BadRequest(e.to_string()))?;
    let raw = parts.path_and_query.replace(canonical);
    *request.uri_mut() = Uri::from_parts(parts).map_err(|e| ProxyError::BadRequest(e.to_string()))?;
    Ok(Canonicalized { raw, encoded_separator })
}

/// The host the request is routed by, in canonical form; `None` for a
/// request that names none (HTTP/1.0, or HTTP/2 without `:authority`),
/// which only APIs for any host serve. Refused: an invalid host or port,
/// more than one `Host`, an HTTP/1.1 request without one, and a request
/// target (absolute-form, or HTTP/2's `:authority`) naming another host
/// than `Host`: a front proxy and the gateway could each route by another.
/// `as_sent`: the request's fields when they are not in its map.
pub(super) fn request_host<'r, B>(
    request: &'r Request<B>,
    as_sent: Option<HeadFields<'r>>,
) -> Result<Option<CanonicalHost<'r>>, ProxyError> {
    let (header, repeated) = match as_sent {
        Some(fields) => {
            let mut hosts = fields.values("host");
            (hosts.next(), hosts.next().is_some())
        }
        None => {
            let mut hosts = request.headers().get_all(header::HOST).iter().map(HeaderValue::as_bytes);
            (hosts.next(), hosts.next().is_some())
        }
    };
    if repeated {
        return Err(HostError::Repeated.into());
    }
    let header = match header {
        Some(value) => Some(canonical_host_field(value)?),
        None => None,
    };
    let Some(authority) = request.uri().authority() else {
        if header.is_none() && request.version() == Version::HTTP_11 {
            return Err(HostError::Missing.into());
        }
        return Ok(header);
    };
    let target = canonical_host(authority.as_str())?;
    match header {
        Some(header) if !header.agrees_with(&target) => Err(HostError::Disagrees.into()),
        _ => Ok(Some(target)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::http1_wire::fields_of;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn names(map: &HeaderMap) -> Vec<&str> {
        map.keys().map(HeaderName::as_str).collect()
    }

    const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

    #[test]
    fn an_underscore_is_found_wherever_it_is() {
        for length in 0..40 {
            assert!(!holds_underscore(&"x-a~^`|".repeat(6).as_bytes()[..length]), "{length}");
            for at in 0..length {
                let mut name = vec![b'a'; length];
                name[at] = b'_';
                assert!(holds_underscore(&name), "{length} {at}");
            }
        }
    }

    #[tokio::test]
    async fn fields_stay_as_sent_only_where_nothing_in_them_changes_before_the_encoder() {
        let options = ProxyOptions::default();
        let stays = |lines: &str| {
            let (head, fields) = fields_of(&format!("Host: a.example\r\n{lines}\r\n"));
            fields_stay_as_sent(HeadFields::new(&head, &fields), &options)
        };
        for kept in ["", "Accept: */*\r\nContent-Length: 3\r\n", "Connection: keep-alive\r\n", "connection: Close\r\n"]
        {
            assert!(stays(kept), "{kept:?}");
        }
        for taken in [
            "Connection: keep-alive, x-secret\r\n",
            "Keep-Alive: timeout=5\r\n",
            "Proxy-Authorization: Basic eDp5\r\n",
            "X-Consumer-Username: admin\r\n",
            "X_Consumer_Username: admin\r\n",
            "X-Forwarded-For: 1.2.3.4\r\n",
            "x-forwarded-proto: https\r\n",
            "X-Forwarded-Host: evil.example\r\n",
            "Via: 1.1 edge\r\n",
            "X-Request-Id: abc\r\n",
        ] {
            assert!(!stays(taken), "{taken:?}");
        }
        let long = format!("X-Long: {}\r\n", "a".repeat(DEFAULT_HEADER_LIMITS.field as usize));
        assert!(!stays(&long));
        let settings = crate::trace::TraceSettings {
            endpoint: "http://127.0.0.1:4317".into(),
            sampling_ratio: 1.0,
            service_name: "test".into(),
            node_id: "test".into(),
        };
        let (tracer, _exporter) = crate::trace::Tracer::new(settings).unwrap();
        let traced = ProxyOptions { tracer: Some(tracer), ..ProxyOptions::default() };
        let (head, fields) = fields_of("Host: a.example\r\n\r\n");
        assert!(!fields_stay_as_sent(HeadFields::new(&head, &fields), &traced));
    }

    #[test]
    fn request_id_is_the_clients_when_well_formed() {
        // One well-formed value: kept, and echoed as sent.
        let mut map = headers(&[("x-request-id", "abc-123")]);
        let (id, echo) = request_id(&mut map, &X_REQUEST_ID);
        assert_eq!((id.as_str(), echo.to_str().unwrap()), ("abc-123", "abc-123"));
        assert_eq!(map.get_all(&X_REQUEST_ID).iter().collect::<Vec<_>>(), ["abc-123"]);
        // Absent, malformed, too long or repeated: replaced by a new one in the request too.
        let long = "a".repeat(65);
        for sent in [&[][..], &["a b"], &["<x>"], &[long.as_str()], &["one", "two"]] {
            let mut map = HeaderMap::new();
            for value in sent {
                map.append(X_REQUEST_ID, HeaderValue::from_str(value).unwrap());
            }
            let (id, echo) = request_id(&mut map, &X_REQUEST_ID);
            assert_eq!(id.as_str().len(), 26, "{sent:?}");
            assert_eq!(echo, id.as_str());
            assert_eq!(map.get_all(&X_REQUEST_ID).iter().collect::<Vec<_>>(), [id.as_str()], "{sent:?}");
        }
        // A configured name is the one read.
        let trace = HeaderName::from_static("x-trace");
        let mut map = headers(&[("x-trace", "t1"), ("x-request-id", "other")]);
        assert_eq!(request_id(&mut map, &trace).0.as_str(), "t1");
        // Naming it in Connection does not take it away from the upstream.
        let mut map = headers(&[("connection", "x-request-id"), ("x-request-id", "abc")]);
        clean_headers(&mut map, &DEFAULT_HEADER_LIMITS, &X_REQUEST_ID).unwrap();
        assert_eq!(names(&map), ["x-request-id"]);
    }

    #[test]
    fn hop_by_hop_and_gateway_headers_go_before_any_policy() {
        let mut map = headers(&[
            ("connection", "X-Consumer-Username, x-internal, content-length, transfer-encoding, host"),
            ("x-internal", "1"),
            ("x-consumer-username", "alice"),
            ("x_consumer_username", "alice"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("host", "a.example"),
            ("x-kept", "yes"),
        ]);
        let taken = clean_headers(&mut map, &DEFAULT_HEADER_LIMITS, &X_REQUEST_ID).unwrap();
        assert!(taken.upgrade.is_none() && taken.trailers);
        assert_eq!(names(&map), ["transfer-encoding", "host", "x-kept"]);

        let mut map = headers(&[("x_custom", "1"), ("x-kept", "yes")]);
        clean_headers(&mut map, &HeaderLimits { underscores: true, ..DEFAULT_HEADER_LIMITS }, &X_REQUEST_ID).unwrap();
        assert_eq!(names(&map), ["x_custom", "x-kept"]);
    }

    #[test]
    fn transfer_encoding_is_chunked_alone() {
        let cases: &[(&[&str], bool)] = &[
            (&["chunked"], true),
            (&["Chunked "], true),
            (&[], true),
            (&["gzip, chunked"], false),
            (&["chunked, chunked"], false),
            (&["identity", "chunked"], false),
            (&["chunked", "chunked"], false),
            (&["chunked,"], true),
        ];
        for (values, allowed) in cases {
            let pairs: Vec<(&str, &str)> = values.iter().map(|v| ("transfer-encoding", *v)).collect();
            let mut map = headers(&pairs);
            let result = clean_headers(&mut map, &DEFAULT_HEADER_LIMITS, &X_REQUEST_ID);
            assert_eq!(result.is_ok(), *allowed, "{values:?}");
            if !allowed {
                assert!(matches!(result, Err(ProxyError::TransferCoding(_))), "{values:?}");
            }
        }
    }

    #[test]
    fn upgrade_detection() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert_eq!(upgrade_protocol(&h), None);
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        assert_eq!(upgrade_protocol(&h), Some(HeaderValue::from_static("websocket")));
    }

    #[test]
    fn upgrades_survive_but_h2c_only_where_allowed() {
        let upgrade = |protocol: &str| {
            headers(&[("connection", "Upgrade, HTTP2-Settings"), ("upgrade", protocol), ("http2-settings", "AAMA")])
        };
        for (protocol, allow_h2c, kept) in
            [("websocket", false, true), ("h2c", false, false), ("H2C", false, false), ("h2c", true, true)]
        {
            let mut map = upgrade(protocol);
            let found = clean_headers(&mut map, &DEFAULT_HEADER_LIMITS, &X_REQUEST_ID).unwrap();
            assert!(map.is_empty(), "{protocol}: {map:?}");
            assert!(!found.trailers);
            if let Some(upgrade) = found.upgrade.and_then(|upgrade| upgrade.allowed(allow_h2c)) {
                upgrade.write_to(&mut map);
            }
            assert_eq!(map.get(header::UPGRADE).is_some(), kept, "{protocol} {allow_h2c}");
            assert_eq!(map.get(HTTP2_SETTINGS).is_some(), kept && allow_h2c, "{protocol} {allow_h2c}");
        }
    }

    #[test]
    fn oversized_headers_are_refused() {
        let limits = HeaderLimits { total: 1000, field: 300, underscores: false };
        let big = "x".repeat(300);
        let mut one = headers(&[("x-big", big.as_str())]);
        assert!(matches!(
            clean_headers(&mut one, &limits, &X_REQUEST_ID),
            Err(ProxyError::HeadersTooLarge { limit: 300, .. })
        ));
        let value = "x".repeat(250);
        let mut many = headers(&[("a", &value), ("b", &value), ("c", &value), ("d", &value)]);
        assert!(matches!(
            clean_headers(&mut many, &limits, &X_REQUEST_ID),
            Err(ProxyError::HeadersTooLarge { limit: 1000, .. })
        ));
        let mut fine = headers(&[("a", &value), ("b", &value), ("c", &value)]);
        assert!(clean_headers(&mut fine, &limits, &X_REQUEST_ID).is_ok());
    }

    fn request(version: Version, uri: &str, hosts: &[&str]) -> Request<()> {
        let mut request = Request::builder().version(version).uri(uri);
        for host in hosts {
            request = request.header(header::HOST, *host);
        }
        request.body(()).unwrap()
    }

    /// (version, URI, Host headers, the host routed by or the refusal)
    type Case<'a> = (Version, &'a str, &'a [&'a str], Result<Option<&'a str>, HostError>);

    #[test]
    fn request_host_table() {
        const HTTP_10: Version = Version::HTTP_10;
        const HTTP_11: Version = Version::HTTP_11;
        const HTTP_2: Version = Version::HTTP_2;
        let cases: &[Case<'_>] = &[
            (HTTP_11, "/x", &["Secure.Example.com."], Ok(Some("secure.example.com"))),
            (HTTP_11, "/x", &["secure.example.com:8443"], Ok(Some("secure.example.com"))),
            (HTTP_11, "/x", &["secure.example.com:abc"], Err(HostError::BadPort)),
            (HTTP_11, "/x", &["secure.example.com", "other.example"], Err(HostError::Repeated)),
            (HTTP_11, "/x", &[], Err(HostError::Missing)),
            (HTTP_10, "/x", &[], Ok(None)),
            (HTTP_11, "http://other.example/x", &["secure.example.com"], Err(HostError::Disagrees)),
            (HTTP_11, "http://SECURE.example.com./x", &["secure.example.com:80"], Ok(Some("secure.example.com"))),
            (HTTP_11, "http://secure.example.com/x", &[], Ok(Some("secure.example.com"))),
            (HTTP_11, "http://user@secure.example.com/x", &[], Err(HostError::BadName)),
            (HTTP_2, "https://secure.example.com/x", &["other.example"], Err(HostError::Disagrees)),
            (HTTP_2, "https://secure.example.com/x", &["secure.example.com"], Ok(Some("secure.example.com"))),
            (HTTP_2, "/x", &[], Ok(None)),
        ];
        for (version, uri, hosts, want) in cases {
            let request = request(*version, uri, hosts);
            // The same, from the map and from the fields kept as sent.
            let lines: String = hosts.iter().map(|host| format!("Host: {host}\r\n")).chain(["\r\n".into()]).collect();
            let (head, fields) = fields_of(&lines);
            let without_map = Request::builder().version(*version).uri(*uri).body(()).unwrap();
            for (request, as_sent) in [(&request, None), (&without_map, Some(HeadFields::new(&head, &fields)))] {
                let got = match request_host(request, as_sent) {
                    Ok(host) => Ok(host.map(|h| h.name.into_owned())),
                    Err(ProxyError::InvalidHost(e)) => Err(e),
                    Err(other) => panic!("{uri} {hosts:?}: {other}"),
                };
                assert_eq!(got, want.map(|h| h.map(str::to_owned)), "{version:?} {uri} {hosts:?} {as_sent:?}");
            }
        }
    }
}
