//! The local snapshot cache (`--snapshot-cache FILE`): the sync client writes
//! every snapshot it swaps in, and start-up reads it back so that a node
//! restarted while the control plane is unreachable serves its last good
//! configuration instead of 404s.
//!
//! A snapshot holds every secret the node uses (JWT secrets, TLS private
//! keys, the API-key HMAC key), so the file is written 0600 and sealed with
//! AES-256-GCM under a key derived (HKDF-SHA256) from the cluster token: a
//! copy of the file alone gives nothing away, and a file that does not open
//! whole (other token, truncated, altered, an older release's clear file) is
//! never used.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::hkdf::{HKDF_SHA256, Salt};
use prost::Message;
use sluice_proto::v1::Snapshot;

/// Leads the file; anything else (an older release's clear cache) is not read.
const MAGIC: &[u8; 4] = b"SLC1";
const HEADER: usize = MAGIC.len() + NONCE_LEN;
const HKDF_SALT: &[u8] = b"sluice snapshot cache";
const HKDF_INFO: &[u8] = b"sluice snapshot cache key v1";

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("reading snapshot cache {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("writing snapshot cache {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("snapshot cache {path} is not a sealed snapshot cache (written by an older release, or not a cache)")]
    NotSealed { path: PathBuf },
    #[error("snapshot cache {path} cannot be opened: written with another cluster token, or truncated or altered")]
    Open { path: PathBuf },
    #[error("snapshot cache {path} is not a snapshot: {source}")]
    Decode { path: PathBuf, source: prost::DecodeError },
    #[error("snapshot cache {path} is corrupt: content hash {actual} does not match recorded hash {recorded:?}")]
    HashMismatch { path: PathBuf, recorded: String, actual: String },
}

/// The key the cache is sealed with, derived from the cluster token.
pub struct CacheKey(LessSafeKey);

impl std::fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheKey(..)")
    }
}

impl CacheKey {
    pub fn derive(cluster_token: &str) -> Self {
        let mut key = [0u8; 32];
        let prk = Salt::new(HKDF_SHA256, HKDF_SALT).extract(cluster_token.as_bytes());
        // HKDF-Expand fails only for outputs longer than 255 hashes; 32 bytes is one.
        #[allow(clippy::expect_used)]
        prk.expand(&[HKDF_INFO], HKDF_SHA256).and_then(|okm| okm.fill(&mut key)).expect("HKDF-SHA256 yields 32 bytes");
        #[allow(clippy::expect_used)]
        let unbound = UnboundKey::new(&AES_256_GCM, &key).expect("AES-256 takes a 32-byte key");
        Self(LessSafeKey::new(unbound))
    }
}

/// Reads the cached snapshot; `Ok(None)` when there is no file yet. A file
/// that does not open is an error, never a partly read snapshot: AES-GCM
/// refuses any change, and the content hash is checked after decoding.
pub fn load(path: &Path, key: &CacheKey) -> Result<Option<Snapshot>, CacheError> {
    let mut bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CacheError::Read { path: path.to_owned(), source }),
    };
    if !bytes.starts_with(MAGIC) || bytes.len() < HEADER + AES_256_GCM.tag_len() {
        return Err(CacheError::NotSealed { path: path.to_owned() });
    }
    let (header, sealed) = bytes.split_at_mut(HEADER);
    let nonce = Nonce::try_assume_unique_for_key(&header[MAGIC.len()..])
        .map_err(|_| CacheError::Open { path: path.to_owned() })?;
    let plain =
        key.0.open_in_place(nonce, Aad::from(MAGIC), sealed).map_err(|_| CacheError::Open { path: path.to_owned() })?;
    let snapshot = Snapshot::decode(&*plain).map_err(|source| CacheError::Decode { path: path.to_owned(), source })?;
    let actual = sluice_proto::content_hash(&snapshot);
    if actual != snapshot.hash {
        return Err(CacheError::HashMismatch { path: path.to_owned(), recorded: snapshot.hash, actual });
    }
    Ok(Some(snapshot))
}

/// Seals the snapshot into a file next to `path` (0600) and renames it into
/// place, so that a crash mid-write leaves the previous cache intact rather
/// than a torn file.
pub fn store(path: &Path, snapshot: &Snapshot, key: &CacheKey) -> Result<(), CacheError> {
    let write_err = |source| CacheError::Write { path: path.to_owned(), source };
    let mut tmp_name = path.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "snapshot".into());
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);

    let nonce: [u8; NONCE_LEN] = rand::random();
    let mut sealed = Vec::with_capacity(HEADER + snapshot.encoded_len() + AES_256_GCM.tag_len());
    sealed.extend_from_slice(MAGIC);
    sealed.extend_from_slice(&nonce);
    snapshot.encode_raw(&mut sealed);
    let tag = key
        .0
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(MAGIC), &mut sealed[HEADER..])
        .map_err(|_| write_err(std::io::Error::other("sealing failed")))?;
    sealed.extend_from_slice(tag.as_ref());

    let result = (|| {
        let _ = std::fs::remove_file(&tmp);
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        file.write_all(&sealed)?;
        // fsync before rename: otherwise a power cut can leave the new name
        // pointing at an empty file.
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::v1::{Api, Upstream};

    fn snapshot() -> Snapshot {
        let mut s = Snapshot {
            version: 7,
            apis: vec![Api { name: "a".into(), path_prefix: "/".into(), upstream: "u".into(), ..Default::default() }],
            upstreams: vec![Upstream { name: "u".into(), ..Default::default() }],
            ..Default::default()
        };
        sluice_proto::canonicalize(&mut s);
        s.hash = sluice_proto::content_hash(&s);
        s
    }

    fn key() -> CacheKey {
        CacheKey::derive("cluster-token")
    }

    #[test]
    fn round_trip_sealed_and_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.pb");
        assert!(load(&path, &key()).unwrap().is_none());
        let mut secret = snapshot();
        secret.api_key_hmac_key = b"hmac-key-in-the-snapshot".to_vec();
        secret.hash = sluice_proto::content_hash(&secret);
        // An older release's file, readable by all, is replaced by a private one.
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        store(&path, &secret, &key()).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let bytes = std::fs::read(&path).unwrap();
        assert!(!bytes.windows(8).any(|w| w == b"hmac-key"), "the cache holds the snapshot in clear");
        assert_eq!(load(&path, &key()).unwrap(), Some(secret));
        // Overwrite leaves no temp file behind.
        let mut newer = snapshot();
        newer.version = 8;
        store(&path, &newer, &key()).unwrap();
        assert_eq!(load(&path, &key()).unwrap().map(|s| s.version), Some(8));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn files_that_do_not_open_whole_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.pb");
        store(&path, &snapshot(), &key()).unwrap();
        assert!(matches!(load(&path, &CacheKey::derive("another-token")), Err(CacheError::Open { .. })));
        let sealed = std::fs::read(&path).unwrap();
        for cut in [sealed.len() - 1, HEADER + 3, 5] {
            std::fs::write(&path, &sealed[..cut]).unwrap();
            assert!(load(&path, &key()).is_err(), "cut at {cut}");
        }
        let mut flipped = sealed.clone();
        flipped[HEADER + 2] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        assert!(matches!(load(&path, &key()), Err(CacheError::Open { .. })));
        // An older release's clear cache, and garbage.
        std::fs::write(&path, snapshot().encode_to_vec()).unwrap();
        assert!(matches!(load(&path, &key()), Err(CacheError::NotSealed { .. })));
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(load(&path, &key()), Err(CacheError::NotSealed { .. })));
    }

    #[test]
    fn unwritable_path_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("cache.pb");
        assert!(matches!(store(&path, &snapshot(), &key()), Err(CacheError::Write { .. })));
    }
}
