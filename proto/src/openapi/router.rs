//! Request → operation for the `openapi` policy: strips the base path, matches
//! the spec's path templates (matchit, built at snapshot time) and picks the
//! operation by method; a miss is the policy's 404 or 405.

use http::Method;

use super::SpecError;
use super::failure::{Errors, ValidationFailure};
use super::operation::Operation;

pub(super) struct Router {
    /// Path prefixes a request may carry before the spec's templates, longest
    /// first: the spec's base path (`servers[0].url`) and the API's prefix.
    prefixes: Vec<String>,
    paths: matchit::Router<usize>,
    items: Vec<PathItem>,
}

pub(super) struct PathItem {
    /// The template's parameter names by position: templates are stored with
    /// positional names (`{p0}`) because matchit refuses two templates that
    /// name the same position differently (`/a/{id}` and `/a/{aId}/b`).
    names: Vec<String>,
    template: String,
    operations: Vec<(Method, Operation)>,
}

/// The operation a request maps to, with its path parameters by spec name.
pub(super) struct Found<'a, 'p> {
    pub(super) operation: &'a Operation,
    pub(super) params: Vec<(&'a str, &'p str)>,
}

impl Router {
    pub(super) fn new(mut prefixes: Vec<String>) -> Self {
        prefixes.sort_by_key(|p| std::cmp::Reverse(p.len()));
        prefixes.dedup();
        Router { prefixes, paths: matchit::Router::new(), items: Vec::new() }
    }

    pub(super) fn insert(&mut self, template: &str, operations: Vec<(Method, Operation)>) -> Result<(), SpecError> {
        let (route, names) = positional(template)?;
        self.paths
            .insert(route, self.items.len())
            .map_err(|e| SpecError::Route { template: template.to_owned(), reason: e.to_string() })?;
        self.items.push(PathItem { names, template: template.to_owned(), operations });
        Ok(())
    }

    pub(super) fn find<'a, 'p>(&'a self, method: &Method, path: &'p str) -> Result<Found<'a, 'p>, ValidationFailure> {
        let matched = self.relative(path).and_then(|relative| {
            self.paths.at(relative).ok().or_else(|| {
                // `/products/` is `/products`: clients and the Fruitshop's own links add the slash.
                let trimmed = relative.strip_suffix('/').filter(|t| !t.is_empty())?;
                self.paths.at(trimmed).ok()
            })
        });
        let Some(matched) = matched else {
            let mut errors = Errors::default();
            errors.add("REQUEST/PATH", format!("no path of the API specification matches {path}"));
            return Err(ValidationFailure::request(http::StatusCode::NOT_FOUND, method, None, errors));
        };
        let Some(item) = self.items.get(*matched.value) else {
            // Cannot happen: values are indexes into `items`, pushed together.
            return Err(ValidationFailure::request(http::StatusCode::NOT_FOUND, method, None, Errors::default()));
        };
        let operation = item.operations.iter().find(|(m, _)| m == method).or_else(|| {
            // HEAD is GET without the body unless the spec says otherwise.
            (method == Method::HEAD).then(|| item.operations.iter().find(|(m, _)| m == Method::GET)).flatten()
        });
        let Some((_, operation)) = operation else {
            let allow = item.operations.iter().map(|(m, _)| m.clone()).collect();
            return Err(ValidationFailure::method_not_allowed(method, &item.template, allow));
        };
        let params = matched
            .params
            .iter()
            .filter_map(|(key, value)| {
                let index: usize = key.strip_prefix('p')?.parse().ok()?;
                Some((item.names.get(index)?.as_str(), value))
            })
            .collect();
        Ok(Found { operation, params })
    }

    /// The request path below the first prefix it carries, at a segment boundary.
    fn relative<'p>(&self, path: &'p str) -> Option<&'p str> {
        self.prefixes.iter().find_map(|prefix| {
            let rest = path.strip_prefix(prefix.as_str())?;
            match rest {
                "" => Some("/"),
                _ if rest.starts_with('/') => Some(rest),
                _ => None,
            }
        })
    }
}

/// `/products/{id}/image` → (`/products/{p0}/image`, [`id`]).
fn positional(template: &str) -> Result<(String, Vec<String>), SpecError> {
    let invalid = |reason: &str| SpecError::Route { template: template.to_owned(), reason: reason.to_owned() };
    let mut route = String::with_capacity(template.len() + 1);
    if !template.starts_with('/') {
        route.push('/');
    }
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        if rest.as_bytes()[open] == b'}' {
            return Err(invalid("unbalanced `}`"));
        }
        route.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| invalid("unclosed `{`"))?;
        let name = &after[..close];
        if name.is_empty() || name.contains('{') {
            return Err(invalid("bad parameter name"));
        }
        route.push_str(&format!("{{p{}}}", names.len()));
        names.push(name.to_owned());
        rest = &after[close + 1..];
    }
    route.push_str(rest);
    Ok((route, names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positional_table() {
        let cases = [
            ("/products", Some(("/products", vec![]))),
            ("/products/{id}/image", Some(("/products/{p0}/image", vec!["id"]))),
            ("/a/{x}/b/{y}", Some(("/a/{p0}/b/{p1}", vec!["x", "y"]))),
            ("nolead", Some(("/nolead", vec![]))),
            ("/a/{x", None),
            ("/a/x}", None),
            ("/a/{}", None),
        ];
        for (template, expected) in cases {
            let got = positional(template).ok();
            let expected = expected.map(|(r, n)| (r.to_owned(), n.into_iter().map(str::to_owned).collect::<Vec<_>>()));
            assert_eq!(got, expected, "{template}");
        }
    }
}
