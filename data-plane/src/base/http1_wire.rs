//! What both HTTP/1.1 legs the data plane speaks itself share (the
//! request to a target, `upstream::http1`, and the response to a client,
//! `proxy::http1`): where a parsed head's fields lie and the header map
//! made of them, how a body is framed, and writing a buffer out.

use std::io::{self, Write as _};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use tokio::io::AsyncWrite;

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

/// Whether a field named `name` (as it came on the wire, in any case)
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
    same_length.iter().any(|hop| name.eq_ignore_ascii_case(hop))
}

/// A header field's name and value, as byte ranges of the head it was parsed from.
#[derive(Debug)]
pub struct Field {
    pub name: (usize, usize),
    pub value: (usize, usize),
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

/// Appends `fields`, as they lie in `head`, to `headers`; the values share `head`'s bytes.
pub fn append_fields(headers: &mut HeaderMap, head: &Bytes, fields: &[Field]) -> Result<(), InvalidField> {
    for field in fields {
        // httparse has held names to the token grammar and values to
        // visible characters, spaces and tabs, as these check again.
        let name = HeaderName::from_bytes(&head[field.name.0..field.name.1]).map_err(|_| InvalidField)?;
        let value =
            HeaderValue::from_maybe_shared(head.slice(field.value.0..field.value.1)).map_err(|_| InvalidField)?;
        headers.append(name, value);
    }
    Ok(())
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

/// Writes `buffer` from `written` on; `Ready(Ok)` once all of it is out
/// and flushed, when the buffer is emptied for the next message.
pub fn poll_write_out<W: AsyncWrite + Unpin>(
    io: &mut W,
    cx: &mut Context<'_>,
    buffer: &mut Vec<u8>,
    written: &mut usize,
) -> Poll<io::Result<()>> {
    while *written < buffer.len() {
        let n = ready!(Pin::new(&mut *io).poll_write(cx, &buffer[*written..]))?;
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        *written += n;
    }
    buffer.clear();
    *written = 0;
    Pin::new(io).poll_flush(cx)
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
