//! `api_key`, one of the authentication steps of the policy chain: a key in a
//! header or a query parameter, looked up by its HMAC-SHA256 digest (keyed by
//! the snapshot's `api_key_hmac_key`) in a map built per snapshot, so the data
//! plane never holds the keys themselves.

use std::borrow::Cow;
use std::sync::Arc;

use hmac::{Hmac, Mac as _};
use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::Sha256;
use sluice_proto::path::percent_decode;
use sluice_proto::v1;

use crate::fast_map::FastMap;

#[derive(Debug)]
pub struct ApiKeyAuth {
    header: Option<HeaderName>,
    query_param: Option<String>,
    challenge: HeaderValue,
    /// Keyed once at compile time; cloned per request (cheaper than re-keying).
    mac: Hmac<Sha256>,
    /// Digest -> consumer. Not SipHash: a key is an HMAC under the
    /// cluster's secret key, so no client can choose keys that collide.
    consumers: FastMap<[u8; 32], Arc<str>>,
}

impl ApiKeyAuth {
    pub fn compile(spec: &v1::ApiKeyAuth, api: &str, snapshot: &v1::Snapshot) -> Result<Self, String> {
        let header = sluice_proto::policy::api_key_header(spec)?;
        let query_param = (!spec.query_param.is_empty()).then(|| spec.query_param.clone());
        if header.is_none() && query_param.is_none() {
            return Err("needs a header or a query_param to read the key from".into());
        }
        let mac = Hmac::<Sha256>::new_from_slice(&snapshot.api_key_hmac_key)
            .map_err(|e| format!("the snapshot's API-key HMAC key is unusable: {e}"))?;
        let mut consumers = FastMap::default();
        for consumer in &snapshot.consumers {
            let name: Arc<str> = consumer.username.as_str().into();
            for digest in &consumer.api_key_digests {
                // Validation holds digests to 64 hexadecimal digits.
                let mut bytes = [0u8; 32];
                hex::decode_to_slice(digest, &mut bytes)
                    .map_err(|e| format!("consumer `{name}` has an API key digest that is not hexadecimal: {e}"))?;
                consumers.insert(bytes, name.clone());
            }
        }
        let mut challenge = format!("ApiKey realm=\"{}\"", api.replace('"', "'"));
        if let Some(header) = &header {
            challenge.push_str(&format!(", header=\"{header}\""));
        }
        if let Some(param) = &query_param {
            challenge.push_str(&format!(", query=\"{}\"", param.replace('"', "'")));
        }
        let challenge =
            HeaderValue::from_str(&challenge).map_err(|_| "the key's location cannot be sent in a header")?;
        Ok(ApiKeyAuth { header, query_param, challenge, mac, consumers })
    }

    pub fn challenge(&self) -> &HeaderValue {
        &self.challenge
    }

    pub fn header(&self) -> Option<&HeaderName> {
        self.header.as_ref()
    }

    pub fn query_param(&self) -> Option<&str> {
        self.query_param.as_deref()
    }

    /// The key the request carries: the header first, then the query parameter.
    pub fn presented<'a>(&self, headers: &'a HeaderMap, query: Option<&'a str>) -> Option<Cow<'a, str>> {
        if let Some(value) = self.header.as_ref().and_then(|h| headers.get(h)) {
            return Some(String::from_utf8_lossy(value.as_bytes()));
        }
        let param = self.query_param.as_deref()?;
        query_pairs(query?).find(|(name, _)| name == param).map(|(_, value)| value)
    }

    pub fn verify(&self, key: &str) -> Option<Arc<str>> {
        if key.is_empty() {
            return None;
        }
        let mut mac = self.mac.clone();
        mac.update(key.as_bytes());
        let digest: [u8; 32] = mac.finalize().into_bytes().into();
        self.consumers.get(&digest).cloned()
    }
}

/// `name=value` pairs of a query string, percent-decoded (`+` as space).
pub fn query_pairs(query: &str) -> impl Iterator<Item = (Cow<'_, str>, Cow<'_, str>)> {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(name, true), percent_decode(value, true))
    })
}

/// The query string without the pairs named `param`, or `None` when nothing is left.
pub fn remove_query_param(query: &str, param: &str) -> Option<String> {
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| percent_decode(pair.split_once('=').map_or(*pair, |(n, _)| n), true) != param)
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

#[cfg(test)]
#[allow(clippy::type_complexity)]
mod tests {
    use super::*;

    const HMAC_KEY: &[u8] = b"snapshot-hmac-key";

    fn digest(key: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(HMAC_KEY).unwrap();
        mac.update(key.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    fn snapshot() -> v1::Snapshot {
        v1::Snapshot {
            api_key_hmac_key: HMAC_KEY.to_vec(),
            consumers: vec![
                v1::Consumer {
                    username: "ann".into(),
                    api_key_digests: vec![digest("ann-key-1"), digest("ann-key-2").to_uppercase()],
                    ..Default::default()
                },
                v1::Consumer { username: "bob".into(), api_key_digests: vec![digest("bob key")], ..Default::default() },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn lookup_table() {
        let spec = v1::ApiKeyAuth { header: "X-API-Key".into(), query_param: "apikey".into() };
        let auth = ApiKeyAuth::compile(&spec, "shop", &snapshot()).unwrap();
        // (header value, query, want consumer)
        let cases: &[(Option<&str>, Option<&str>, Option<&str>)] = &[
            (Some("ann-key-1"), None, Some("ann")),
            (Some("ann-key-2"), None, Some("ann")),
            (None, Some("a=1&apikey=ann-key-1"), Some("ann")),
            (None, Some("apikey=bob+key"), Some("bob")),
            (None, Some("apikey=bob%20key"), Some("bob")),
            (Some("wrong"), None, None),
            (Some(""), None, None),
            // The header wins when both are present.
            (Some("wrong"), Some("apikey=ann-key-1"), None),
            (None, Some("other=ann-key-1"), None),
        ];
        for (header, query, want) in cases {
            let mut headers = HeaderMap::new();
            if let Some(value) = header {
                headers.insert("x-api-key", HeaderValue::from_str(value).unwrap());
            }
            let presented = auth.presented(&headers, *query);
            let got = presented.and_then(|key| auth.verify(&key));
            assert_eq!(got.as_deref(), *want, "{header:?} {query:?}");
        }
        assert!(auth.presented(&HeaderMap::new(), Some("x=1")).is_none());
        assert_eq!(auth.challenge(), "ApiKey realm=\"shop\", header=\"x-api-key\", query=\"apikey\"");
    }

    #[test]
    fn remove_query_param_table() {
        let cases = [
            ("apikey=k", None),
            ("a=1&apikey=k&b=2", Some("a=1&b=2")),
            ("apikey=k&apikey=j&b", Some("b")),
            ("api%6Bey=k&c=3", Some("c=3")),
            ("apikeyx=k", Some("apikeyx=k")),
        ];
        for (query, want) in cases {
            assert_eq!(remove_query_param(query, "apikey").as_deref(), want, "{query}");
        }
    }
}
