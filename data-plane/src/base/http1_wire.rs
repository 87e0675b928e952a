//! How a message body goes on the HTTP/1.1 wire, for both legs that write
//! one: the request to a target (`upstream::http1`) and the response to a
//! client (`proxy::http1`).

use std::io::Write as _;

use bytes::Bytes;

use super::BoxError;

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
