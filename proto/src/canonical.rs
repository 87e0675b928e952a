//! Canonical order and content hash of a snapshot: two snapshots with the same
//! configuration hash the same whatever order the store returned rows in, so a
//! data plane can skip a snapshot it already runs.

use prost::Message;
use sha2::{Digest, Sha256};

use crate::v1::Snapshot;

/// Sorts every named list by name. An API's policy list is left alone: its
/// order is the order the policies run in.
pub fn canonicalize(snapshot: &mut Snapshot) {
    snapshot.apis.sort_by(|a, b| a.name.cmp(&b.name));
    snapshot.upstreams.sort_by(|a, b| a.name.cmp(&b.name));
    snapshot.consumers.sort_by(|a, b| a.username.cmp(&b.username));
    snapshot.specs.sort_by(|a, b| a.name.cmp(&b.name));
    snapshot.certificates.sort_by(|a, b| a.name.cmp(&b.name));
}

/// Hex SHA-256 of the snapshot's content, ignoring `version` and `hash`.
/// The snapshot must be canonicalized first.
pub fn content_hash(snapshot: &Snapshot) -> String {
    let mut content = snapshot.clone();
    content.version = 0;
    content.hash.clear();
    hex::encode(Sha256::digest(content.encode_to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{Api, Upstream};

    fn api(name: &str) -> Api {
        Api { name: name.into(), path_prefix: "/".into(), ..Default::default() }
    }

    #[test]
    fn hash_ignores_row_order_and_version() {
        let mut a = Snapshot { version: 1, apis: vec![api("b"), api("a")], ..Default::default() };
        let mut b = Snapshot { version: 9, apis: vec![api("a"), api("b")], ..Default::default() };
        canonicalize(&mut a);
        canonicalize(&mut b);
        assert_eq!(content_hash(&a), content_hash(&b));
    }

    #[test]
    fn hash_changes_with_content() {
        let a = Snapshot { upstreams: vec![Upstream { name: "u".into(), ..Default::default() }], ..Default::default() };
        let mut b = a.clone();
        b.upstreams[0].http2 = true;
        assert_ne!(content_hash(&a), content_hash(&b));
    }
}
