//! Bucket keys: which bucket of an API's rate limit a request spends from,
//! derived per request from the consumer, the client address, the API or a
//! header, as the policy's `key` says.

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderName;
use sha2::{Digest, Sha256};
use sluice_proto::{Cidr, v1};

use super::RateKeyInput;
use super::client_ip::effective_client_ip;

/// Header values longer than this are keyed by their digest, so a client
/// sending huge values cannot make each bucket entry huge.
const MAX_INLINE_HEADER_VALUE: usize = 64;

/// How a policy picks the bucket; compiled from the spec's `key` and `header`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Consumer,
    Ip,
    Api,
    Header(HeaderName),
}

/// One bucket of one limit. Variants never compare equal to each other, so a
/// consumer named `10.0.0.1` and the client address 10.0.0.1 do not share.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum BucketKey {
    Api,
    Ip(IpAddr),
    Consumer(Arc<str>),
    Header(Box<[u8]>),
    HeaderDigest([u8; 32]),
    /// Requests without the keying header share one bucket of their own: they
    /// are limited together rather than let through unlimited, and they do not
    /// eat into the quota of any real header value.
    MissingHeader,
}

impl KeyKind {
    pub(crate) fn from_spec(spec: &v1::RateLimit) -> Result<Self, String> {
        let key = v1::RateLimitKey::try_from(spec.key).map_err(|_| format!("unknown rate_limit key {}", spec.key))?;
        Ok(match key {
            v1::RateLimitKey::Consumer => KeyKind::Consumer,
            v1::RateLimitKey::Ip => KeyKind::Ip,
            v1::RateLimitKey::Api => KeyKind::Api,
            v1::RateLimitKey::Header => KeyKind::Header(sluice_proto::policy::rate_limit_header(spec)?),
        })
    }

    /// The bucket of this request. The consumer key falls back to the client
    /// address for anonymous requests (no auth policy ran, or it let the
    /// request through without a consumer), so anonymous traffic is still
    /// limited per client instead of sharing one bucket that a single noisy
    /// client could drain for everyone.
    pub(crate) fn derive(&self, input: &RateKeyInput<'_>, trusted: &[Cidr]) -> BucketKey {
        match self {
            KeyKind::Api => BucketKey::Api,
            KeyKind::Ip => BucketKey::Ip(effective_client_ip(input.client_ip, input.headers, trusted)),
            KeyKind::Consumer => match input.consumer {
                Some(name) if !name.is_empty() => BucketKey::Consumer(name.clone()),
                _ => BucketKey::Ip(effective_client_ip(input.client_ip, input.headers, trusted)),
            },
            // The first value only: a repeated header is either a client
            // mistake or an attempt to dodge the limit, and either way the
            // first value is what most upstreams read.
            KeyKind::Header(name) => match input.headers.get(name) {
                None => BucketKey::MissingHeader,
                Some(value) if value.len() > MAX_INLINE_HEADER_VALUE => {
                    BucketKey::HeaderDigest(Sha256::digest(value.as_bytes()).into())
                }
                Some(value) => BucketKey::Header(value.as_bytes().into()),
            },
        }
    }
}

impl BucketKey {
    /// The key's part of a Redis key: printable and bounded, whatever the
    /// client sent (header values are hashed).
    pub(crate) fn redis_suffix(&self) -> String {
        match self {
            BucketKey::Api => "api".into(),
            BucketKey::Ip(ip) => format!("ip:{ip}"),
            BucketKey::Consumer(name) => format!("consumer:{name}"),
            BucketKey::Header(value) => format!("header:{}", short_digest(&Sha256::digest(value))),
            BucketKey::HeaderDigest(digest) => format!("header:{}", short_digest(digest)),
            BucketKey::MissingHeader => "header-missing".into(),
        }
    }
}

/// 128 bits of a SHA-256 as hex: plenty to keep header values apart.
fn short_digest(digest: &[u8]) -> String {
    hex::encode(&digest[..16.min(digest.len())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    fn spec(key: v1::RateLimitKey, header: &str) -> v1::RateLimit {
        v1::RateLimit { requests: 5, period_seconds: 60, key: key as i32, header: header.into(), ..Default::default() }
    }

    #[test]
    fn key_kinds_compile_from_the_spec() {
        assert_eq!(KeyKind::from_spec(&spec(v1::RateLimitKey::Consumer, "")).unwrap(), KeyKind::Consumer);
        assert_eq!(KeyKind::from_spec(&spec(v1::RateLimitKey::Ip, "")).unwrap(), KeyKind::Ip);
        assert_eq!(KeyKind::from_spec(&spec(v1::RateLimitKey::Api, "")).unwrap(), KeyKind::Api);
        assert_eq!(
            KeyKind::from_spec(&spec(v1::RateLimitKey::Header, "X-Tenant")).unwrap(),
            KeyKind::Header(HeaderName::from_static("x-tenant"))
        );
        assert!(KeyKind::from_spec(&spec(v1::RateLimitKey::Header, "")).is_err());
        assert!(KeyKind::from_spec(&spec(v1::RateLimitKey::Header, "bad header")).is_err());
        let mut unknown = spec(v1::RateLimitKey::Ip, "");
        unknown.key = 42;
        assert!(KeyKind::from_spec(&unknown).is_err());
    }

    #[test]
    fn derivation_table() {
        let peer: IpAddr = "10.0.0.2".parse().unwrap();
        let client: IpAddr = "198.51.100.7".parse().unwrap();
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", HeaderValue::from_static("198.51.100.7"));
        headers.insert("x-tenant", HeaderValue::from_static("acme"));
        headers.append("x-tenant", HeaderValue::from_static("other"));
        headers.insert("x-long", HeaderValue::from_str(&"a".repeat(200)).unwrap());
        let header = |name: &'static str| KeyKind::Header(HeaderName::from_static(name));
        let (alice, nameless): (Arc<str>, Arc<str>) = ("alice".into(), "".into());

        let cases = [
            (KeyKind::Api, Some(&alice), BucketKey::Api),
            (KeyKind::Ip, Some(&alice), BucketKey::Ip(client)),
            (KeyKind::Consumer, Some(&alice), BucketKey::Consumer("alice".into())),
            (KeyKind::Consumer, None, BucketKey::Ip(client)),
            (KeyKind::Consumer, Some(&nameless), BucketKey::Ip(client)),
            (header("x-tenant"), None, BucketKey::Header(b"acme".as_slice().into())),
            (header("x-missing"), None, BucketKey::MissingHeader),
            (header("x-long"), None, BucketKey::HeaderDigest(Sha256::digest("a".repeat(200)).into())),
        ];
        for (kind, consumer, expected) in cases {
            let input = RateKeyInput { consumer, client_ip: peer, headers: &headers };
            assert_eq!(kind.derive(&input, &trusted), expected, "{kind:?} {consumer:?}");
        }
        // Without trusted proxies the peer keys the bucket.
        let input = RateKeyInput { consumer: None, client_ip: peer, headers: &headers };
        assert_eq!(KeyKind::Ip.derive(&input, &[]), BucketKey::Ip(peer));
    }

    #[test]
    fn redis_suffixes_are_bounded_and_distinct() {
        let keys = [
            BucketKey::Api,
            BucketKey::Ip("10.0.0.1".parse().unwrap()),
            BucketKey::Consumer("10.0.0.1".into()),
            BucketKey::Header(b"acme".as_slice().into()),
            BucketKey::Header(b"other".as_slice().into()),
            BucketKey::MissingHeader,
        ];
        let suffixes: std::collections::HashSet<String> = keys.iter().map(BucketKey::redis_suffix).collect();
        assert_eq!(suffixes.len(), keys.len());
        let long = BucketKey::Header(vec![b'x'; 60].into());
        assert!(long.redis_suffix().len() <= 40);
        // The inline and digest forms of a value agree in Redis.
        let value = b"acme";
        assert_eq!(
            BucketKey::Header(value.as_slice().into()).redis_suffix(),
            BucketKey::HeaderDigest(Sha256::digest(value).into()).redis_suffix()
        );
    }
}
