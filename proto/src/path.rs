//! Request paths as both planes must read them: the canonical form a data
//! plane routes, checks and forwards (computed once per request, before
//! routing), the rule the control plane applies to the prefixes and paths it
//! accepts (they must already be canonical, or no request could match them),
//! and the one percent-decoder both planes use for queries and fragments.
//!
//! The canonical form follows Envoy's `normalize_path` with `merge_slashes`
//! (RFC 3986 §6.2.2): percent-encoded unreserved characters are decoded,
//! other escapes are written with upper-case hex, `.` and `..` segments are
//! resolved and repeated slashes merged. An encoded `/` or `\` (or a raw `\`)
//! is kept encoded and reported, for the data plane to refuse unless the API
//! forwards raw paths: decoding it would change the path's segments, and
//! keeping it lets an upstream that decodes see another path than the one
//! routed. Refused outright: a malformed escape, an encoded NUL, `..` above
//! the root, and a `.` or `..` segment carrying `;` parameters (`/..;/admin`,
//! which servlet containers resolve as `..`).

use std::borrow::Cow;

/// Why a request path has no canonical form (the data plane answers 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path must start with `/`")]
    NotAbsolute,
    #[error("the path holds a malformed percent-escape")]
    MalformedEscape,
    #[error("the path holds an encoded NUL (%00)")]
    EncodedNul,
    #[error("the path climbs above the root with `..`")]
    AboveRoot,
    #[error("the path holds a `.` or `..` segment with `;` parameters")]
    DotSegmentParameters,
    #[error("the path holds an encoded `/` or `\\` (%2F, %5C) or a `\\`")]
    EncodedSeparator,
}

/// A request path in canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalPath<'a> {
    /// Borrowed when the client's path already was canonical (the usual case: no allocation).
    pub path: Cow<'a, str>,
    /// The path holds an encoded `/` or `\` (kept as `%2F`, `%5C`), or a raw `\` (written `%5C`).
    pub encoded_separator: bool,
}

impl CanonicalPath<'_> {
    /// Whether the canonical form differs from what the client sent.
    pub fn changed(&self) -> bool {
        matches!(self.path, Cow::Owned(_))
    }
}

/// The canonical form of a request path (without its query).
pub fn canonical_path(raw: &str) -> Result<CanonicalPath<'_>, PathError> {
    if !raw.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if is_plain(raw.as_bytes()) {
        return Ok(CanonicalPath { path: Cow::Borrowed(raw), encoded_separator: false });
    }
    let mut encoded_separator = false;
    let mut out: Vec<u8> = Vec::with_capacity(raw.len());
    // Set when the path ends in `/`, or in a `.` or `..` segment (which leave a directory).
    let mut trailing_slash = false;
    for segment in raw[1..].split('/') {
        if segment.is_empty() {
            // Repeated slashes merge; an empty last segment is a trailing slash.
            trailing_slash = true;
            continue;
        }
        trailing_slash = false;
        let start = out.len();
        out.push(b'/');
        decode_segment(segment.as_bytes(), &mut out, &mut encoded_separator)?;
        let name = &out[start + 1..];
        match name {
            b"." => {
                out.truncate(start);
                trailing_slash = true;
            }
            b".." => {
                out.truncate(start);
                let parent = out.iter().rposition(|b| *b == b'/').ok_or(PathError::AboveRoot)?;
                out.truncate(parent);
                trailing_slash = true;
            }
            _ => {
                let bare = name.split(|b| *b == b';').next().unwrap_or(name);
                if bare == b"." || bare == b".." {
                    return Err(PathError::DotSegmentParameters);
                }
            }
        }
    }
    if out.is_empty() || trailing_slash {
        out.push(b'/');
    }
    // Only ASCII sequences were replaced by ASCII, so the bytes stay UTF-8.
    let path = String::from_utf8(out).map_err(|_| PathError::MalformedEscape)?;
    let path = if path == raw { Cow::Borrowed(raw) } else { Cow::Owned(path) };
    Ok(CanonicalPath { path, encoded_separator })
}

/// A path with no `%` or `\`, no empty segment and no `.`/`..` segment
/// (nor one starting `.;`/`..;`) is already canonical. One pass, no
/// allocation, one table lookup per byte: it runs on every request.
fn is_plain(path: &[u8]) -> bool {
    // The segment read since the last `/`: nothing yet, `.`, `..`, or anything else.
    #[derive(PartialEq)]
    enum Segment {
        Empty,
        Dot,
        Dots,
        Named,
    }
    let mut segment = Segment::Named;
    let mut rest = path;
    loop {
        // Most bytes are of a name: a tight loop over them, the match for the others.
        let named = rest.iter().take_while(|byte| PATH_BYTES[usize::from(**byte)] == OTHER).count();
        if named > 0 {
            segment = Segment::Named;
        }
        let Some((byte, after)) = rest[named..].split_first() else { break };
        rest = after;
        segment = match PATH_BYTES[usize::from(*byte)] {
            // An empty segment (`//`), or a `.` or `..` one, ends here.
            SLASH if segment != Segment::Named => return false,
            SLASH => Segment::Empty,
            DOT => match segment {
                Segment::Empty => Segment::Dot,
                Segment::Dot => Segment::Dots,
                _ => Segment::Named,
            },
            // `.;` and `..;` read as `.` and `..` to servlet containers.
            SEMICOLON if matches!(segment, Segment::Dot | Segment::Dots) => return false,
            SEMICOLON => Segment::Named,
            // `%` or `\` (ESCAPE): decoded or refused by the slow path.
            _ => return false,
        };
    }
    !matches!(segment, Segment::Dot | Segment::Dots)
}

/// What a byte is to [`is_plain`].
const OTHER: u8 = 0;
const SLASH: u8 = 1;
const DOT: u8 = 2;
const SEMICOLON: u8 = 3;
/// `%` and `\`: the path is not plain.
const ESCAPE: u8 = 4;

static PATH_BYTES: [u8; 256] = {
    let mut table = [OTHER; 256];
    table[b'/' as usize] = SLASH;
    table[b'.' as usize] = DOT;
    table[b';' as usize] = SEMICOLON;
    table[b'%' as usize] = ESCAPE;
    table[b'\\' as usize] = ESCAPE;
    table
};

/// Appends one segment, escapes decoded where they name unreserved characters.
fn decode_segment(segment: &[u8], out: &mut Vec<u8>, encoded_separator: &mut bool) -> Result<(), PathError> {
    let mut i = 0;
    while i < segment.len() {
        match segment[i] {
            b'%' => {
                let byte = match (segment.get(i + 1).and_then(hex_value), segment.get(i + 2).and_then(hex_value)) {
                    (Some(high), Some(low)) => (high << 4) | low,
                    _ => return Err(PathError::MalformedEscape),
                };
                match byte {
                    0 => return Err(PathError::EncodedNul),
                    b'/' | b'\\' => {
                        *encoded_separator = true;
                        push_escaped(out, byte);
                    }
                    _ if is_unreserved(byte) => out.push(byte),
                    _ => push_escaped(out, byte),
                }
                i += 3;
            }
            b'\\' => {
                *encoded_separator = true;
                push_escaped(out, b'\\');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    Ok(())
}

/// RFC 3986 §2.3: escaping these never changes a URI's meaning.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

fn push_escaped(out: &mut Vec<u8>, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.extend_from_slice(&[b'%', HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 0x0f)]]);
}

fn hex_value(byte: &u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Checks that a configured path (an API's prefix or one of its `paths`) is
/// canonical: a request path is routed in canonical form, so a prefix that is
/// not could never match. Template braces are plain characters here.
pub fn check_canonical(path: &str) -> Result<(), String> {
    match canonical_path(path) {
        Ok(canonical) if canonical.encoded_separator => {
            Err(format!("`{path}` holds an encoded `/` or `\\`, which no routed request path may hold"))
        }
        Ok(canonical) if canonical.changed() => {
            Err(format!("`{path}` is not in canonical form (requests are routed as `{}`)", canonical.path))
        }
        Ok(_) => Ok(()),
        Err(e) => Err(format!("`{path}`: {e}")),
    }
}

/// Percent-decoding of query strings and URI fragments (`+` as space when
/// `plus_as_space`, for `application/x-www-form-urlencoded`). Lenient: a
/// malformed escape stays as it is and bad UTF-8 becomes U+FFFD, so what
/// judges the value (a schema, a key lookup) sees it rather than the decoder
/// refusing it.
pub fn percent_decode(text: &str, plus_as_space: bool) -> Cow<'_, str> {
    if !(text.contains('%') || (plus_as_space && text.contains('+'))) {
        return Cow::Borrowed(text);
    }
    let (bytes, _) = decode_bytes(text.as_bytes(), plus_as_space);
    Cow::Owned(String::from_utf8_lossy(&bytes).into_owned())
}

/// Strict percent-decoding: `None` when an escape is malformed or the result
/// is not UTF-8 (for input the control plane refuses rather than guesses at).
pub fn percent_decode_exact(text: &str) -> Option<Cow<'_, str>> {
    if !text.contains('%') {
        return Some(Cow::Borrowed(text));
    }
    match decode_bytes(text.as_bytes(), false) {
        (bytes, false) => String::from_utf8(bytes).ok().map(Cow::Owned),
        (_, true) => None,
    }
}

/// The decoded bytes, and whether a malformed escape was met (and kept).
fn decode_bytes(text: &[u8], plus_as_space: bool) -> (Vec<u8>, bool) {
    let mut out = Vec::with_capacity(text.len());
    let mut malformed = false;
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'%' => match (text.get(i + 1).and_then(hex_value), text.get(i + 2).and_then(hex_value)) {
                (Some(high), Some(low)) => {
                    out.push((high << 4) | low);
                    i += 3;
                    continue;
                }
                _ => {
                    malformed = true;
                    out.push(b'%');
                }
            },
            b'+' if plus_as_space => out.push(b' '),
            byte => out.push(byte),
        }
        i += 1;
    }
    (out, malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_path_table() {
        // (raw, canonical or error, encoded separator)
        let cases: &[(&str, Result<&str, PathError>, bool)] = &[
            ("/", Ok("/"), false),
            ("/admin/users", Ok("/admin/users"), false),
            ("/admin/users/", Ok("/admin/users/"), false),
            ("/.well-known/x", Ok("/.well-known/x"), false),
            ("/a/..b/c.", Ok("/a/..b/c."), false),
            ("/public/../admin/users", Ok("/admin/users"), false),
            ("/x/%2e%2e/admin/users", Ok("/admin/users"), false),
            ("/x/%2E%2e/admin/users", Ok("/admin/users"), false),
            ("/x/.%2e/admin", Ok("/admin"), false),
            ("/%61dmin/users", Ok("/admin/users"), false),
            ("/./admin/users", Ok("/admin/users"), false),
            ("//admin///users", Ok("/admin/users"), false),
            ("/admin/.", Ok("/admin/"), false),
            ("/admin/..", Ok("/"), false),
            ("/a/b/../../c", Ok("/c"), false),
            ("/a/./b/./", Ok("/a/b/"), false),
            ("//", Ok("/"), false),
            ("/.", Ok("/"), false),
            ("/%7e%41%2D%5f", Ok("/~A-_"), false),
            ("/a%20b", Ok("/a%20b"), false),
            ("/a%c3%a9", Ok("/a%C3%A9"), false),
            ("/a;b=c/d", Ok("/a;b=c/d"), false),
            ("/admin%2fusers", Ok("/admin%2Fusers"), true),
            ("/admin%2Fusers", Ok("/admin%2Fusers"), true),
            ("/admin%5cusers", Ok("/admin%5Cusers"), true),
            ("/admin\\users", Ok("/admin%5Cusers"), true),
            ("/..", Err(PathError::AboveRoot), false),
            ("/a/../..", Err(PathError::AboveRoot), false),
            ("/%2e%2e/etc", Err(PathError::AboveRoot), false),
            ("/a%zz", Err(PathError::MalformedEscape), false),
            ("/a%4", Err(PathError::MalformedEscape), false),
            ("/a%", Err(PathError::MalformedEscape), false),
            ("/a%00b", Err(PathError::EncodedNul), false),
            ("/public/..;/admin", Err(PathError::DotSegmentParameters), false),
            ("/public/.;x=1/admin", Err(PathError::DotSegmentParameters), false),
            ("*", Err(PathError::NotAbsolute), false),
            ("", Err(PathError::NotAbsolute), false),
        ];
        for (raw, want, separator) in cases {
            let got = canonical_path(raw);
            match (got, want) {
                (Ok(got), Ok(want)) => {
                    assert_eq!(got.path, *want, "{raw}");
                    assert_eq!(got.encoded_separator, *separator, "{raw}: encoded separator");
                    assert_eq!(got.changed(), raw != want, "{raw}: changed");
                }
                (got, want) => assert_eq!(got.map(|c| c.path.into_owned()), want.map(str::to_owned), "{raw}"),
            }
        }
    }

    #[test]
    fn plain_paths_are_borrowed_and_canonical_is_a_fixed_point() {
        for raw in ["/", "/a", "/a/b/", "/.well-known/acme", "/a.b/..c/...", "/items;v=1"] {
            assert!(is_plain(raw.as_bytes()), "{raw}");
            assert!(!canonical_path(raw).unwrap().changed(), "{raw}");
        }
        for raw in ["/a//b", "/a/./b", "/a/..", "/a/.", "/%41", "/a\\b", "/..;/x", "//"] {
            assert!(!is_plain(raw.as_bytes()), "{raw}");
            let once = canonical_path(raw).map(|c| c.path.into_owned());
            if let Ok(once) = once {
                assert_eq!(canonical_path(&once).unwrap().path, once.as_str(), "{raw}: canonical twice");
            }
        }
    }

    /// The scan `is_plain` replaced (a byte compare per byte, then the dots after each `/`).
    fn is_plain_reference(path: &[u8]) -> bool {
        let mut i = 0;
        while i < path.len() {
            match path[i] {
                b'%' | b'\\' => return false,
                b'/' => {
                    let rest = &path[i + 1..];
                    let dots = rest.iter().take_while(|b| **b == b'.').count();
                    let after = rest.get(dots);
                    if rest.first() == Some(&b'/') {
                        return false;
                    }
                    if (dots == 1 || dots == 2) && matches!(after, None | Some(b'/' | b';')) {
                        return false;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        true
    }

    #[test]
    fn is_plain_agrees_with_the_reference_on_every_short_path() {
        // Every path of up to 6 bytes after its `/` over the bytes that matter, and one other.
        let alphabet = [b'/', b'.', b';', b'%', b'\\', b'a'];
        let mut paths = vec![vec![b'/']];
        let mut checked = 0;
        while let Some(path) = paths.pop() {
            assert_eq!(is_plain(&path), is_plain_reference(&path), "{}", String::from_utf8_lossy(&path));
            checked += 1;
            if path.len() <= 6 {
                paths.extend(alphabet.iter().map(|b| [path.as_slice(), &[*b]].concat()));
            }
        }
        assert_eq!(checked, (0..=6).map(|n| 6usize.pow(n)).sum::<usize>());
    }

    #[test]
    fn configured_paths_must_be_canonical() {
        assert!(check_canonical("/shop/v2").is_ok());
        assert!(check_canonical("/shop/{id}").is_ok());
        assert!(check_canonical("/").is_ok());
        for bad in ["/shop//v2", "/shop/../admin", "/%61dmin", "/a%2Fb", "/a%zz"] {
            assert!(check_canonical(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn percent_decode_table() {
        let cases = [
            ("abc", false, "abc"),
            ("a%20b", false, "a b"),
            ("a+b", true, "a b"),
            ("a+b", false, "a+b"),
            ("2024-05-16T16:17:00%2b02:00", true, "2024-05-16T16:17:00+02:00"),
            ("100%", false, "100%"),
            ("%zz", false, "%zz"),
            ("%4", true, "%4"),
            ("%C3%A4", false, "ä"),
            ("%FF", false, "\u{FFFD}"),
        ];
        for (input, plus, expected) in cases {
            assert_eq!(percent_decode(input, plus), expected, "{input}");
        }
        assert_eq!(percent_decode_exact("~1items~1%7Bid%7D").as_deref(), Some("~1items~1{id}"));
        assert_eq!(percent_decode_exact("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode_exact("%zz"), None);
        assert_eq!(percent_decode_exact("%FF"), None);
        assert_eq!(percent_decode_exact("a+b").as_deref(), Some("a+b"));
    }
}
