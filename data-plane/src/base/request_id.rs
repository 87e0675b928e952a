//! The request ID, at the bottom of the request path: taken from the client's
//! header when well-formed or made here, then sent upstream, echoed to the
//! client, written in the access log, in every problem body and in the error
//! log lines of the request, so one value finds a request everywhere.
//!
//! A made ID is the process's random prefix, the thread's slot and the
//! thread's counter, in hex: unique within the process without a lock or an
//! atomic on the request path, and across processes by the prefix.

use std::cell::Cell;
use std::fmt;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

use http::HeaderValue;

/// The longest client-sent ID taken as is; a longer one is replaced. Room for
/// a UUID (36), a W3C trace ID (32) or a `traceparent` (55).
pub const MAX_LEN: usize = 64;

/// Hex digits of a made ID: 10 of process prefix (40 random bits), 4 of
/// thread slot, 12 of counter (2^48 requests per thread before it wraps).
const MADE_LEN: usize = 26;
/// Where a made ID's slot and counter digits begin.
const SLOT_AT: usize = 10;
const COUNTER_AT: usize = 14;

/// Random once per process: IDs of two processes differ in it.
static PREFIX: LazyLock<u64> = LazyLock::new(|| rand::random::<u64>() & 0xff_ffff_ffff);

/// Threads that made IDs so far; each takes the next slot on its first ID.
static SLOTS: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread's last made ID: the next one is it with its counter
    /// digits counted up, not all its digits written again.
    static LAST_MADE: Cell<Option<[u8; MADE_LEN]>> = const { Cell::new(None) };
}

/// A request's ID, held inline: the client's header value shares the
/// connection's read buffer, which the ID must not keep alive until the
/// response ends (see `proxy::log::Exchange::path`).
#[derive(Clone, Copy)]
pub struct RequestId {
    len: u8,
    bytes: [u8; MAX_LEN],
}

impl RequestId {
    /// The client's ID when it is one value of 1 to [`MAX_LEN`] characters of
    /// `A-Z a-z 0-9 - _ . : + / = @`: safe in a log line, a JSON string and a
    /// header, whatever reads them. `None` otherwise (the caller makes one).
    pub fn parse(value: &[u8]) -> Option<RequestId> {
        if value.is_empty() || value.len() > MAX_LEN || !value.iter().all(|b| allowed(*b)) {
            return None;
        }
        let mut bytes = [0; MAX_LEN];
        bytes[..value.len()].copy_from_slice(value);
        Some(RequestId { len: value.len() as u8, bytes })
    }

    /// A new ID: no syscall, no lock, no allocation.
    pub fn make() -> RequestId {
        let made = LAST_MADE.with(|last| {
            let made = match last.get() {
                Some(mut made) => {
                    count_up(&mut made[COUNTER_AT..]);
                    made
                }
                None => first_made(),
            };
            last.set(Some(made));
            made
        });
        let mut bytes = [0; MAX_LEN];
        bytes[..MADE_LEN].copy_from_slice(&made);
        RequestId { len: MADE_LEN as u8, bytes }
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII ever goes in (`parse` checks, `make` writes hex).
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    /// The ID as a header value of its own: one small allocation, which its
    /// clones share (a copied slice would be allocated again by the first clone).
    pub fn to_header(&self) -> HeaderValue {
        // ASCII without controls: always a valid header value.
        HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(*self)).unwrap_or(HeaderValue::from_static("-"))
    }
}

impl AsRef<[u8]> for RequestId {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

fn allowed(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'+' | b'/' | b'=' | b'@')
}

/// Writes the low `4 * out.len()` bits of `value` as lowercase hex.
fn hex(out: &mut [u8], mut value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for digit in out.iter_mut().rev() {
        *digit = DIGITS[(value & 0xf) as usize];
        value >>= 4;
    }
}

/// A thread's first ID: the process's prefix, the thread's slot (taken
/// now), and its counter at zero.
fn first_made() -> [u8; MADE_LEN] {
    let slot = SLOTS.fetch_add(1, Ordering::Relaxed) as u16;
    let mut made = [0; MADE_LEN];
    hex(&mut made[..SLOT_AT], *PREFIX);
    hex(&mut made[SLOT_AT..COUNTER_AT], u64::from(slot));
    hex(&mut made[COUNTER_AT..], 0);
    made
}

/// Adds one to the lowercase hex number in `digits`, wrapping to zero past the largest.
fn count_up(digits: &mut [u8]) {
    for digit in digits.iter_mut().rev() {
        match *digit {
            b'f' => *digit = b'0',
            b'9' => return *digit = b'a',
            _ => return *digit += 1,
        }
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestId({})", self.as_str())
    }
}

impl serde::Serialize for RequestId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn client_ids_are_taken_only_when_well_formed() {
        let uuid = "4f1c2b9e-8d1a-4c3e-9f00-1234567890ab";
        let (longest, too_long) = ("x".repeat(MAX_LEN), "x".repeat(MAX_LEN + 1));
        for (value, taken) in [
            (uuid, true),
            ("abc", true),
            ("a.b:c_d+e/f=g@h", true),
            (longest.as_str(), true),
            (too_long.as_str(), false),
            ("", false),
            ("a b", false),
            ("a\"b", false),
            ("a\\b", false),
            ("é", false),
            ("a,b", false),
            ("<script>", false),
        ] {
            let parsed = RequestId::parse(value.as_bytes());
            assert_eq!(parsed.is_some(), taken, "{value:?}");
            if let Some(id) = parsed {
                assert_eq!(id.as_str(), value);
                assert_eq!(id.to_header(), value);
            }
        }
    }

    #[test]
    fn made_ids_are_short_unique_and_valid() {
        let mut seen = HashSet::new();
        for _ in 0..10_000 {
            let id = RequestId::make();
            assert_eq!(id.as_str().len(), MADE_LEN);
            assert!(RequestId::parse(id.as_str().as_bytes()).is_some());
            assert!(seen.insert(id.as_str().to_owned()), "{id} twice");
        }
        // Another thread has its own slot: no collision with this one's counter.
        let other: Vec<String> =
            std::thread::spawn(|| (0..100).map(|_| RequestId::make().as_str().to_owned()).collect()).join().unwrap();
        assert!(other.iter().all(|id| !seen.contains(id)));
        let first = RequestId::make();
        assert_eq!(&first.as_str()[..10], &other[0][..10], "one prefix per process");
    }

    #[test]
    fn the_counter_counts_up_in_hex_and_wraps_to_zero() {
        for (before, after) in
            [("000", "001"), ("009", "00a"), ("00f", "010"), ("0ff", "100"), ("a9f", "aa0"), ("fff", "000")]
        {
            let mut digits = before.as_bytes().to_vec();
            count_up(&mut digits);
            assert_eq!(std::str::from_utf8(&digits).unwrap(), after, "{before}");
        }
        let (one, two) = (RequestId::make(), RequestId::make());
        let counter = |id: &RequestId| u64::from_str_radix(&id.as_str()[COUNTER_AT..], 16).unwrap();
        assert_eq!(counter(&two), counter(&one) + 1, "{one} then {two}");
    }
}
