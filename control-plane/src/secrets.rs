//! Encryption at rest: the store seals certificate private keys, JWT secrets, the API-key HMAC key and every stored
//! snapshot with this box before writing them, and opens them only in memory (to build a snapshot, or to send one
//! to a data plane), so a copy of the database alone does not give the secrets away.

use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use thiserror::Error;

use crate::credentials::random_bytes;

const KEY_LEN: usize = 32;
const PREFIX: &str = "v1:";
/// Binds every ciphertext to this scheme so a value sealed by some other use of the same key cannot be opened here.
const AAD: &[u8] = b"sluice-secret-v1";
/// Leads every sealed blob; a prost-encoded snapshot cannot start with it (its first byte is a field tag).
const BLOB_MAGIC: &[u8; 4] = b"SLB1";
const BLOB_HEADER: usize = BLOB_MAGIC.len() + NONCE_LEN;
/// Blobs (whole snapshots) get their own associated data, so a blob can never be opened as a field value or back.
const BLOB_AAD: &[u8] = b"sluice-blob-v1";

#[derive(Debug, Error)]
pub enum SecretError {
    #[error("secret key must be 32 bytes given as 64 hex digits or base64; got {0}")]
    BadKeyMaterial(String),
    #[error("secret key file {path}: {source}")]
    KeyFile { path: PathBuf, source: std::io::Error },
    #[error("secret key file {path}: {reason}")]
    BadKeyFile { path: PathBuf, reason: String },
    #[error("sealed value is malformed: {0}")]
    Malformed(&'static str),
    /// AES-GCM cannot tell a wrong key from tampered data, and saying which would not be trustworthy anyway.
    #[error("sealed value cannot be opened: wrong secret key, or the data was altered")]
    OpenFailed,
}

/// AES-256-GCM with a random 96-bit nonce per seal. Random nonces stay safe for far more than the number of secrets
/// a gateway will ever seal with one key (the bound is around 2^32 seals).
pub struct SecretBox {
    key: LessSafeKey,
    /// Names the key without revealing it (see [`SecretBox::key_id`]).
    key_id: String,
}

impl std::fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretBox { key: <redacted> }")
    }
}

impl SecretBox {
    /// Accepts the forms people paste into `SLUICE_SECRET_KEY`: hex, or base64 (standard or URL-safe, padded or not).
    pub fn from_key_material(key: &str) -> Result<Self, SecretError> {
        let key = key.trim();
        let bytes = decode_key(key).ok_or_else(|| {
            // Describe the input by shape only: echoing it would leak a near-miss key into logs.
            SecretError::BadKeyMaterial(format!("{} characters that decode to no 32-byte value", key.len()))
        })?;
        Self::from_bytes(&bytes)
    }

    /// Loads the key file, or creates one with a fresh random key (mode 0600) when there is none, so a first start
    /// needs no setup. Losing that file makes every sealed value unreadable, hence the log line naming it.
    pub fn load_or_create(path: &Path) -> Result<Self, SecretError> {
        let io_err = |source| SecretError::KeyFile { path: path.to_owned(), source };
        match fs::read_to_string(path) {
            Ok(text) => return Self::from_file_text(path, &text),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(e)),
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(io_err)?;
        }
        let key = random_bytes::<KEY_LEN>();
        // create_new: if another process raced us to it, use its key instead of overwriting one that may be in use.
        let mut file = match OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                let text = fs::read_to_string(path).map_err(io_err)?;
                return Self::from_file_text(path, &text);
            }
            Err(e) => return Err(io_err(e)),
        };
        file.write_all(format!("{}\n", STANDARD.encode(key)).as_bytes()).map_err(io_err)?;
        file.sync_all().map_err(io_err)?;
        tracing::warn!(
            path = %path.display(),
            "generated a new secret key file for encrypting secrets at rest; back it up or set SLUICE_SECRET_KEY"
        );
        Self::from_bytes(&key)
    }

    /// Writes `key` (already checked by [`SecretBox::from_key_material`]) as the key file, replacing the old one
    /// atomically: written beside it (0600), then renamed over it.
    pub fn replace_key_file(path: &Path, key: &str) -> Result<(), SecretError> {
        let io_err = |source| SecretError::KeyFile { path: path.to_owned(), source };
        let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        name.push(".new");
        let fresh = path.with_file_name(name);
        let _ = fs::remove_file(&fresh);
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&fresh).map_err(io_err)?;
        file.write_all(format!("{}\n", key.trim()).as_bytes()).map_err(io_err)?;
        file.sync_all().map_err(io_err)?;
        fs::rename(&fresh, path).map_err(io_err)
    }

    fn from_file_text(path: &Path, text: &str) -> Result<Self, SecretError> {
        if let Ok(meta) = fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(path = %path.display(), "secret key file is readable by group or others; chmod 600 it");
        }
        Self::from_key_material(text)
            .map_err(|e| SecretError::BadKeyFile { path: path.to_owned(), reason: e.to_string() })
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, SecretError> {
        let unbound = UnboundKey::new(&AES_256_GCM, bytes)
            .map_err(|_| SecretError::BadKeyMaterial(format!("{} bytes", bytes.len())))?;
        let id =
            aws_lc_rs::hmac::sign(&aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, bytes), b"sluice key id");
        Ok(Self { key: LessSafeKey::new(unbound), key_id: hex::encode(&id.as_ref()[..8]) })
    }

    /// A short name of the key: an HMAC of a fixed text under it. The store records the id of the key its secrets
    /// are sealed with, so a control plane started with another key (or left running after a rotation) is told
    /// so instead of failing later on a value it cannot open.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Seals what `write` appends to a buffer, in place: `"SLB1" || nonce || ciphertext || tag`. For large values
    /// (encoded snapshots), which are neither copied nor base64-encoded. `size_hint` is the expected plaintext length.
    ///
    /// # Panics
    /// Only if the plaintext is larger than AES-GCM's limit of about 64 GiB.
    pub fn seal_blob(&self, size_hint: usize, write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let nonce = random_bytes::<NONCE_LEN>();
        let mut blob = Vec::with_capacity(BLOB_HEADER + size_hint + AES_256_GCM.tag_len());
        blob.extend_from_slice(BLOB_MAGIC);
        blob.extend_from_slice(&nonce);
        write(&mut blob);
        #[allow(clippy::expect_used)]
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(BLOB_AAD),
                &mut blob[BLOB_HEADER..],
            )
            .expect("AES-GCM seal fails only for inputs over 64 GiB");
        blob.extend_from_slice(tag.as_ref());
        blob
    }

    /// Opens a [`seal_blob`](Self::seal_blob) value in place.
    pub fn open_blob(&self, mut blob: Vec<u8>) -> Result<Vec<u8>, SecretError> {
        if !is_sealed_blob(&blob) {
            return Err(SecretError::Malformed("not a sealed blob"));
        }
        if blob.len() < BLOB_HEADER + AES_256_GCM.tag_len() {
            return Err(SecretError::Malformed("too short"));
        }
        let nonce = Nonce::try_assume_unique_for_key(&blob[BLOB_MAGIC.len()..BLOB_HEADER])
            .map_err(|_| SecretError::OpenFailed)?;
        let len = self
            .key
            .open_in_place(nonce, Aad::from(BLOB_AAD), &mut blob[BLOB_HEADER..])
            .map_err(|_| SecretError::OpenFailed)?
            .len();
        blob.truncate(BLOB_HEADER + len);
        blob.drain(..BLOB_HEADER);
        Ok(blob)
    }

    /// Returns `"v1:" + base64(nonce || ciphertext || tag)`.
    ///
    /// # Panics
    /// Only if `plaintext` is larger than AES-GCM's limit of about 64 GiB.
    pub fn seal(&self, plaintext: &[u8]) -> String {
        let nonce_bytes = random_bytes::<NONCE_LEN>();
        let mut buf = Vec::with_capacity(NONCE_LEN + plaintext.len() + AES_256_GCM.tag_len());
        buf.extend_from_slice(&nonce_bytes);
        let mut sealed = plaintext.to_vec();
        #[allow(clippy::expect_used)]
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce_bytes), Aad::from(AAD), &mut sealed)
            .expect("AES-GCM seal fails only for inputs over 64 GiB");
        buf.extend_from_slice(&sealed);
        format!("{PREFIX}{}", STANDARD.encode(buf))
    }

    pub fn open(&self, sealed: &str) -> Result<Vec<u8>, SecretError> {
        let body = sealed.strip_prefix(PREFIX).ok_or(SecretError::Malformed("unknown format (expected \"v1:\")"))?;
        let mut buf = STANDARD.decode(body).map_err(|_| SecretError::Malformed("not base64"))?;
        if buf.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return Err(SecretError::Malformed("too short"));
        }
        let nonce = Nonce::try_assume_unique_for_key(&buf[..NONCE_LEN]).map_err(|_| SecretError::OpenFailed)?;
        let plaintext = self
            .key
            .open_in_place(nonce, Aad::from(AAD), &mut buf[NONCE_LEN..])
            .map_err(|_| SecretError::OpenFailed)?;
        Ok(plaintext.to_vec())
    }
}

/// Whether `bytes` is a sealed blob (as opposed to plaintext written before blobs were sealed).
pub fn is_sealed_blob(bytes: &[u8]) -> bool {
    bytes.starts_with(BLOB_MAGIC)
}

fn decode_key(key: &str) -> Option<Vec<u8>> {
    if key.len() == 2 * KEY_LEN
        && let Ok(bytes) = hex::decode(key)
    {
        return Some(bytes);
    }
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(key).ok())
        .filter(|bytes| bytes.len() == KEY_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_box(fill: u8) -> SecretBox {
        SecretBox::from_key_material(&hex::encode([fill; 32])).unwrap()
    }

    #[test]
    fn round_trip_with_fresh_nonce_each_time() {
        let secret_box = test_box(7);
        for plaintext in [&b""[..], b"jwt-secret", &[0u8; 5000]] {
            let a = secret_box.seal(plaintext);
            let b = secret_box.seal(plaintext);
            assert!(a.starts_with("v1:"));
            assert_ne!(a, b, "each seal must use its own nonce");
            assert_eq!(secret_box.open(&a).unwrap(), plaintext);
            assert_eq!(secret_box.open(&b).unwrap(), plaintext);
        }
    }

    #[test]
    fn key_material_forms() {
        let key = [0xA5u8; 32];
        let sealed = SecretBox::from_key_material(&hex::encode(key)).unwrap().seal(b"x");
        for form in [
            hex::encode_upper(key),
            STANDARD.encode(key),
            STANDARD_NO_PAD.encode(key),
            URL_SAFE_NO_PAD.encode(key),
            format!("  {}\n", STANDARD.encode(key)),
        ] {
            assert_eq!(SecretBox::from_key_material(&form).unwrap().open(&sealed).unwrap(), b"x", "{form}");
        }
        for bad in ["", "short", &hex::encode([1u8; 16]), &STANDARD.encode([1u8; 33]), &"z".repeat(64)] {
            let err = SecretBox::from_key_material(bad).unwrap_err();
            assert!(matches!(err, SecretError::BadKeyMaterial(_)), "{bad:?}: {err:?}");
        }
    }

    #[test]
    fn tampering_and_wrong_key_are_detected() {
        let secret_box = test_box(1);
        let sealed = secret_box.seal(b"private key");
        let mut raw = STANDARD.decode(&sealed[3..]).unwrap();
        for i in [0, NONCE_LEN, raw.len() - 1] {
            raw[i] ^= 1;
            let tampered = format!("v1:{}", STANDARD.encode(&raw));
            assert!(matches!(secret_box.open(&tampered), Err(SecretError::OpenFailed)), "byte {i}");
            raw[i] ^= 1;
        }
        assert!(matches!(test_box(2).open(&sealed), Err(SecretError::OpenFailed)));
        assert!(test_box(2).open(&sealed).unwrap_err().to_string().contains("wrong secret key"));
        for malformed in ["", "v2:AAAA", "v1:!!!", "v1:AAAA", &sealed[..sealed.len() - 8]] {
            assert!(secret_box.open(malformed).is_err(), "{malformed:?}");
        }
    }

    #[test]
    fn blobs_round_trip_and_refuse_tampering_and_other_keys() {
        let secret_box = test_box(3);
        let plaintext = b"\x08\x07 a snapshot with -----BEGIN PRIVATE KEY----- inside".to_vec();
        let blob = secret_box.seal_blob(plaintext.len(), |buf| buf.extend_from_slice(&plaintext));
        assert!(is_sealed_blob(&blob) && !is_sealed_blob(&plaintext));
        assert!(!blob.windows(11).any(|w| w == b"BEGIN PRIVA"), "no plaintext in the blob");
        assert_eq!(secret_box.open_blob(blob.clone()).unwrap(), plaintext);
        assert_ne!(secret_box.seal_blob(0, |buf| buf.extend_from_slice(&plaintext)), blob, "fresh nonce");
        let mut tampered = blob.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(matches!(secret_box.open_blob(tampered), Err(SecretError::OpenFailed)));
        assert!(matches!(test_box(4).open_blob(blob.clone()), Err(SecretError::OpenFailed)));
        assert!(matches!(secret_box.open_blob(plaintext.clone()), Err(SecretError::Malformed(_))));
        // A field value and a blob are not interchangeable.
        let field = secret_box.seal(&plaintext);
        assert!(secret_box.open_blob(field.into_bytes()).is_err());
    }

    #[test]
    fn key_ids_name_keys_without_revealing_them() {
        let (a, b) = (test_box(5), test_box(6));
        assert_eq!(a.key_id(), test_box(5).key_id());
        assert_ne!(a.key_id(), b.key_id());
        assert_eq!(a.key_id().len(), 16);
        assert!(!a.key_id().contains("0505"));
    }

    #[test]
    fn debug_hides_the_key() {
        let key = [0x42u8; 32];
        let printed = format!("{:?}", SecretBox::from_key_material(&hex::encode(key)).unwrap());
        assert!(!printed.contains("42") && printed.contains("redacted"), "{printed}");
    }

    #[test]
    fn key_file_is_created_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/secret.key");
        let first = SecretBox::load_or_create(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let sealed = first.seal(b"kept across restarts");
        let contents = fs::read_to_string(&path).unwrap();

        let second = SecretBox::load_or_create(&path).unwrap();
        assert_eq!(second.open(&sealed).unwrap(), b"kept across restarts");
        assert_eq!(fs::read_to_string(&path).unwrap(), contents, "an existing key file must not be rewritten");

        fs::write(&path, "not a key").unwrap();
        let err = SecretBox::load_or_create(&path).unwrap_err();
        assert!(matches!(err, SecretError::BadKeyFile { .. }), "{err:?}");
        assert!(!err.to_string().contains("not a key"), "{err}");
    }
}
