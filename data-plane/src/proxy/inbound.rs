//! The inbound stage, between parsing and route match: the request as the
//! rest of the path will see it. The path is put in canonical form and the
//! host checked and normalised (both by the rules of `sluice_proto`), so that
//! routing, every policy, validation, the access log and the upstream agree
//! on which resource is asked for; a request with no canonical form gets 400
//! here and goes no further.

use http::uri::PathAndQuery;
use http::{Request, Uri, Version, header};
use sluice_proto::host::{CanonicalHost, HostError, canonical_host};
use sluice_proto::path::canonical_path;

use super::log::Exchange;
use crate::base::ProxyError;

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
    exchange.path = path.as_str().into();
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
pub(super) fn request_host<B>(request: &Request<B>) -> Result<Option<CanonicalHost<'_>>, ProxyError> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let header = hosts.next();
    if hosts.next().is_some() {
        return Err(HostError::Repeated.into());
    }
    let header = match header {
        Some(value) => Some(canonical_host(value.to_str().map_err(|_| HostError::BadName)?)?),
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
            let got = match request_host(&request) {
                Ok(host) => Ok(host.map(|h| h.name.into_owned())),
                Err(ProxyError::InvalidHost(e)) => Err(e),
                Err(other) => panic!("{uri} {hosts:?}: {other}"),
            };
            assert_eq!(got, want.map(|h| h.map(str::to_owned)), "{version:?} {uri} {hosts:?}");
        }
    }
}
