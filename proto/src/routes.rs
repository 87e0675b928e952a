//! Route matching: (host, path, method) -> index of the API in a data
//! plane's routing table, the first step of its request path after parsing.
//! Built once per snapshot; a lookup costs a few hash probes plus one walk
//! down the path, whatever the number of routes. It lives in the contract
//! because building it is also the route-conflict check: the control plane
//! builds one from every configuration it is about to commit, so a conflict
//! that a data plane would refuse (two APIs on `/t/{id}` and `/t/{sku}`) is
//! refused at write time, by the same code.

use std::collections::{BTreeSet, HashMap};

use http::Method;
use smallvec::SmallVec;

use crate::v1::Api;

/// Keys come from the configuration, and clients only look them up: foldhash
/// is several times cheaper than SipHash on short keys, with a per-process seed.
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Why no API matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteMiss {
    /// No API serves this host and path.
    NotFound,
    /// An API serves the path, but not with this method; `allow` lists the methods that would match.
    MethodNotAllowed { allow: Vec<String> },
}

/// A route conflict found while building the matcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// Position of the API whose route could not be added.
    pub api: usize,
    /// Its path prefix or path template that conflicts.
    pub route: String,
    pub detail: String,
}

/// Which methods an entry accepts; `None` accepts all.
#[derive(Debug, Clone)]
struct Entry {
    methods: Option<Vec<Method>>,
    api: usize,
}

impl Entry {
    fn accepts(&self, method: &Method) -> bool {
        self.methods.as_ref().is_none_or(|m| m.contains(method))
    }

    fn overlaps(&self, other: &Entry) -> bool {
        match (&self.methods, &other.methods) {
            (Some(a), Some(b)) => a.iter().any(|m| b.contains(m)),
            _ => true,
        }
    }
}

/// Picks the entry accepting `method`, or returns the methods the entries accept.
fn pick(entries: &[Entry], method: &Method) -> Result<usize, Vec<String>> {
    if let Some(entry) = entries.iter().find(|e| e.accepts(method)) {
        return Ok(entry.api);
    }
    let allow: BTreeSet<&str> = entries.iter().flat_map(|e| e.methods.iter().flatten()).map(Method::as_str).collect();
    Err(allow.into_iter().map(str::to_string).collect())
}

fn push_entry(entries: &mut Vec<Entry>, entry: Entry, route: &str, names: &[&str]) -> Result<(), Conflict> {
    if let Some(other) = entries.iter().find(|e| e.overlaps(&entry)) {
        let (a, b) = (names.get(other.api).copied().unwrap_or("?"), names.get(entry.api).copied().unwrap_or("?"));
        return Err(Conflict {
            api: entry.api,
            route: route.to_string(),
            detail: format!("APIs `{a}` and `{b}` both serve `{route}` for the same host and method"),
        });
    }
    entries.push(entry);
    Ok(())
}

/// Longest-prefix matching over whole path segments, so `/shop` matches
/// `/shop` and `/shop/x` but not `/shopping`.
#[derive(Debug, Default)]
struct PrefixNode {
    children: FastMap<Box<str>, PrefixNode>,
    entries: Vec<Entry>,
}

/// The routes of one host level (an exact host, a wildcard suffix, or "any host").
#[derive(Debug, Default)]
struct HostRoutes {
    /// Exact paths and templates; tried first because they are narrower than any prefix.
    paths: matchit::Router<Vec<Entry>>,
    /// Entries per (normalized) template, kept so conflicts can be detected before insertion.
    path_entries: HashMap<String, Vec<Entry>>,
    prefixes: PrefixNode,
}

impl HostRoutes {
    fn lookup(&self, path: &str, method: &Method) -> Result<usize, RouteMiss> {
        // The most specific path match decides the Allow list if no method matches anywhere.
        let mut allow: Option<Vec<String>> = None;
        // Most APIs route by prefix only: skip the template router when it is empty.
        if !self.path_entries.is_empty()
            && let Ok(found) = self.paths.at(path)
        {
            match pick(found.value, method) {
                Ok(api) => return Ok(api),
                Err(methods) => allow = Some(methods),
            }
        }
        // Walk down as far as the path goes, remembering each node with entries;
        // then try them deepest first, so a shorter prefix still serves a method
        // the longer one does not accept.
        let mut matched: SmallVec<[&[Entry]; 4]> = SmallVec::new();
        let mut node = &self.prefixes;
        if !node.entries.is_empty() {
            matched.push(&node.entries);
        }
        for segment in path.split('/').filter(|s| !s.is_empty()) {
            // A leaf, as the node of most prefixes is: the rest of the path need not be split and hashed.
            if node.children.is_empty() {
                break;
            }
            match node.children.get(segment) {
                Some(child) => node = child,
                None => break,
            }
            if !node.entries.is_empty() {
                matched.push(&node.entries);
            }
        }
        for entries in matched.iter().rev() {
            match pick(entries, method) {
                Ok(api) => return Ok(api),
                Err(methods) => {
                    allow.get_or_insert(methods);
                }
            }
        }
        match allow {
            Some(allow) => Err(RouteMiss::MethodNotAllowed { allow }),
            None => Err(RouteMiss::NotFound),
        }
    }
}

/// One route as the compiler hands it over.
pub struct RouteSpec<'a> {
    pub api: usize,
    pub hosts: &'a [String],
    pub path_prefix: &'a str,
    pub paths: &'a [String],
    pub methods: &'a [String],
}

/// The compiled matcher: exact hosts, wildcard host suffixes, then routes for any host.
#[derive(Debug, Default)]
pub struct Matcher {
    exact: FastMap<String, HostRoutes>,
    /// Keyed by the suffix after `*.`, e.g. `example.com`.
    wildcard: FastMap<String, HostRoutes>,
    any: HostRoutes,
}

impl Matcher {
    /// The matcher of a snapshot's APIs, answering with their positions.
    pub fn from_apis(apis: &[Api]) -> Result<Self, Conflict> {
        let names: Vec<&str> = apis.iter().map(|a| a.name.as_str()).collect();
        let routes = apis.iter().enumerate().map(|(i, a)| RouteSpec {
            api: i,
            hosts: &a.hosts,
            path_prefix: &a.path_prefix,
            paths: &a.paths,
            methods: &a.methods,
        });
        Matcher::build(routes, &names)
    }

    /// Builds the matcher; `names` are the API names, for conflict messages.
    pub fn build<'a>(routes: impl IntoIterator<Item = RouteSpec<'a>>, names: &[&str]) -> Result<Self, Conflict> {
        let mut matcher = Matcher::default();
        for route in routes {
            let methods = if route.methods.is_empty() {
                None
            } else {
                let parsed = route.methods.iter().map(|m| Method::from_bytes(m.as_bytes()));
                Some(parsed.collect::<Result<Vec<_>, _>>().map_err(|_| Conflict {
                    api: route.api,
                    route: route.path_prefix.to_string(),
                    detail: format!("invalid method in {:?}", route.methods),
                })?)
            };
            let entry = Entry { methods, api: route.api };
            if route.hosts.is_empty() {
                insert(&mut matcher.any, &entry, &route, names)?;
            }
            for host in route.hosts {
                let host = host.to_ascii_lowercase();
                let level = match host.strip_prefix("*.") {
                    Some(suffix) => matcher.wildcard.entry(suffix.to_string()).or_default(),
                    None => matcher.exact.entry(host).or_default(),
                };
                insert(level, &entry, &route, names)?;
            }
        }
        Ok(matcher)
    }

    /// Finds the API for a request. `host` may carry a port; it is ignored.
    ///
    /// Host levels are tried from the most specific (exact, then the longest
    /// wildcard suffix) to "any host"; the first level with a full match wins.
    pub fn lookup(&self, host: Option<&str>, path: &str, method: &Method) -> Result<usize, RouteMiss> {
        let mut first_miss: Option<RouteMiss> = None;
        let mut note = |miss: RouteMiss| {
            if let RouteMiss::MethodNotAllowed { .. } = miss
                && first_miss.is_none()
            {
                first_miss = Some(miss);
            }
        };
        let routes_by_host = !self.exact.is_empty() || !self.wildcard.is_empty();
        if routes_by_host && let Some(host) = host.map(strip_port).filter(|h| !h.is_empty()) {
            // Hosts arrive lowercase almost always: copy only when one does not.
            let host: std::borrow::Cow<'_, str> = if host.bytes().any(|b| b.is_ascii_uppercase()) {
                host.to_ascii_lowercase().into()
            } else {
                host.into()
            };
            if let Some(level) = self.exact.get(host.as_ref()) {
                match level.lookup(path, method) {
                    Ok(api) => return Ok(api),
                    Err(miss) => note(miss),
                }
            }
            if !self.wildcard.is_empty() {
                let mut rest = host.as_ref();
                while let Some((_, suffix)) = rest.split_once('.') {
                    if let Some(level) = self.wildcard.get(suffix) {
                        match level.lookup(path, method) {
                            Ok(api) => return Ok(api),
                            Err(miss) => note(miss),
                        }
                    }
                    rest = suffix;
                }
            }
        }
        match self.any.lookup(path, method) {
            Ok(api) => Ok(api),
            Err(miss) => {
                note(miss);
                Err(first_miss.unwrap_or(RouteMiss::NotFound))
            }
        }
    }
}

fn insert(level: &mut HostRoutes, entry: &Entry, route: &RouteSpec<'_>, names: &[&str]) -> Result<(), Conflict> {
    if route.paths.is_empty() {
        let mut node = &mut level.prefixes;
        for segment in route.path_prefix.split('/').filter(|s| !s.is_empty()) {
            node = node.children.entry(segment.into()).or_default();
        }
        return push_entry(&mut node.entries, entry.clone(), route.path_prefix, names);
    }
    for path in route.paths {
        let normalized = normalize_template(path);
        let entries = level.path_entries.entry(normalized.clone()).or_default();
        push_entry(entries, entry.clone(), path, names)?;
        let entries = entries.clone();
        // matchit refuses to insert a route twice, so replace the entry list.
        let _ = level.paths.remove(normalized.as_str());
        level.paths.insert(normalized, entries).map_err(|e| Conflict {
            api: entry.api,
            route: path.clone(),
            detail: e.to_string(),
        })?;
    }
    Ok(())
}

/// Renames template parameters to `p0`, `p1`, ... so that `/items/{id}` and
/// `/items/{sku}` are the same route to matchit (which would otherwise reject
/// the pair as conflicting).
fn normalize_template(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut n = 0;
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        if c != '{' {
            out.push(c);
            continue;
        }
        let name: String = chars.by_ref().take_while(|c| *c != '}').collect();
        let star = if name.starts_with('*') { "*" } else { "" };
        out.push_str(&format!("{{{star}p{n}}}"));
        n += 1;
    }
    out
}

/// `example.com:8080` -> `example.com`, `[::1]:80` -> `[::1]`.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TestApi {
        hosts: Vec<String>,
        prefix: &'static str,
        paths: Vec<String>,
        methods: Vec<String>,
    }

    fn api(hosts: &[&str], prefix: &'static str, paths: &[&str], methods: &[&str]) -> TestApi {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        TestApi { hosts: s(hosts), prefix, paths: s(paths), methods: s(methods) }
    }

    fn build(apis: &[TestApi]) -> Result<Matcher, Conflict> {
        let names: Vec<String> = (0..apis.len()).map(|i| format!("api{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let routes = apis.iter().enumerate().map(|(i, a)| RouteSpec {
            api: i,
            hosts: &a.hosts,
            path_prefix: a.prefix,
            paths: &a.paths,
            methods: &a.methods,
        });
        Matcher::build(routes, &names)
    }

    type Case<'a> = (Option<&'a str>, &'a str, Method, Result<usize, RouteMiss>);

    #[test]
    fn matches_table() {
        let apis = [
            api(&[], "/", &[], &[]),                                                    // 0: catch-all
            api(&[], "/shop", &[], &[]),                                                // 1
            api(&[], "/shop/v2", &[], &["GET"]),                                        // 2
            api(&[], "/shop", &["/shop/products/{id}", "/shop/cart"], &["GET", "PUT"]), // 3
            api(&["api.example.com"], "/", &[], &[]),                                   // 4
            api(&["*.example.com"], "/", &[], &[]),                                     // 5
            api(&["*.b.example.com"], "/only", &[], &["POST"]),                         // 6
            api(&[], "/admin", &[], &["DELETE"]),                                       // 7
            api(&[], "/a/b/c/d/e", &[], &["GET"]),                                      // 8
            api(&[], "/a/b/c/d", &[], &["PUT"]),                                        // 9
            api(&[], "/a/b/c", &[], &["PATCH"]),                                        // 10
            api(&[], "/a/b", &[], &["HEAD"]),                                           // 11
        ];
        let m = build(&apis).unwrap();
        let cases: &[Case<'_>] = &[
            (None, "/", Method::GET, Ok(0)),
            (None, "/anything/deep", Method::POST, Ok(0)),
            (None, "/shop", Method::GET, Ok(1)),
            (None, "/shopping", Method::GET, Ok(0)),
            (None, "/shop/v2/items", Method::GET, Ok(2)),
            // A longer prefix that refuses the method falls back to a shorter one.
            (None, "/shop/v2/items", Method::POST, Ok(1)),
            (None, "/shop/products/42", Method::GET, Ok(3)),
            (None, "/shop/products/42", Method::POST, Ok(1)),
            (None, "/shop/cart", Method::PUT, Ok(3)),
            (Some("api.example.com"), "/x", Method::GET, Ok(4)),
            (Some("API.Example.com:8080"), "/x", Method::GET, Ok(4)),
            (Some("www.example.com"), "/x", Method::GET, Ok(5)),
            (Some("a.b.example.com"), "/x", Method::GET, Ok(5)),
            (Some("a.b.example.com"), "/only", Method::POST, Ok(6)),
            (Some("example.com"), "/shop", Method::GET, Ok(1)),
            (Some("other.org"), "/admin", Method::DELETE, Ok(7)),
            (Some("other.org"), "/admin", Method::GET, Ok(0)),
            // Five nested prefixes match; each refuses the method but the shortest ones.
            (None, "/a/b/c/d/e/f", Method::GET, Ok(8)),
            (None, "/a/b/c/d/e/f", Method::HEAD, Ok(11)),
            (None, "/a/b/c/d/e/f", Method::OPTIONS, Ok(0)),
        ];
        for (host, path, method, want) in cases {
            assert_eq!(&m.lookup(*host, path, method), want, "{host:?} {method} {path}");
        }
    }

    #[test]
    fn misses_table() {
        let apis = [
            api(&[], "/shop", &[], &["GET", "POST"]),
            api(&[], "/shop", &["/shop/items/{id}"], &["DELETE"]),
            api(&["api.example.com"], "/admin", &[], &["PUT"]),
        ];
        let m = build(&apis).unwrap();
        let allow = |m: &[&str]| Err(RouteMiss::MethodNotAllowed { allow: m.iter().map(|s| s.to_string()).collect() });
        let cases: &[Case<'_>] = &[
            (None, "/", Method::GET, Err(RouteMiss::NotFound)),
            (None, "/other", Method::GET, Err(RouteMiss::NotFound)),
            (None, "/shop/x", Method::PUT, allow(&["GET", "POST"])),
            (None, "/shop/items/1", Method::DELETE, Ok(1)),
            // The template is the most specific match, so its methods form the Allow list.
            (None, "/shop/items/1", Method::PUT, allow(&["DELETE"])),
            (Some("api.example.com"), "/admin", Method::GET, allow(&["PUT"])),
            (Some("other.example.com"), "/admin", Method::PUT, Err(RouteMiss::NotFound)),
        ];
        for (host, path, method, want) in cases {
            assert_eq!(&m.lookup(*host, path, method), want, "{host:?} {method} {path}");
        }
    }

    #[test]
    fn conflicts_table() {
        let cases: Vec<(Vec<TestApi>, bool)> = vec![
            (vec![api(&[], "/a", &[], &[]), api(&[], "/a/", &[], &[])], true),
            (vec![api(&[], "/a", &[], &["GET"]), api(&[], "/a", &[], &["POST"])], false),
            (vec![api(&["x.com"], "/a", &[], &[]), api(&["y.com"], "/a", &[], &[])], false),
            (vec![api(&[], "/a", &["/a/{id}"], &[]), api(&[], "/a", &["/a/{sku}"], &["GET"])], true),
            (vec![api(&[], "/a", &["/a/{id}"], &["PUT"]), api(&[], "/a", &["/a/{sku}"], &["GET"])], false),
        ];
        for (i, (apis, conflict)) in cases.iter().enumerate() {
            assert_eq!(build(apis).is_err(), *conflict, "case {i}");
        }
    }

    #[test]
    fn strips_ports() {
        for (input, want) in [("a.com", "a.com"), ("a.com:80", "a.com"), ("[::1]:8080", "[::1]"), ("[::1]", "[::1]")] {
            assert_eq!(strip_port(input), want);
        }
        assert_eq!(normalize_template("/a/{id}/b/{*rest}"), "/a/{p0}/b/{*p1}");
    }
}
