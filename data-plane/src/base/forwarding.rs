//! What the gateway tells a target about a request it forwards: who asked
//! (`X-Forwarded-For`), over which scheme (`X-Forwarded-Proto`), for which
//! host (`X-Forwarded-Host`), and through whom (`Via`). One rule, written
//! two ways: into the request's header map (`Forwarding::write_into`), or
//! by the HTTP/1.1 encoder straight into the head it writes
//! (`Forwarding::write_lines`), which spares a proxied request four map
//! insertions. The client's own `X-Forwarded-Proto` and `X-Forwarded-Host`
//! never reach the target either way; its `X-Forwarded-For` and `Via` are
//! appended to.

use http::Version;
use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};

use super::http1_wire::{is_named, write_line};

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static(X_FORWARDED_FOR_SPELLED);
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static(X_FORWARDED_PROTO_SPELLED);
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static(X_FORWARDED_HOST_SPELLED);
const X_FORWARDED_FOR_SPELLED: &str = "x-forwarded-for";
const X_FORWARDED_PROTO_SPELLED: &str = "x-forwarded-proto";
const X_FORWARDED_HOST_SPELLED: &str = "x-forwarded-host";

/// The gateway's entry in `Via` for a message received over `version`.
pub fn own_via(version: Version) -> &'static str {
    match version {
        Version::HTTP_10 => "1.0 sluice",
        Version::HTTP_2 => "2 sluice",
        Version::HTTP_3 => "3 sluice",
        _ => "1.1 sluice",
    }
}

/// The forwarding fields of one request.
#[derive(Clone, Copy, Debug)]
pub struct Forwarding<'a> {
    /// The client's address, as `X-Forwarded-For` names it.
    pub client: &'a HeaderValue,
    /// The scheme the client used, for `X-Forwarded-Proto`.
    pub scheme: &'static str,
    /// The gateway's own `Via` entry (see `own_via`).
    pub via: &'static str,
    /// Whether the target gets the host the client asked for in `Host`, not its own.
    pub preserve_host: bool,
}

/// A field of the client's request that a forwarding field replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replaced {
    /// The host the client asked for: `X-Forwarded-Host` takes its value.
    Host,
    /// Earlier proxies' entries, which the gateway's own is appended to.
    ForwardedFor,
    Via,
    /// The client's claim, which the gateway's own value replaces.
    ForwardedProto,
    ForwardedHost,
}

impl Replaced {
    /// Which forwarding field `name` is, if any. Cheap for the usual fields:
    /// a standard name is told apart by its tag, a custom one by its length first.
    #[inline]
    pub fn of(name: &HeaderName) -> Option<Replaced> {
        if name == header::HOST {
            return Some(Replaced::Host);
        }
        if name == header::VIA {
            return Some(Replaced::Via);
        }
        let spelled = name.as_str();
        let (replaced, its_name) = match spelled.len() {
            15 => (Replaced::ForwardedFor, &X_FORWARDED_FOR),
            16 => (Replaced::ForwardedHost, &X_FORWARDED_HOST),
            17 => (Replaced::ForwardedProto, &X_FORWARDED_PROTO),
            _ => return None,
        };
        (spelled == its_name.as_str()).then_some(replaced)
    }

    /// Which forwarding field a field spelled `name` on the wire (in any
    /// case) is, if any. Compared with the names as text: a constant
    /// `HeaderName` of a custom name is built and dropped at each use.
    pub fn of_spelled(name: &[u8]) -> Option<Replaced> {
        let (replaced, its_name) = match name.len() {
            3 => (Replaced::Via, "via"),
            4 => (Replaced::Host, "host"),
            15 => (Replaced::ForwardedFor, X_FORWARDED_FOR_SPELLED),
            16 => (Replaced::ForwardedHost, X_FORWARDED_HOST_SPELLED),
            17 => (Replaced::ForwardedProto, X_FORWARDED_PROTO_SPELLED),
            _ => return None,
        };
        is_named(name, its_name).then_some(replaced)
    }
}

/// What a request's fields held of those the forwarding fields build on,
/// noted while they are written out.
#[derive(Clone, Copy, Debug, Default)]
pub struct Prior<'h> {
    /// The first `Host` (the request's head has been held to one).
    pub host: Option<&'h [u8]>,
    pub forwarded_for: bool,
    pub via: bool,
}

impl<'h> Prior<'h> {
    /// Notes `value` of a field that `replaced` names.
    #[inline]
    pub fn note(&mut self, replaced: Replaced, value: &'h [u8]) {
        match replaced {
            Replaced::Host => {
                self.host.get_or_insert(value);
            }
            Replaced::ForwardedFor => self.forwarded_for = true,
            Replaced::Via => self.via = true,
            Replaced::ForwardedProto | Replaced::ForwardedHost => {}
        }
    }
}

/// Appends to `out` the earlier entries of a list field worth keeping
/// (text, not blank), each line's as it came, then the gateway's `own`:
/// no hop an earlier proxy recorded is lost, however many lines it took.
fn join<'v>(out: &mut Vec<u8>, earlier: impl Iterator<Item = &'v HeaderValue>, own: &[u8]) {
    for entry in earlier.filter_map(|value| value.to_str().ok()).filter(|text| !text.trim().is_empty()) {
        out.extend_from_slice(entry.as_bytes());
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(own);
}

impl Forwarding<'_> {
    /// The `Host` a target gets: its own, or the client's for an API that
    /// preserves it, when the client named one.
    pub fn host<'h>(&self, client_host: Option<&'h [u8]>, target_host: &'h HeaderValue) -> &'h [u8] {
        client_host.filter(|_| self.preserve_host).unwrap_or(target_host.as_bytes())
    }

    /// Sets the forwarding fields in `headers`; `host`: the host the client asked for.
    pub fn write_into(&self, headers: &mut HeaderMap, host: Option<&HeaderValue>) {
        // One `entry` per header: a single hash of the name, present or not.
        append(headers.entry(X_FORWARDED_FOR), self.client.clone());
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(self.scheme));
        match host {
            Some(value) => headers.insert(X_FORWARDED_HOST, value.clone()),
            None => headers.remove(X_FORWARDED_HOST),
        };
        append_via(headers, self.via);
    }

    /// Writes the forwarding fields as header lines, after the fields of
    /// `headers` less those `Replaced::of` names, noted in `prior`.
    pub fn write_lines(&self, out: &mut Vec<u8>, headers: &HeaderMap, prior: &Prior<'_>) {
        // The client's lines are looked up only when it sent some (seldom).
        write_joined(out, headers, &X_FORWARDED_FOR, prior.forwarded_for, self.client.as_bytes());
        write_line(out, X_FORWARDED_PROTO.as_str().as_bytes(), self.scheme.as_bytes());
        if let Some(host) = prior.host {
            write_line(out, X_FORWARDED_HOST.as_str().as_bytes(), host);
        }
        write_joined(out, headers, &header::VIA, prior.via, self.via.as_bytes());
    }
}

/// Appends the gateway's own `Via` entry (see `own_via`) to a message's.
pub fn append_via(headers: &mut HeaderMap, own: &'static str) {
    append(headers.entry(header::VIA), HeaderValue::from_static(own));
}

fn append(entry: Entry<'_, HeaderValue>, own: HeaderValue) {
    match entry {
        Entry::Occupied(mut occupied) => {
            let mut joined = Vec::new();
            join(&mut joined, occupied.iter(), own.as_bytes());
            // Valid values' bytes and a valid value, joined by ", ": valid too.
            if let Ok(value) = HeaderValue::from_maybe_shared(bytes::Bytes::from(joined)) {
                occupied.insert(value);
            }
        }
        Entry::Vacant(vacant) => {
            vacant.insert(own);
        }
    }
}

/// Writes `name: own`, after the `earlier` entries when `present`.
#[inline]
fn write_joined(out: &mut Vec<u8>, headers: &HeaderMap, name: &HeaderName, present: bool, own: &[u8]) {
    if !present {
        return write_line(out, name.as_str().as_bytes(), own);
    }
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    join(out, headers.get_all(name).iter(), own);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields `write_lines` writes after `fields` less the replaced ones, as (name, value) text.
    fn as_lines(forwarding: &Forwarding<'_>, fields: &HeaderMap) -> Vec<(String, String)> {
        let mut prior = Prior::default();
        let mut lines = Vec::new();
        for (name, value) in fields {
            match Replaced::of(name) {
                Some(replaced) => prior.note(replaced, value.as_bytes()),
                None => lines.push((name.to_string(), value.to_str().unwrap().to_string())),
            }
        }
        let mut out = Vec::new();
        forwarding.write_lines(&mut out, fields, &prior);
        for line in String::from_utf8(out).unwrap().split_terminator("\r\n") {
            let (name, value) = line.split_once(": ").unwrap();
            lines.push((name.to_string(), value.to_string()));
        }
        lines.sort();
        lines
    }

    /// What `write_into` leaves in the map, less `Host` (which the map keeps
    /// and the encoder writes for the target), as sorted (name, value) text.
    fn in_map(forwarding: &Forwarding<'_>, mut fields: HeaderMap) -> Vec<(String, String)> {
        let host = fields.get(header::HOST).cloned();
        forwarding.write_into(&mut fields, host.as_ref());
        fields.remove(header::HOST);
        let mut lines: Vec<_> =
            fields.iter().map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_string())).collect();
        lines.sort();
        lines
    }

    fn map(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn both_ways_of_writing_give_the_same_fields() {
        let client = HeaderValue::from_static("10.0.0.9");
        let forwarding = Forwarding { client: &client, scheme: "https", via: "1.1 sluice", preserve_host: false };
        let cases: [&[(&str, &str)]; 6] = [
            &[("host", "shop.example"), ("accept", "*/*")],
            // Earlier proxies' entries are appended to; the client's scheme and host claims are not kept.
            &[
                ("host", "shop.example"),
                ("x-forwarded-for", "1.2.3.4"),
                ("via", "1.1 edge"),
                ("x-forwarded-proto", "gopher"),
                ("x-forwarded-host", "evil.example"),
            ],
            // Every line is appended to, less blank ones.
            &[("x-forwarded-for", "1.2.3.4"), ("x-forwarded-for", "5.6.7.8"), ("via", "1.0 a"), ("via", "1.1 b")],
            &[("x-forwarded-for", " "), ("via", ""), ("x-forwarded-for", "1.2.3.4")],
            // No host asked for: no X-Forwarded-Host, even one the client sent.
            &[("x-forwarded-host", "evil.example"), ("x-forwarded-hostile", "kept")],
            &[],
        ];
        for fields in cases {
            let fields = map(fields);
            assert_eq!(as_lines(&forwarding, &fields), in_map(&forwarding, fields.clone()), "{fields:?}");
        }
    }

    #[test]
    fn forwarding_fields_append_and_replace() {
        let client = HeaderValue::from_static("10.0.0.9");
        let forwarding =
            Forwarding { client: &client, scheme: "http", via: own_via(Version::HTTP_11), preserve_host: false };
        let fields = map(&[
            ("host", "shop.example"),
            ("x-forwarded-for", "1.2.3.4"),
            ("via", "1.1 edge"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-for", "5.6.7.8"),
        ]);
        let lines = in_map(&forwarding, fields);
        let expected = [
            ("via", "1.1 edge, 1.1 sluice"),
            ("x-forwarded-for", "1.2.3.4, 5.6.7.8, 10.0.0.9"),
            ("x-forwarded-host", "shop.example"),
            ("x-forwarded-proto", "http"),
        ];
        assert_eq!(lines, expected.map(|(n, v)| (n.to_string(), v.to_string())));
    }

    #[test]
    fn replaced_names_are_told_apart_from_their_lookalikes() {
        for (name, want) in [
            ("host", Some(Replaced::Host)),
            ("via", Some(Replaced::Via)),
            ("x-forwarded-for", Some(Replaced::ForwardedFor)),
            ("x-forwarded-proto", Some(Replaced::ForwardedProto)),
            ("x-forwarded-host", Some(Replaced::ForwardedHost)),
            ("x-forwarded-port", None),
            ("x-forwarded", None),
            ("forwarded", None),
            ("content-length", None),
        ] {
            assert_eq!(Replaced::of(&HeaderName::from_static(name)), want, "{name}");
            assert_eq!(Replaced::of_spelled(name.to_ascii_uppercase().as_bytes()), want, "{name}");
        }
    }
}
