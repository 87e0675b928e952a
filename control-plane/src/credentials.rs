//! Credential primitives: the admin API hashes consumer passwords and API keys here before the store sees them, and
//! the token checks (admin bearer, cluster token) compare through here, so no secret is kept or compared in the clear.

use argon2::password_hash::phc::PasswordHash;
use argon2::{Argon2, PasswordHasher as _, PasswordVerifier as _};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac as _};
use rand::RngCore as _;
use sha2::Sha256;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CredentialError {
    #[error("password hashing failed: {0}")]
    Hash(String),
}

/// Argon2id with the crate's default (OWASP-recommended) cost; the PHC string carries salt and parameters, so
/// raising the cost later leaves old hashes verifiable.
pub fn hash_password(password: &str) -> Result<String, CredentialError> {
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|hash| hash.to_string())
        .map_err(|e| CredentialError::Hash(e.to_string()))
}

/// False for a wrong password and for a stored value that is not a PHC string: either way, no access.
pub fn verify_password(password: &str, phc: &str) -> bool {
    let Ok(hash) = PasswordHash::new(phc) else {
        return false;
    };
    Argon2::default().verify_password(password.as_bytes(), &hash).is_ok()
}

/// API keys are long random strings, so a keyed fast hash is enough and keeps lookups by digest possible; the key
/// stops a leaked table from being checked against guesses offline.
pub fn api_key_digest(hmac_key: &[u8], api_key: &str) -> String {
    // HMAC accepts keys of any length, so new_from_slice cannot fail here.
    let mut mac = match Hmac::<Sha256>::new_from_slice(hmac_key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(api_key.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// 256 bits from the OS-seeded CSPRNG, URL-safe so it can sit in headers, URLs and env vars unquoted.
pub fn generate_token() -> String {
    URL_SAFE_NO_PAD.encode(random_bytes::<32>())
}

pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rand::rng().fill_bytes(&mut out);
    out
}

/// Time depends only on the lengths, never on where the first difference is, so a bearer token cannot be guessed
/// byte by byte from response timing.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    // aws-lc's CRYPTO_memcmp, which the optimiser cannot turn back into an early-exit loop.
    aws_lc_rs::constant_time::verify_slices_are_equal(a, b).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_hash_round_trip() {
        let phc = hash_password("correct horse").unwrap();
        assert!(phc.starts_with("$argon2id$"), "{phc}");
        assert!(!phc.contains("correct horse"));
        assert!(verify_password("correct horse", &phc));
        assert!(!verify_password("correct horsE", &phc));
        assert!(!verify_password("", &phc));
        assert_ne!(hash_password("correct horse").unwrap(), phc, "each hash needs its own salt");
    }

    #[test]
    fn verify_rejects_garbage_hashes() {
        for stored in ["", "plaintext", "$argon2id$", "$argon2id$v=19$m=19456,t=2,p=1$bad$bad"] {
            assert!(!verify_password("plaintext", stored), "{stored:?}");
        }
    }

    #[test]
    fn api_key_digest_is_keyed_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            api_key_digest(b"Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_ne!(api_key_digest(b"k1", "key"), api_key_digest(b"k2", "key"));
        assert_eq!(api_key_digest(b"", "key").len(), 64);
    }

    #[test]
    fn tokens_are_random_and_url_safe() {
        let a = generate_token();
        let b = generate_token();
        assert_ne!(a, b);
        assert_eq!(a.len(), 43, "32 bytes in unpadded base64");
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'), "{a}");
        assert_eq!(URL_SAFE_NO_PAD.decode(&a).unwrap().len(), 32);
    }

    #[test]
    fn random_bytes_differ() {
        assert_ne!(random_bytes::<16>(), random_bytes::<16>());
        assert_eq!(random_bytes::<0>(), [0u8; 0]);
    }

    #[test]
    fn constant_time_eq_cases() {
        let cases: [(&[u8], &[u8], bool); 5] = [
            (b"", b"", true),
            (b"abc", b"abc", true),
            (b"abc", b"abd", false),
            (b"abc", b"ab", false),
            (b"", b"a", false),
        ];
        for (a, b, want) in cases {
            assert_eq!(constant_time_eq(a, b), want, "{a:?} vs {b:?}");
        }
    }
}
