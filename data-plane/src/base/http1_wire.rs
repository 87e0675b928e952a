//! What both HTTP/1.1 legs the data plane speaks itself share (the
//! request to a target, `upstream::http1`, and the response to a client,
//! `proxy::http1`): where a parsed head's fields lie and the header map
//! made of them, how a body is framed, and reading into a buffer (writing
//! one out is `WriteBuffer`'s).

use std::io::Write as _;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::BoxError;

/// Headers that describe one hop, never the end-to-end message (RFC 9110
/// §7.6.1). Not `Trailer`: it names the trailer fields of the message, end
/// to end, and an HTTP/1.1 server sends only the trailers it names.
pub const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
];

/// Whether a field named `name` (a token as it came on the wire, in any case)
/// describes one hop: one of [`HOP_BY_HOP`], or `Upgrade`. By length first:
/// this runs on every field of every response head from a target.
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    let same_length: &[&[u8]] = match name.len() {
        2 => &[b"te"],
        7 => &[b"upgrade"],
        10 => &[b"connection", b"keep-alive"],
        16 => &[b"proxy-connection"],
        17 => &[b"transfer-encoding"],
        18 => &[b"proxy-authenticate"],
        19 => &[b"proxy-authorization"],
        _ => return false,
    };
    same_length.iter().any(|hop| same_in_any_case(name, hop))
}

/// A header field's name and value, as byte ranges of the head it was parsed from.
#[derive(Debug)]
pub struct Field {
    pub name: (usize, usize),
    pub value: (usize, usize),
}

/// A request's header fields left where the client's head holds them, out
/// of any header map: a request for an API without policies goes to an
/// HTTP/1.1 target with its fields written from here, when nothing would
/// change them before (see `proxy::inbound::fields_stay_as_sent`).
/// Building the map only to write it out again cost a proxied request
/// more than the rest of its header handling.
#[derive(Clone, Copy, Debug)]
pub struct HeadFields<'f> {
    head: &'f Bytes,
    fields: &'f [Field],
    /// A field the gateway adds after them (the request ID), kept as bytes
    /// until it is written: a header value of it would be an allocation.
    added: Option<(&'f HeaderName, &'f [u8])>,
    /// The names of the fields moved into the request's map, where the
    /// policies read and edit them (see `moving`): left out here.
    moved: &'f [HeaderName],
}

impl<'f> HeadFields<'f> {
    /// The fields `fields` says lie in `head`.
    pub fn new(head: &'f Bytes, fields: &'f [Field]) -> Self {
        HeadFields { head, fields, added: None, moved: &[] }
    }

    /// The same fields, and after them `name: value`, a field the gateway adds.
    pub fn adding(self, name: &'f HeaderName, value: &'f [u8]) -> Self {
        HeadFields { added: Some((name, value)), ..self }
    }

    /// The field the gateway adds, if any (see `adding`).
    pub fn added(self) -> Option<(&'f HeaderName, &'f [u8])> {
        self.added
    }

    /// The same fields, those named `names` (the fields a step reads or
    /// edits in a map) appended to `headers`: from then on the writers of
    /// these fields leave them out (see `moved`, `append_to`), the map
    /// holding them as the step left them.
    pub fn moving(self, names: &'f [HeaderName], headers: &mut HeaderMap) -> Result<Self, InvalidField> {
        let head = self.head;
        append_fields(headers, head, self.fields.iter().filter(|field| is_one_of(field.name_in(head), names)))?;
        Ok(HeadFields { moved: names, ..self })
    }

    /// The names of the fields moved into a map (see `moving`), which a
    /// writer of these fields leaves out.
    pub fn moved(self) -> &'f [HeaderName] {
        self.moved
    }

    /// Each field's name (as spelled) and value, in order, those moved into a map included.
    pub fn iter(self) -> impl Iterator<Item = (&'f [u8], &'f [u8])> {
        let head: &'f [u8] = self.head;
        self.fields.iter().map(move |field| (field.name_in(head), &head[field.value.0..field.value.1]))
    }

    /// The values of the fields named `name` (see `is_named`), in any case.
    pub fn values(self, name: &'static str) -> impl Iterator<Item = &'f [u8]> {
        self.iter().filter(move |(spelled, _)| is_named(spelled, name)).map(|(_, value)| value)
    }

    /// `part` as bytes that share the head's buffer, when it lies in the
    /// head (as every part of the request line does): a path cut out of
    /// the request's target then costs no copy.
    pub fn share(self, part: &[u8]) -> Option<Bytes> {
        let (start, head) = (part.as_ptr() as usize, self.head.as_ptr() as usize);
        let inside = start >= head && start + part.len() <= head + self.head.len();
        inside.then(|| self.head.slice_ref(part))
    }

    /// Appends the client's fields to `headers` (not the one the gateway
    /// adds, whose value the caller may hold already, nor those moved there before).
    pub fn append_to(self, headers: &mut HeaderMap) -> Result<(), InvalidField> {
        let (head, moved) = (self.head, self.moved);
        append_fields(headers, head, self.fields.iter().filter(|field| !is_one_of(field.name_in(head), moved)))
    }
}

/// The fields of `lines` (header lines ending in an empty line), as a
/// parsed head has them: for tests of what reads `HeadFields`.
#[cfg(test)]
pub fn fields_of(lines: &str) -> (Bytes, Vec<Field>) {
    let head = Bytes::copy_from_slice(lines.as_bytes());
    let mut parsed = [httparse::EMPTY_HEADER; 32];
    let Ok(httparse::Status::Complete((_, parsed))) = httparse::parse_headers(&head, &mut parsed) else {
        panic!("not whole header lines: {lines:?}");
    };
    let fields = parsed.iter().map(|field| Field::of(&head, field)).collect();
    (head, fields)
}

/// Where `part` (a slice httparse took out of `head`) lies in `head`.
pub fn range(head: &[u8], part: &[u8]) -> (usize, usize) {
    let start = part.as_ptr() as usize - head.as_ptr() as usize;
    (start, start + part.len())
}

impl Field {
    pub fn of(head: &[u8], field: &httparse::Header<'_>) -> Field {
        Field { name: range(head, field.name.as_bytes()), value: range(head, field.value) }
    }

    /// The field's name as spelled in `head`, the head it was parsed from.
    fn name_in<'h>(&self, head: &'h [u8]) -> &'h [u8] {
        &head[self.name.0..self.name.1]
    }
}

/// A `Content-Length` value: `1*DIGIT` that fits in 64 bits (no sign, no list, no spaces).
pub fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0u64, |n, digit| n.checked_mul(10)?.checked_add(u64::from(digit - b'0')))
}

/// A field the header map's types refuse.
#[derive(Debug, thiserror::Error)]
#[error("invalid header field")]
pub struct InvalidField;

/// The name of a field most heads carry, as `HeaderName::from_bytes` would
/// name it, for a name httparse took (a token); `None` for any other.
/// `from_bytes` lower-cases every name into a buffer before it looks for a
/// standard one: for these few, told by length and first letter and then
/// compared a word at a time, that was most of a field's cost.
fn common_name(spelled: &[u8]) -> Option<HeaderName> {
    let first = spelled.first()? | CASE_BIT;
    let name = match (spelled.len(), first) {
        (3, b'v') => header::VIA,
        (3, b'a') => header::AGE,
        (4, b'h') => header::HOST,
        (4, b'd') => header::DATE,
        (4, b'e') => header::ETAG,
        (4, b'v') => header::VARY,
        (6, b'a') => header::ACCEPT,
        (6, b'c') => header::COOKIE,
        (6, b's') => header::SERVER,
        (6, b'o') => header::ORIGIN,
        (7, b'r') => header::REFERER,
        (8, b'l') => header::LOCATION,
        (10, b'u') => header::USER_AGENT,
        (10, b'c') => header::CONNECTION,
        (10, b's') => header::SET_COOKIE,
        (12, b'c') => header::CONTENT_TYPE,
        (13, b'a') => header::AUTHORIZATION,
        (13, b'c') => header::CACHE_CONTROL,
        (13, b'l') => header::LAST_MODIFIED,
        (13, b'i') => header::IF_NONE_MATCH,
        (14, b'c') => header::CONTENT_LENGTH,
        (15, b'a') if spelled[7] | CASE_BIT == b'e' => header::ACCEPT_ENCODING,
        (15, b'a') => header::ACCEPT_LANGUAGE,
        (16, b'c') => header::CONTENT_ENCODING,
        (17, b't') => header::TRANSFER_ENCODING,
        _ => return None,
    };
    same_in_any_case(spelled, name.as_str().as_bytes()).then_some(name)
}

/// Whether a field's name as spelled on the wire (a token, in any case) is
/// `lower`, a name of lower-case letters, digits and `-`.
#[inline]
pub fn is_named(spelled: &[u8], lower: &str) -> bool {
    same_in_any_case(spelled, lower.as_bytes())
}

/// Whether a field's name as spelled on the wire is one of `names`.
pub fn is_one_of(spelled: &[u8], names: &[HeaderName]) -> bool {
    names.iter().any(|name| is_named(spelled, name.as_str()))
}

/// The bit that tells an ASCII letter's cases apart.
const CASE_BIT: u8 = 0x20;

/// Whether `spelled` is `lower` in any case, where `lower` is lower-case
/// letters and `-` and `spelled` a token. Setting the case bit folds a
/// letter to lower case and leaves `-` and digits as they are; the only
/// other byte it would make a `-` of is CR, which no token holds.
fn same_in_any_case(spelled: &[u8], lower: &[u8]) -> bool {
    const WORD_CASE_BITS: u64 = u64::from_ne_bytes([CASE_BIT; 8]);
    let word = |bytes: &[u8], at: usize| bytes.get(at..at + 8).and_then(|w| <[u8; 8]>::try_from(w).ok());
    let same_word = |at: usize| match (word(spelled, at), word(lower, at)) {
        (Some(spelled), Some(lower)) => u64::from_ne_bytes(spelled) | WORD_CASE_BITS == u64::from_ne_bytes(lower),
        _ => false,
    };
    let length = spelled.len();
    if length != lower.len() {
        return false;
    }
    if length < 8 {
        return spelled.iter().zip(lower).all(|(s, l)| s | CASE_BIT == *l);
    }
    // Whole words, the last one overlapping the one before where the length is not a multiple of 8.
    (0..length - 8).step_by(8).all(same_word) && same_word(length - 8)
}

/// Appends `fields`, as they lie in `head`, to `headers`; the values share `head`'s bytes.
pub fn append_fields<'f>(
    headers: &mut HeaderMap,
    head: &Bytes,
    fields: impl IntoIterator<Item = &'f Field>,
) -> Result<(), InvalidField> {
    for field in fields {
        // httparse has held names to the token grammar and values to
        // visible characters, spaces and tabs, as these check again.
        let spelled = field.name_in(head);
        let name = match common_name(spelled) {
            Some(name) => name,
            None => HeaderName::from_bytes(spelled).map_err(|_| InvalidField)?,
        };
        let value =
            HeaderValue::from_maybe_shared(head.slice(field.value.0..field.value.1)).map_err(|_| InvalidField)?;
        headers.append(name, value);
    }
    Ok(())
}

/// Puts `headers` into a message's map `slot`, which usually holds the
/// empty map a new `Request` or `Response` starts with, or one left by a
/// `take`. Such a map has never held anything and owns no memory, so it is
/// forgotten instead of dropped: its drop glue is a call per message for
/// nothing. Any other map is dropped as usual.
pub fn put_headers(slot: &mut HeaderMap, headers: HeaderMap) {
    let replaced = std::mem::replace(slot, headers);
    if replaced.capacity() == 0 {
        std::mem::forget(replaced);
    }
}

/// Appends the header line `name: value` to a head being written (inlined, as `write_line`).
#[inline(always)]
pub fn write_field(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    write_line(out, name.as_str().as_bytes(), value.as_bytes());
}

/// Appends the header line `name: value` to a head being written, from
/// the bytes of a head httparse took (which hold to the field grammar).
/// Always inlined: a call per header line cost more than its body.
#[inline(always)]
pub fn write_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    // The two-byte separators are pushed: a copy call each would cost more.
    out.extend_from_slice(name);
    out.push(b':');
    out.push(b' ');
    out.extend_from_slice(value);
    out.push(b'\r');
    out.push(b'\n');
}

/// What a read asks the socket for at least.
const READ_SIZE: usize = 8 * 1024;

/// Makes room in `buffer` for the next read (a read into a full buffer
/// would read nothing, as at the end of the stream). An emptied buffer that nothing
/// else holds any more (the last message's bytes have been dropped) starts
/// again at its front, so every message on a connection lands in the same
/// few cache lines: reading on from where the last one ended walked each
/// connection's 8 KiB, both legs' buffers outgrew the core's cache under a
/// few hundred connections, and the next message's bytes were written to
/// lines fetched from memory (bench/README.md).
pub fn make_room(buffer: &mut BytesMut) {
    // Cheap either way: it only looks at who else holds the buffer.
    let reclaimed = buffer.is_empty() && buffer.try_reclaim(READ_SIZE);
    if !reclaimed && buffer.capacity() - buffer.len() < READ_SIZE / 4 {
        buffer.reserve(READ_SIZE);
    }
}

/// The framing of a body being written, with what is left of it.
#[derive(Debug)]
pub enum BodyEncoder {
    /// No body (or its last byte written).
    Done,
    /// `Content-Length`: this many bytes still to write.
    Length(u64),
    Chunked,
}

impl BodyEncoder {
    /// Says in a head (`out`) how a body of `length` (`None`: not known
    /// ahead) follows, and returns its encoder.
    pub fn announce(out: &mut Vec<u8>, length: Option<u64>) -> BodyEncoder {
        match length {
            Some(length) => {
                out.extend_from_slice(b"content-length: ");
                out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
                out.extend_from_slice(b"\r\n");
                BodyEncoder::Length(length)
            }
            None => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                BodyEncoder::Chunked
            }
        }
    }

    /// Whether nothing (more) is to be written.
    pub fn is_done(&self) -> bool {
        matches!(self, BodyEncoder::Done | BodyEncoder::Length(0))
    }

    /// Appends `data`, framed, to `out`.
    pub fn encode(&mut self, out: &mut Vec<u8>, data: &Bytes) -> Result<(), BoxError> {
        match self {
            BodyEncoder::Length(left) => {
                *left = left.checked_sub(data.len() as u64).ok_or("body longer than its Content-Length")?;
                out.extend_from_slice(data);
            }
            BodyEncoder::Chunked if data.is_empty() => {}
            BodyEncoder::Chunked => {
                // Writing into a Vec cannot fail.
                let _ = write!(out, "{:x}\r\n", data.len());
                out.extend_from_slice(data);
                out.extend_from_slice(b"\r\n");
            }
            BodyEncoder::Done => return Err("body after its end".into()),
        }
        Ok(())
    }

    /// Appends the end of the body (the last chunk), or fails when it is short of its length.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        match std::mem::replace(self, BodyEncoder::Done) {
            BodyEncoder::Length(0) | BodyEncoder::Done => Ok(()),
            BodyEncoder::Length(_) => Err("body shorter than its Content-Length".into()),
            BodyEncoder::Chunked => {
                out.extend_from_slice(b"0\r\n\r\n");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `message` into `buffer` as a socket read would, and takes it out as the request path does.
    fn read_message(buffer: &mut BytesMut, message: &[u8]) -> Bytes {
        make_room(buffer);
        buffer.extend_from_slice(message);
        buffer.split_to(message.len()).freeze()
    }

    #[test]
    fn each_message_lands_at_the_buffers_front_once_the_last_ones_bytes_are_dropped() {
        let mut buffer = BytesMut::new();
        let first = read_message(&mut buffer, b"GET /a HTTP/1.1\r\n\r\n");
        let front = first.as_ptr();
        drop(first);
        for _ in 0..1_000 {
            let next = read_message(&mut buffer, b"GET /b HTTP/1.1\r\n\r\n");
            assert_eq!(next.as_ptr(), front, "read where the last message began, in the same allocation");
        }
    }

    #[test]
    fn a_buffer_whose_bytes_are_still_held_is_read_on_after_them_and_never_overwrites_them() {
        let mut buffer = BytesMut::new();
        let held: Vec<Bytes> = (0..1_000u32).map(|i| read_message(&mut buffer, &i.to_be_bytes())).collect();
        for (i, message) in (0..1_000u32).zip(&held) {
            assert_eq!(&message[..], i.to_be_bytes(), "message {i}");
        }
        // Room is made for every read, held bytes or not.
        make_room(&mut buffer);
        assert!(buffer.capacity() >= READ_SIZE / 4);
    }

    #[test]
    fn hop_by_hop_names_are_told_in_any_case_and_no_others() {
        for name in HOP_BY_HOP.iter().map(HeaderName::as_str).chain(["upgrade"]) {
            assert!(is_hop_by_hop(name.as_bytes()), "{name}");
            assert!(is_hop_by_hop(name.to_ascii_uppercase().as_bytes()), "{name}");
        }
        for name in ["trailer", "content-length", "via", "date", "te-", "connectio", "keep-alives", ""] {
            assert!(!is_hop_by_hop(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn common_names_are_named_as_the_header_map_names_them() {
        let common = "via age host date etag vary accept cookie server origin referer location user-agent \
                      connection set-cookie content-type authorization cache-control last-modified if-none-match \
                      content-length accept-encoding accept-language content-encoding transfer-encoding";
        let title_case = |name: &str| {
            name.split('-').map(|word| word[..1].to_ascii_uppercase() + &word[1..]).collect::<Vec<_>>().join("-")
        };
        for name in common.split_whitespace() {
            for spelled in [name.to_owned(), name.to_ascii_uppercase(), title_case(name)] {
                let expected = HeaderName::from_bytes(spelled.as_bytes()).unwrap();
                assert_eq!(common_name(spelled.as_bytes()), Some(expected), "{spelled}");
            }
        }
        let others = "x-request-id content-lengths content_length content-lengti hos vias accept-encodinx \
                      x-forwarded-for";
        for other in others.split_whitespace().chain([""]) {
            assert_eq!(common_name(other.as_bytes()), None, "{other}");
        }
    }

    #[test]
    fn fields_moved_into_a_map_are_there_in_order_and_nowhere_else() {
        let (head, fields) =
            fields_of("Host: h\r\nAuthorization: Basic a\r\nX-Kept: 1\r\nAUTHORIZATION: Basic b\r\nX-Key: k\r\n\r\n");
        let names = [header::AUTHORIZATION, HeaderName::from_static("x-key")];
        let mut map = HeaderMap::new();
        let kept = HeadFields::new(&head, &fields).moving(&names, &mut map).unwrap();
        let moved: Vec<_> = map.get_all(header::AUTHORIZATION).iter().map(HeaderValue::as_bytes).collect();
        assert_eq!(moved, [b"Basic a".as_slice(), b"Basic b"]);
        assert_eq!(map["x-key"], "k");
        assert_eq!(map.len(), 3);
        assert_eq!(kept.moved(), names);
        // The rest follow them into a map, once each.
        kept.append_to(&mut map).unwrap();
        assert_eq!((map.len(), map.get_all(header::AUTHORIZATION).iter().count()), (5, 2));
    }

    #[test]
    fn frames_by_length_or_in_chunks_and_refuses_the_wrong_length() {
        let mut out = Vec::new();
        let mut chunked = BodyEncoder::Chunked;
        chunked.encode(&mut out, &Bytes::from_static(b"hello world, hi")).unwrap();
        chunked.encode(&mut out, &Bytes::new()).unwrap();
        chunked.finish(&mut out).unwrap();
        assert_eq!(out, b"f\r\nhello world, hi\r\n0\r\n\r\n");

        let mut out = Vec::new();
        let mut length = BodyEncoder::Length(5);
        length.encode(&mut out, &Bytes::from_static(b"hel")).unwrap();
        assert!(length.finish(&mut out).is_err(), "two bytes short");
        let mut length = BodyEncoder::Length(2);
        assert!(length.encode(&mut out, &Bytes::from_static(b"hel")).is_err(), "one byte long");
        assert!(BodyEncoder::Done.encode(&mut out, &Bytes::from_static(b"x")).is_err());
    }
}
