//! What the five named collections (`/v1/apis`, `/v1/upstreams`, `/v1/consumers`, `/v1/specs`,
//! `/v1/certificates`) have in common, so that one set of generic handlers in `crud.rs` serves them all: the schema a
//! body is validated against, which JSON field names an item, how write-only input becomes stored form, and who refers
//! to an item. Where the items live in `Config` and how they are named is `model::Resource`.

use sluice_proto::Violation;

use crate::model::{Api, Certificate, Config, Consumer, Resource, Spec, Upstream};
use crate::prepare::{prepare_certificate, prepare_consumer, prepare_spec};
use crate::store::Store;

pub trait Collection: Resource {
    /// Name of the generated component schema a request body is validated against.
    const SCHEMA: &'static str;
    /// The JSON field that holds the name (`username` for consumers, as in the config file).
    const NAME_FIELD: &'static str = "name";

    /// Turns write-only input into stored form; may be slow (Argon2, big specs), so callers run it on the blocking
    /// pool. `previous` is the stored item of the same name, so an unchanged
    /// secret keeps its stored hash and re-sending an export changes nothing.
    fn prepare(self, _previous: Option<&Self>, _store: &Store) -> Result<Self, Vec<Violation>> {
        Ok(self)
    }

    /// The resources that point at `name` (as `apis/shop`); while there are any, it cannot be deleted.
    fn referrers(_config: &Config, _name: &str) -> Vec<String> {
        Vec::new()
    }
}

impl Collection for Api {
    const SCHEMA: &'static str = "Api";
}

impl Collection for Upstream {
    const SCHEMA: &'static str = "Upstream";

    fn referrers(config: &Config, name: &str) -> Vec<String> {
        config.apis.iter().filter(|api| api.upstream == name).map(|api| format!("apis/{}", api.name)).collect()
    }
}

impl Collection for Consumer {
    const SCHEMA: &'static str = "Consumer";
    const NAME_FIELD: &'static str = "username";

    fn prepare(self, previous: Option<&Self>, store: &Store) -> Result<Self, Vec<Violation>> {
        prepare_consumer(self, previous, store.secrets(), store.api_key_hmac_key())
    }
}

impl Collection for Spec {
    const SCHEMA: &'static str = "Spec";

    fn prepare(self, _previous: Option<&Self>, store: &Store) -> Result<Self, Vec<Violation>> {
        prepare_spec(self, store.specs(), store.max_spec_bytes())
    }
    fn referrers(config: &Config, name: &str) -> Vec<String> {
        config
            .apis
            .iter()
            .filter(|api| api.openapi.as_ref().is_some_and(|binding| binding.spec == name))
            .map(|api| format!("apis/{}", api.name))
            .collect()
    }
}

impl Collection for Certificate {
    const SCHEMA: &'static str = "Certificate";

    fn prepare(self, previous: Option<&Self>, store: &Store) -> Result<Self, Vec<Violation>> {
        prepare_certificate(self, previous, store.secrets())
    }
    fn referrers(config: &Config, name: &str) -> Vec<String> {
        config
            .upstreams
            .iter()
            .filter(|u| u.tls.as_ref().and_then(|tls| tls.client_certificate.as_deref()) == Some(name))
            .map(|u| format!("upstreams/{}", u.name))
            .collect()
    }
}
