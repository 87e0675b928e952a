//! Per-API policies as written in config: `- basic_auth: {}`,
//! `- rate_limit: { requests: 100, per: 1m, key: consumer }`. The list order is
//! the order in which they run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::HumanDuration;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    BasicAuth(BasicAuthPolicy),
    ApiKey(ApiKeyPolicy),
    Jwt(JwtPolicy),
    RateLimit(RateLimitPolicy),
    Cors(CorsPolicy),
    Headers(HeadersPolicy),
    IpRestriction(IpRestrictionPolicy),
    RequestSizeLimit(RequestSizeLimitPolicy),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthPolicy {
    /// Realm sent in `WWW-Authenticate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realm: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyPolicy {
    /// Header carrying the key; `null` to not read headers.
    #[serde(default = "default_key_name")]
    pub header: Option<String>,
    /// Query parameter carrying the key; `null` to not read the query.
    #[serde(default = "default_key_name")]
    pub query_param: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JwtPolicy {
    /// Accepted algorithms; empty: those of the consumers' keys.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub algorithms: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leeway: Option<HumanDuration>,
    /// Claim naming the consumer's JWT key (default `iss`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_claim: Option<String>,
    /// JWKS document (RFC 7517) of an external issuer, as JSON text. Tokens
    /// whose `kid`/key claim names no consumer key are verified against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = r#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"idp-1","x":"..."}]}"#)]
    pub jwks: Option<String>,
    /// URL of the issuer's JWKS document (instead of `jwks`): each data plane fetches it, refreshes it as its
    /// `Cache-Control: max-age` says and when a token names an unknown `kid`, and keeps the last good keys
    /// while the URL fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "https://idp.example.com/.well-known/jwks.json")]
    pub jwks_url: Option<String>,
    /// Claim naming the consumer of a token verified by the JWKS (default `sub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer_claim: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitPolicy {
    #[schema(example = 100, minimum = 1)]
    pub requests: u64,
    pub per: HumanDuration,
    /// Requests allowed at once; default `requests`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    #[serde(default)]
    pub key: RateLimitKey,
    /// Header keying the bucket when `key` is `header`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Enforce one limit across all data planes through Redis.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cluster_wide: bool,
    /// When Redis is unreachable: let requests through (true) or reject them (false).
    #[serde(default = "yes")]
    pub fail_open: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitKey {
    /// The authenticated consumer (the client IP for anonymous requests).
    #[default]
    Consumer,
    Ip,
    Api,
    Header,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CorsPolicy {
    pub allow_origins: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_credentials: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<HumanDuration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeadersPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<HeaderRules>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<HeaderRules>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeaderRules {
    /// Replace (or add) these headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Append these values, keeping existing ones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub add: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
    /// Rename `from` to `to`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rename: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IpRestrictionPolicy {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestSizeLimitPolicy {
    #[schema(example = 1048576, minimum = 1)]
    pub max_bytes: u64,
}

fn default_key_name() -> Option<String> {
    Some("apikey".into())
}
fn is_false(value: &bool) -> bool {
    !*value
}
fn yes() -> bool {
    true
}
