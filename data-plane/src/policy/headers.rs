//! `headers`, after authentication on the way in and first of the gateway's
//! own changes on the way out: set, add, remove and rename rules for request
//! and response headers, with names and values parsed once per snapshot.

use http::{HeaderMap, HeaderName, HeaderValue};
use sluice_proto::v1;

#[derive(Debug, Default)]
pub struct HeaderPolicy {
    request: Rules,
    response: Rules,
}

#[derive(Debug, Default)]
struct Rules {
    remove: Vec<HeaderName>,
    rename: Vec<(HeaderName, HeaderName)>,
    set: Vec<(HeaderName, HeaderValue)>,
    add: Vec<(HeaderName, HeaderValue)>,
}

impl HeaderPolicy {
    pub fn compile(spec: &v1::Headers) -> Result<Self, String> {
        Ok(HeaderPolicy {
            request: Rules::compile(spec.request.as_ref()).map_err(|e| format!("request: {e}"))?,
            response: Rules::compile(spec.response.as_ref()).map_err(|e| format!("response: {e}"))?,
        })
    }

    pub fn rewrite_request(&self, headers: &mut HeaderMap) {
        self.request.apply(headers);
    }

    pub fn rewrite_response(&self, headers: &mut HeaderMap) {
        self.response.apply(headers);
    }
}

impl Rules {
    fn compile(spec: Option<&v1::HeaderRules>) -> Result<Self, String> {
        let Some(spec) = spec else { return Ok(Rules::default()) };
        let name =
            |n: &str| HeaderName::from_bytes(n.as_bytes()).map_err(|_| format!("`{n}` is not a valid header name"));
        let pair = |h: &v1::HeaderValue| -> Result<(HeaderName, HeaderValue), String> {
            let value = HeaderValue::from_str(&h.value)
                .map_err(|_| format!("the value of `{}` is not a valid header value", h.name))?;
            Ok((name(&h.name)?, value))
        };
        Ok(Rules {
            remove: spec.remove.iter().map(|n| name(n)).collect::<Result<_, _>>()?,
            rename: spec.rename.iter().map(|r| Ok((name(&r.from)?, name(&r.to)?))).collect::<Result<_, String>>()?,
            set: spec.set.iter().map(pair).collect::<Result<_, _>>()?,
            add: spec.add.iter().map(pair).collect::<Result<_, _>>()?,
        })
    }

    /// Remove, rename, set, add, whatever order the config lists them in:
    /// removing first means a rename or set of the same name is never undone;
    /// set before add lets `add` append to a value `set` just fixed.
    fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (from, to) in &self.rename {
            // Every value moves, and the new name replaces any value already under it.
            if let http::header::Entry::Occupied(entry) = headers.entry(from) {
                let values: Vec<HeaderValue> = entry.remove_entry_mult().1.collect();
                headers.remove(to);
                for value in values {
                    headers.append(to, value);
                }
            }
        }
        for (name, value) in &self.set {
            headers.insert(name, value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name, value.clone());
        }
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)]
mod tests {
    use super::*;

    fn hv(name: &str, value: &str) -> v1::HeaderValue {
        v1::HeaderValue { name: name.into(), value: value.into() }
    }

    fn render(headers: &HeaderMap) -> Vec<String> {
        let mut out: Vec<String> = headers.iter().map(|(k, v)| format!("{k}={}", v.to_str().unwrap())).collect();
        out.sort();
        out
    }

    #[test]
    fn rules_table() {
        let cases: Vec<(&str, v1::HeaderRules, Vec<(&str, &str)>, Vec<&str>)> = vec![
            (
                "set replaces every value",
                v1::HeaderRules { set: vec![hv("x-a", "1")], ..Default::default() },
                vec![("x-a", "old"), ("x-a", "older")],
                vec!["x-a=1"],
            ),
            (
                "add appends",
                v1::HeaderRules { add: vec![hv("x-a", "2")], ..Default::default() },
                vec![("x-a", "1")],
                vec!["x-a=1", "x-a=2"],
            ),
            (
                "remove",
                v1::HeaderRules { remove: vec!["X-Secret".into()], ..Default::default() },
                vec![("x-secret", "s"), ("x-keep", "k")],
                vec!["x-keep=k"],
            ),
            (
                "rename moves all values and replaces the target",
                v1::HeaderRules {
                    rename: vec![v1::HeaderRename { from: "x-old".into(), to: "x-new".into() }],
                    ..Default::default()
                },
                vec![("x-old", "1"), ("x-old", "2"), ("x-new", "stale")],
                vec!["x-new=1", "x-new=2"],
            ),
            (
                "rename of an absent header does nothing",
                v1::HeaderRules {
                    rename: vec![v1::HeaderRename { from: "x-old".into(), to: "x-new".into() }],
                    ..Default::default()
                },
                vec![("x-new", "kept")],
                vec!["x-new=kept"],
            ),
            (
                "fixed order: remove, rename, set, add",
                v1::HeaderRules {
                    add: vec![hv("x-a", "added")],
                    set: vec![hv("x-a", "set")],
                    remove: vec!["x-a".into()],
                    rename: vec![v1::HeaderRename { from: "x-b".into(), to: "x-a".into() }],
                },
                vec![("x-a", "client"), ("x-b", "b")],
                vec!["x-a=added", "x-a=set"],
            ),
        ];
        for (name, rules, input, want) in cases {
            let policy = HeaderPolicy::compile(&v1::Headers { request: Some(rules), response: None }).unwrap();
            let mut headers = HeaderMap::new();
            for (k, v) in input {
                headers.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
            }
            policy.rewrite_request(&mut headers);
            assert_eq!(render(&headers), want, "{name}");
            // The response side has no rules here and leaves headers alone.
            let before = render(&headers);
            policy.rewrite_response(&mut headers);
            assert_eq!(render(&headers), before, "{name}");
        }
    }

    #[test]
    fn invalid_rules_fail_compile() {
        let bad_name = v1::Headers {
            response: Some(v1::HeaderRules { remove: vec!["bad name".into()], ..Default::default() }),
            request: None,
        };
        assert!(HeaderPolicy::compile(&bad_name).unwrap_err().starts_with("response: "));
        let bad_value = v1::Headers {
            request: Some(v1::HeaderRules { set: vec![hv("x-a", "line\nbreak")], ..Default::default() }),
            response: None,
        };
        assert!(HeaderPolicy::compile(&bad_value).unwrap_err().contains("x-a"));
    }
}
