//! Request hosts as a data plane routes them (and as the control plane
//! stores an API's hosts): lower case, one trailing dot removed (an absolute
//! DNS name is the same host), the port checked and set aside. A host that
//! is not a valid name or address has no canonical form; the data plane
//! answers 400 rather than let it fall through to an API for any host.

use std::borrow::Cow;

/// Why a `Host` (or `:authority`) value has no canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the host is empty")]
    Empty,
    #[error("the port is not a number from 0 to 65535")]
    BadPort,
    #[error("the host is not a valid name or address")]
    BadName,
    #[error("an HTTP/1.1 request must name its host in a Host header")]
    Missing,
    #[error("the request has more than one Host header")]
    Repeated,
    #[error("the Host header and the request target name different hosts")]
    Disagrees,
}

/// A host in canonical form, its port (if one was given) set aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalHost<'a> {
    /// Lower case, no trailing dot; an IPv6 address keeps its brackets.
    /// Borrowed unless the client wrote upper case.
    pub name: Cow<'a, str>,
    pub port: Option<u16>,
}

/// Longest DNS name (RFC 1035), and so the longest host we route.
const MAX_NAME_LEN: usize = 253;

impl CanonicalHost<'_> {
    /// The same host: same name, and the same port where both name one
    /// (`Host: a.example` agrees with `http://a.example:80/`).
    pub fn agrees_with(&self, other: &CanonicalHost<'_>) -> bool {
        self.name == other.name && (self.port.is_none() || other.port.is_none() || self.port == other.port)
    }
}

/// The canonical form of a `Host` header or URI authority (`name[:port]`).
pub fn canonical_host(raw: &str) -> Result<CanonicalHost<'_>, HostError> {
    if raw.starts_with('[') {
        let (name, port) = split_bracketed_port(raw)?;
        return ipv6_literal(name).map(|name| CanonicalHost { name: Cow::Borrowed(name), port });
    }
    name_and_port(raw.as_bytes())
}

/// The canonical form of a `Host` field value as it came off the wire: as
/// [`canonical_host`], and `BadName` for a value that is not visible ASCII.
pub fn canonical_host_field(raw: &[u8]) -> Result<CanonicalHost<'_>, HostError> {
    // Every request's host comes here: a name (or IPv4 address) and port
    // are checked in one pass over the bytes, without first checking them
    // as text. Anything else, a refusal included, takes the general rule,
    // which says why.
    if raw.first() != Some(&b'[')
        && let Ok(host) = name_and_port(raw)
    {
        return Ok(host);
    }
    let visible = raw.iter().all(|b| *b == b'\t' || (b' '..=b'~').contains(b));
    let text = visible.then(|| std::str::from_utf8(raw).ok()).flatten().ok_or(HostError::BadName)?;
    canonical_host(text)
}

/// `name[:port]` where the name is not an IPv6 literal.
fn name_and_port(raw: &[u8]) -> Result<CanonicalHost<'_>, HostError> {
    if raw.is_empty() {
        return Err(HostError::Empty);
    }
    // A byte loop: `rfind` searches for a `char`, at several times the cost on a host this short.
    let (name, port) = match raw.iter().rposition(|b| *b == b':') {
        Some(colon) => (&raw[..colon], Some(port(&raw[colon + 1..])?)),
        None => (raw, None),
    };
    let name = name.strip_suffix(b".").unwrap_or(name);
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(HostError::BadName);
    }
    // Labels of letters, digits, `-` and `_` (found in internal names), none
    // empty: one table lookup per byte.
    let (mut label, mut upper) = (0usize, false);
    for b in name {
        match HOST_BYTES[usize::from(*b)] {
            LABEL => label += 1,
            UPPER => {
                label += 1;
                upper = true;
            }
            DOT if label > 0 => label = 0,
            _ => return Err(HostError::BadName),
        }
    }
    if label == 0 {
        return Err(HostError::BadName);
    }
    // ASCII by the loop above: this cannot fail.
    let name = std::str::from_utf8(name).map_err(|_| HostError::BadName)?;
    let name = if upper { Cow::Owned(name.to_ascii_lowercase()) } else { Cow::Borrowed(name) };
    Ok(CanonicalHost { name, port })
}

/// A port: one to five digits, at most 65535.
fn port(digits: &[u8]) -> Result<u16, HostError> {
    if digits.is_empty() || digits.len() > 5 {
        return Err(HostError::BadPort);
    }
    let mut port = 0u32;
    for b in digits {
        if !b.is_ascii_digit() {
            return Err(HostError::BadPort);
        }
        port = port * 10 + u32::from(b - b'0');
    }
    u16::try_from(port).map_err(|_| HostError::BadPort)
}

/// What a byte may be in a host name.
const OTHER: u8 = 0;
const LABEL: u8 = 1;
const UPPER: u8 = 2;
const DOT: u8 = 3;

static HOST_BYTES: [u8; 256] = {
    let mut table = [OTHER; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = match byte {
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => LABEL,
            b'A'..=b'Z' => UPPER,
            b'.' => DOT,
            _ => OTHER,
        };
        b += 1;
    }
    table
};

/// `[v6]:port` -> (`[v6]`, port); the literal's colons are its own.
fn split_bracketed_port(raw: &str) -> Result<(&str, Option<u16>), HostError> {
    let end = raw.find(']').ok_or(HostError::BadName)?;
    match &raw[end + 1..] {
        "" => Ok((raw, None)),
        rest => match rest.strip_prefix(':') {
            Some(digits) => Ok((&raw[..=end], Some(port(digits.as_bytes())?))),
            None => Err(HostError::BadName),
        },
    }
}

fn ipv6_literal(name: &str) -> Result<&str, HostError> {
    let inner = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')).ok_or(HostError::BadName)?;
    inner.parse::<std::net::Ipv6Addr>().map_err(|_| HostError::BadName)?;
    // Hex digits may be written in upper case; compare as written would let
    // `[::A]` and `[::a]` differ, so refuse rather than allocate for a rarity.
    if inner.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(HostError::BadName);
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Case<'a> = (&'a str, Result<(&'a str, Option<u16>), HostError>);

    #[test]
    fn canonical_host_table() {
        let cases: &[Case<'_>] = &[
            ("secure.example.com", Ok(("secure.example.com", None))),
            ("Secure.Example.COM", Ok(("secure.example.com", None))),
            ("secure.example.com.", Ok(("secure.example.com", None))),
            ("secure.example.com.:8443", Ok(("secure.example.com", Some(8443)))),
            ("secure.example.com:80", Ok(("secure.example.com", Some(80)))),
            ("secure.example.com:65535", Ok(("secure.example.com", Some(65535)))),
            ("internal_host", Ok(("internal_host", None))),
            ("127.0.0.1:8080", Ok(("127.0.0.1", Some(8080)))),
            ("[::1]", Ok(("[::1]", None))),
            ("[::1]:8080", Ok(("[::1]", Some(8080)))),
            ("", Err(HostError::Empty)),
            ("secure.example.com:abc", Err(HostError::BadPort)),
            ("secure.example.com:", Err(HostError::BadPort)),
            ("secure.example.com:65536", Err(HostError::BadPort)),
            ("secure.example.com:080808", Err(HostError::BadPort)),
            ("secure.example.com:-1", Err(HostError::BadPort)),
            ("secure.example.com..", Err(HostError::BadName)),
            (".secure.example.com", Err(HostError::BadName)),
            ("secure..example.com", Err(HostError::BadName)),
            (".", Err(HostError::BadName)),
            ("a b", Err(HostError::BadName)),
            ("user@secure.example.com", Err(HostError::BadName)),
            ("a:1:2", Err(HostError::BadName)),
            ("[::1", Err(HostError::BadName)),
            ("[::1]x", Err(HostError::BadName)),
            ("[not-v6]", Err(HostError::BadName)),
            ("[::1]:x", Err(HostError::BadPort)),
        ];
        for (raw, want) in cases {
            let want = want.map(|(name, port)| (name.to_owned(), port));
            let got = canonical_host(raw).map(|h| (h.name.into_owned(), h.port));
            assert_eq!(got, want, "{raw:?}");
            // The same from the wire.
            let got = canonical_host_field(raw.as_bytes()).map(|h| (h.name.into_owned(), h.port));
            assert_eq!(got, want, "field {raw:?}");
        }
        assert!(matches!(canonical_host("example.com.").unwrap().name, Cow::Borrowed(_)));
        assert!(matches!(canonical_host_field(b"example.com:80").unwrap().name, Cow::Borrowed(_)));
    }

    #[test]
    fn a_host_field_that_is_not_visible_ascii_has_no_canonical_form() {
        for raw in [&b"a\x01b"[..], b"a\x01b:abc", b"caf\xc3\xa9.example", b"\xff", b"a.example\x7f", b"[::1]\x00"] {
            assert_eq!(canonical_host_field(raw), Err(HostError::BadName), "{raw:?}");
        }
    }

    #[test]
    fn hosts_agree_by_name_and_any_port_both_give() {
        let host = |raw| canonical_host(raw).unwrap();
        assert!(host("a.example").agrees_with(&host("A.example.:80")));
        assert!(host("a.example:80").agrees_with(&host("a.example:80")));
        assert!(!host("a.example:80").agrees_with(&host("a.example:8080")));
        assert!(!host("a.example").agrees_with(&host("b.example")));
    }
}
