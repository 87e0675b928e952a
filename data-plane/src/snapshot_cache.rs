//! The local snapshot cache (`--snapshot-cache FILE`): the sync client writes
//! every snapshot it swaps in, and start-up reads it back so that a node
//! restarted while the control plane is unreachable serves its last good
//! configuration instead of 404s.

use std::io::Write;
use std::path::{Path, PathBuf};

use prost::Message;
use sluice_proto::v1::Snapshot;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("reading snapshot cache {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("writing snapshot cache {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("snapshot cache {path} is not a snapshot: {source}")]
    Decode { path: PathBuf, source: prost::DecodeError },
    #[error("snapshot cache {path} is corrupt: content hash {actual} does not match recorded hash {recorded:?}")]
    HashMismatch { path: PathBuf, recorded: String, actual: String },
}

/// Reads the cached snapshot; `Ok(None)` when there is no file yet.
///
/// The file is plain prost encoding, so almost any bytes decode; checking the
/// recorded hash against the content is what catches truncation and garbage.
pub fn load(path: &Path) -> Result<Option<Snapshot>, CacheError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CacheError::Read { path: path.to_owned(), source }),
    };
    let snapshot =
        Snapshot::decode(bytes.as_slice()).map_err(|source| CacheError::Decode { path: path.to_owned(), source })?;
    let actual = sluice_proto::content_hash(&snapshot);
    if actual != snapshot.hash {
        return Err(CacheError::HashMismatch { path: path.to_owned(), recorded: snapshot.hash, actual });
    }
    Ok(Some(snapshot))
}

/// Writes the snapshot next to `path` and renames it into place, so that a
/// crash mid-write leaves the previous cache intact rather than a torn file.
pub fn store(path: &Path, snapshot: &Snapshot) -> Result<(), CacheError> {
    let write_err = |source| CacheError::Write { path: path.to_owned(), source };
    let mut tmp_name = path.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "snapshot".into());
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);

    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&snapshot.encode_to_vec())?;
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

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.pb");
        assert!(load(&path).unwrap().is_none());
        store(&path, &snapshot()).unwrap();
        assert_eq!(load(&path).unwrap(), Some(snapshot()));
        // Overwrite leaves no temp file behind.
        let mut newer = snapshot();
        newer.version = 8;
        store(&path, &newer).unwrap();
        assert_eq!(load(&path).unwrap().map(|s| s.version), Some(8));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn corrupt_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.pb");

        std::fs::write(&path, b"\xff\xff\xff\xff not protobuf").unwrap();
        assert!(load(&path).is_err());

        let bytes = snapshot().encode_to_vec();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert!(load(&path).is_err());

        std::fs::write(&path, b"").unwrap();
        assert!(matches!(load(&path), Err(CacheError::HashMismatch { .. })));
    }

    #[test]
    fn unwritable_path_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("cache.pb");
        assert!(matches!(store(&path, &snapshot()), Err(CacheError::Write { .. })));
    }
}
