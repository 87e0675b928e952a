//! The declarative configuration model: what `PUT /v1/config`, each admin
//! resource endpoint and `sluice apply -f` take and return. Field names match
//! DESIGN.md's example config. Secrets come in through write-only fields
//! (`password`, `key`, `secret`) and are replaced by hashes or sealed
//! (encrypted) values before anything is stored, so nothing read back from the
//! store or the API ever holds a secret in the clear.
//!
//! `build_snapshot` (in `snapshot.rs`) turns a stored `Config` into the wire
//! `Snapshot`.

mod duration;
mod policy;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use duration::HumanDuration;
pub use policy::{
    ApiKeyPolicy, BasicAuthPolicy, CorsPolicy, HeaderRules, HeadersPolicy, IpRestrictionPolicy, JwtPolicy, Policy,
    RateLimitKey, RateLimitPolicy, RequestSizeLimitPolicy,
};

/// The whole gateway configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub upstreams: Vec<Upstream>,
    #[serde(default)]
    pub specs: Vec<Spec>,
    #[serde(default)]
    pub consumers: Vec<Consumer>,
    #[serde(default)]
    pub certificates: Vec<Certificate>,
    #[serde(default)]
    pub apis: Vec<Api>,
}

/// An API: which requests it claims, what runs on them, where they go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Api {
    #[schema(example = "shop")]
    pub name: String,
    /// Exact or `*.`-wildcard host names; empty matches every host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default = "default_path_prefix")]
    #[schema(example = "/shop/v2")]
    pub path_prefix: String,
    /// Exact paths or templates (`/products/{id}`) under the prefix; empty claims the whole prefix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// HTTP methods (upper case); empty matches every method.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub strip_prefix: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub preserve_host: bool,
    /// Forward the path as the client sent it (encoded `/` and `\` allowed)
    /// instead of its canonical form; routing and policies still see the
    /// canonical form. Not with `strip_prefix`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub forward_raw_path: bool,
    /// Pass a client's `Upgrade: h2c` to the upstream (dropped otherwise).
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_h2c_upgrade: bool,
    /// Name of the upstream requests are forwarded to. May be left out when
    /// `openapi` binds a spec: the API then forwards to the spec's first
    /// server, and a `/` path prefix becomes the server's base path.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schema(example = "shop-backend")]
    pub upstream: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openapi: Option<OpenApiBinding>,
    /// Policies, run in this order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<Policy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<HumanDuration>,
    /// Retries of idempotent requests without a body when connecting to a
    /// target fails or the connection closes before a response begins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 10)]
    pub retries: Option<u32>,
}

/// Binds an API to an OpenAPI spec for request (and optionally response) validation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenApiBinding {
    pub spec: String,
    #[serde(default = "yes")]
    pub validate_requests: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub validate_responses: bool,
}

/// A named pool of targets with its balancing, health checks and TLS settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    #[schema(example = "shop-backend")]
    pub name: String,
    pub targets: Vec<Target>,
    #[serde(default)]
    pub balance: Balance,
    /// What consistent hashing hashes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_on: Option<HashOn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passive_health_check: Option<PassiveHealthCheck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
    /// Speak HTTP/2 to the targets.
    #[serde(default, skip_serializing_if = "is_false")]
    pub http2: bool,
    /// How many retries the APIs using this upstream may send; absent: the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_budget: Option<RetryBudget>,
}

/// Retries may add `ratio` of the upstream's requests plus
/// `min_retries_per_second`; unused budget is kept for 10 seconds' worth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBudget {
    #[serde(default = "default_retry_ratio")]
    #[schema(minimum = 0, maximum = 1, example = 0.2)]
    pub ratio: f64,
    #[serde(default = "default_min_retries_per_second")]
    #[schema(minimum = 0, maximum = 1000, example = 10)]
    pub min_retries_per_second: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Target {
    #[schema(example = "http://127.0.0.1:9001")]
    pub url: String,
    #[serde(default = "one")]
    #[schema(minimum = 0, maximum = 10000)]
    pub weight: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    #[default]
    RoundRobin,
    WeightedRoundRobin,
    LeastConnections,
    RandomTwoChoices,
    ConsistentHash,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HashOn {
    pub source: HashSource,
    /// Header or cookie name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HashSource {
    ClientIp,
    Header,
    Cookie,
}

/// Active health checks: the data plane probes each target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    #[schema(example = "/health")]
    pub path: String,
    #[serde(default = "five_seconds")]
    pub interval: HumanDuration,
    #[serde(default = "one_second")]
    pub timeout: HumanDuration,
    #[serde(default = "two")]
    #[schema(minimum = 1)]
    pub healthy_threshold: u32,
    #[serde(default = "three")]
    #[schema(minimum = 1)]
    pub unhealthy_threshold: u32,
}

/// Passive ejection: a target failing this many requests in a row is taken out for a while.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PassiveHealthCheck {
    pub consecutive_failures: u32,
    #[serde(default = "thirty_seconds")]
    pub ejection: HumanDuration,
    /// Which of the target's own answers count as failures, beside connect errors, resets and timeouts;
    /// `[]` counts only those. Failures the client causes never count.
    #[serde(default = "gateway_failures", skip_serializing_if = "is_gateway_failures")]
    #[schema(example = json!([502, 503, 504]))]
    pub unhealthy_statuses: Vec<FailureStatus>,
}

/// A 5xx status an upstream target answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(minimum = 500, maximum = 599)]
pub struct FailureStatus(pub u16);

/// Envoy's "gateway failures": the answers of a target that is itself a proxy whose own upstream is failing.
const GATEWAY_FAILURES: [FailureStatus; 3] = [FailureStatus(502), FailureStatus(503), FailureStatus(504)];

/// TLS to the upstream's https:// targets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTls {
    /// PEM CA bundle; absent: the system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub insecure_skip_verify: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// Name of a certificate presented to the upstream (mTLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<String>,
}

/// A consumer (user) and its credentials. Credentials are write-only: what is
/// read back holds only their hashes or sealed values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Consumer {
    #[schema(example = "loadtest")]
    pub username: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuthCredential>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_keys: Vec<ApiKeyCredential>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jwt: Vec<JwtCredential>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthCredential {
    /// Write-only; stored as an Argon2id hash.
    #[serde(default, skip_serializing_if = "write_only")]
    #[schema(write_only, min_length = 1)]
    pub password: Option<String>,
    /// Argon2id PHC string of the password, as exported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_hash: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyCredential {
    /// Write-only; stored as a keyed digest. At least 8 characters.
    #[serde(default, skip_serializing_if = "write_only")]
    #[schema(write_only, min_length = 8)]
    pub key: Option<String>,
    /// Hex HMAC-SHA256 of the key, as exported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_digest: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JwtCredential {
    /// Matched against the token's `kid` header or its `iss` claim.
    pub key: String,
    #[schema(example = "HS256")]
    pub algorithm: String,
    /// HMAC secret for HS* algorithms. Write-only; stored encrypted.
    #[serde(default, skip_serializing_if = "write_only")]
    #[schema(write_only, min_length = 1)]
    pub secret: Option<String>,
    /// The HMAC secret encrypted with the control plane's secret key, as exported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_sealed: Option<String>,
    /// PEM public key for RS*, PS*, ES* and EdDSA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
}

/// An OpenAPI 3.0 or 3.1 document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    #[schema(example = "fruitshop")]
    pub name: String,
    /// The document, YAML or JSON.
    pub content: String,
    /// Read-only: the document's `openapi` version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub openapi_version: Option<String>,
    /// Read-only: the document's `info.title`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub title: Option<String>,
}

/// A TLS certificate chain and its private key, uploaded as PEM or PKCS#12.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    #[schema(example = "api-example-com")]
    pub name: String,
    /// PEM chain, leaf first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<String>,
    /// PEM private key. Write-only; stored encrypted.
    #[serde(default, skip_serializing_if = "write_only")]
    #[schema(write_only)]
    pub key: Option<String>,
    /// Base64 PKCS#12 keystore holding chain and key. Write-only; converted to PEM.
    #[serde(default, skip_serializing_if = "write_only")]
    #[schema(write_only)]
    pub pkcs12: Option<String>,
    /// Password of the PKCS#12 keystore. Write-only.
    #[serde(default, skip_serializing_if = "write_only")]
    #[schema(write_only)]
    pub password: Option<String>,
    /// The private key encrypted with the control plane's secret key, as exported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_sealed: Option<String>,
    /// SNI names served; absent: the certificate's DNS names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snis: Vec<String>,
    /// Served when no SNI name matches.
    #[serde(default, skip_serializing_if = "is_false")]
    pub default: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub subject: Option<String>,
    /// Read-only: RFC 3339 end of validity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub not_after: Option<String>,
}

/// The kinds of resource, in dependency order: a kind may refer only to kinds before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Certificate,
    Upstream,
    Spec,
    Consumer,
    Api,
}

impl Kind {
    /// The collection name used in URLs, config documents and violation paths.
    pub fn collection(self) -> &'static str {
        match self {
            Kind::Certificate => "certificates",
            Kind::Upstream => "upstreams",
            Kind::Spec => "specs",
            Kind::Consumer => "consumers",
            Kind::Api => "apis",
        }
    }

    pub const ALL: [Kind; 5] = [Kind::Certificate, Kind::Upstream, Kind::Spec, Kind::Consumer, Kind::Api];
}

/// What the items of the five named collections share: their kind, the field
/// that names them, and where they live in a [`Config`]. The store's rows,
/// the config diff and the admin API's collections (`admin::Collection`) all
/// reach the items through it.
pub trait Resource: Serialize + DeserializeOwned + Clone + PartialEq + Send + Sync + 'static {
    const KIND: Kind;
    fn name(&self) -> &str;
    fn items(config: &Config) -> &Vec<Self>;
    fn items_mut(config: &mut Config) -> &mut Vec<Self>;
}

macro_rules! resource {
    ($type:ty, $kind:ident, $name:ident, $collection:ident) => {
        impl Resource for $type {
            const KIND: Kind = Kind::$kind;
            fn name(&self) -> &str {
                &self.$name
            }
            fn items(config: &Config) -> &Vec<Self> {
                &config.$collection
            }
            fn items_mut(config: &mut Config) -> &mut Vec<Self> {
                &mut config.$collection
            }
        }
    };
}
resource!(Certificate, Certificate, name, certificates);
resource!(Upstream, Upstream, name, upstreams);
resource!(Spec, Spec, name, specs);
resource!(Consumer, Consumer, username, consumers);
resource!(Api, Api, name, apis);

fn default_path_prefix() -> String {
    "/".into()
}
/// Secrets are accepted but never written back out. `skip_serializing_if`
/// rather than `skip_serializing`, because utoipa drops `skip_serializing`
/// fields from the schema, and the body validator would then refuse them.
fn write_only<T>(_: &T) -> bool {
    true
}
fn is_false(value: &bool) -> bool {
    !*value
}
fn yes() -> bool {
    true
}
fn one() -> u32 {
    1
}
fn two() -> u32 {
    2
}
fn three() -> u32 {
    3
}
fn one_second() -> HumanDuration {
    HumanDuration::from_secs(1)
}
fn five_seconds() -> HumanDuration {
    HumanDuration::from_secs(5)
}
fn gateway_failures() -> Vec<FailureStatus> {
    GATEWAY_FAILURES.to_vec()
}
fn is_gateway_failures(statuses: &[FailureStatus]) -> bool {
    statuses == GATEWAY_FAILURES
}
fn default_retry_ratio() -> f64 {
    sluice_proto::DEFAULT_RETRY_RATIO
}
fn default_min_retries_per_second() -> u32 {
    sluice_proto::DEFAULT_MIN_RETRIES_PER_SECOND
}
fn thirty_seconds() -> HumanDuration {
    HumanDuration::from_secs(30)
}
