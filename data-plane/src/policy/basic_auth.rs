//! `basic_auth`, one of the authentication steps of the policy chain:
//! `Authorization: Basic` checked against consumers' argon2 hashes. Argon2 is
//! slow on purpose, so each good credential is verified once (on the shared
//! password pool, `password`) and then remembered by a keyed digest; the hot
//! path for a known client costs one HMAC and one map lookup, like an API
//! key. A username that failed too often is refused before any hash runs
//! (`auth_failures`), and an unknown username costs what a known one does.
//! Requests that bring the same credential while it is being verified wait
//! for that one run (see [`LoginCache::verified`]).

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac as _};
use http::HeaderValue;
use sha2::Sha256;
use sluice_proto::v1;
use smallvec::SmallVec;
use tokio::sync::watch;

use super::auth_failures::{LoginGuard, Subject};
use super::password::{Busy, StoredHash};
use crate::fast_map::FastMap;

/// Verified credentials remembered per process. At 10,000 distinct good
/// credentials the oldest-known is not tracked; an arbitrary one is dropped
/// instead, which only costs that client one more argon2 run.
const CACHE_CAPACITY: usize = 10_000;

#[derive(Debug)]
struct User {
    name: Arc<str>,
    phc: Arc<str>,
    hash: Arc<StoredHash>,
}

/// Why a password was not checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotChecked {
    /// The username failed too often lately; retry after this long.
    Limited(Duration),
    /// The password pool is full.
    Busy,
}

impl From<Busy> for NotChecked {
    fn from(_: Busy) -> Self {
        NotChecked::Busy
    }
}

/// What `Authorization: Basic ...` carried.
#[derive(Debug, PartialEq, Eq)]
pub enum Presented {
    /// `user:password` as decoded (the password may be any bytes).
    Credentials(Credentials),
    /// The Basic scheme with a value that is not base64 `user:password`.
    Malformed,
}

/// Decoded `user:password`, on the stack up to a length no usual
/// credential reaches: decoding costs no allocation per request.
pub type Credentials = SmallVec<[u8; 96]>;

#[derive(Debug)]
pub struct BasicAuth {
    challenge: HeaderValue,
    users: FastMap<String, Arc<User>>,
    /// Checked for unknown usernames, at the cost of the known ones.
    decoy: Arc<StoredHash>,
    cache: Arc<LoginCache>,
}

impl BasicAuth {
    /// `previous` hands over the verified-credential cache, so a snapshot
    /// swap does not send every client through argon2 again. That is safe
    /// because a cache entry only counts while the consumer's current hash is
    /// the one it was verified against.
    pub fn compile(
        spec: &v1::BasicAuth,
        api: &str,
        consumers: &[v1::Consumer],
        previous: Option<&BasicAuth>,
    ) -> Result<Self, String> {
        let realm = if spec.realm.is_empty() { api } else { spec.realm.as_str() };
        let challenge =
            HeaderValue::from_str(&format!("Basic realm=\"{}\", charset=\"UTF-8\"", realm.replace('"', "'")))
                .map_err(|_| format!("realm `{realm}` cannot be sent in a header"))?;
        let mut users = FastMap::default();
        let mut decoy = None;
        for consumer in consumers.iter().filter(|c| !c.basic_auth_password_hash.is_empty()) {
            let hash = StoredHash::parse(&consumer.basic_auth_password_hash)
                .map_err(|e| format!("consumer `{}`: {e}", consumer.username))?;
            decoy.get_or_insert_with(|| hash.decoy_like());
            let user = User {
                name: consumer.username.as_str().into(),
                phc: consumer.basic_auth_password_hash.as_str().into(),
                hash: Arc::new(hash),
            };
            users.insert(consumer.username.clone(), Arc::new(user));
        }
        let decoy = Arc::new(decoy.unwrap_or_else(StoredHash::default_decoy));
        let cache = previous.map_or_else(|| Arc::new(LoginCache::new()), |p| p.cache.clone());
        Ok(BasicAuth { challenge, users, decoy, cache })
    }

    pub fn challenge(&self) -> &HeaderValue {
        &self.challenge
    }

    /// `None` when the Authorization header is not of the Basic scheme: then
    /// the client presented no basic credentials at all.
    pub fn presented(authorization: &HeaderValue) -> Option<Presented> {
        let text = authorization.to_str().ok()?;
        let (scheme, token) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        let token = token.trim();
        let mut decoded = Credentials::from_elem(0, base64::decoded_len_estimate(token.len()));
        match STANDARD.decode_slice(token, &mut decoded) {
            Ok(length) if decoded[..length].contains(&b':') => {
                decoded.truncate(length);
                Some(Presented::Credentials(decoded))
            }
            _ => Some(Presented::Malformed),
        }
    }

    /// The consumer whose password this is, `None` for wrong credentials.
    /// A credential verified before passes on its digest alone; otherwise a
    /// username past its failure limit is refused before argon2 runs, and
    /// an unknown username runs argon2 on the decoy, so that timing does not
    /// tell which usernames exist. Failures are never cached: a cache of bad
    /// guesses would only help a guesser.
    pub async fn verify(&self, credentials: &[u8], guard: &LoginGuard) -> Result<Option<Arc<str>>, NotChecked> {
        let Some(colon) = credentials.iter().position(|b| *b == b':') else { return Ok(None) };
        let username = &credentials[..colon];
        let user = std::str::from_utf8(username).ok().and_then(|name| self.users.get(name));
        let digest = self.cache.digest(credentials);
        if let Some(user) = user
            && self.cache.knows(&digest, &user.phc)
        {
            return Ok(Some(user.name.clone()));
        }
        if let Some(retry) = guard.failures.retry_after(Subject::Username(username)) {
            return Err(NotChecked::Limited(retry));
        }
        let hash = user.map_or_else(|| self.decoy.clone(), |user| user.hash.clone());
        let good = user.map(|user| &user.phc);
        let matched = self.cache.verified(digest, hash, good, || credentials[colon + 1..].to_vec(), guard).await?;
        match user {
            Some(user) if matched => Ok(Some(user.name.clone())),
            _ => {
                guard.failures.record(Subject::Username(username));
                Ok(None)
            }
        }
    }
}

/// Digests of credentials that passed argon2, each with the hash it passed
/// against. Keyed by HMAC under a per-process random key, so the map holds
/// nothing an attacker could test guesses against if memory leaked.
pub struct LoginCache {
    /// Keyed once: cloning the keyed state skips hashing the key's pads per request.
    mac: Hmac<Sha256>,
    /// Not SipHash: a key is an HMAC under the process's secret key, so no
    /// client can choose keys that collide.
    entries: RwLock<FastMap<[u8; 32], Arc<str>>>,
    /// Verifications under way, by the same digests.
    running: Mutex<FastMap<[u8; 32], Running>>,
}

/// One argon2 run under way, which requests bringing the same credential
/// wait for.
struct Running {
    /// What it checks against: a request whose snapshot has another hash for
    /// the user (the password changed meanwhile) runs its own.
    hash: Arc<StoredHash>,
    /// `None` until it ends.
    outcome: watch::Receiver<Option<Result<bool, Busy>>>,
}

/// What a request does about a credential not known yet.
enum Turn {
    Wait(watch::Receiver<Option<Result<bool, Busy>>>),
    Run(Publisher),
}

/// The run's end, told to those waiting for it. Dropped without telling (the
/// request that ran it went away), it still leaves the table, and each one
/// waiting then runs it again in turn.
struct Publisher {
    cache: Arc<LoginCache>,
    digest: [u8; 32],
    outcome: watch::Sender<Option<Result<bool, Busy>>>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let mut running = lock(&self.cache.running);
        if running.get(&self.digest).is_some_and(|run| run.outcome.same_channel(&self.outcome.subscribe())) {
            running.remove(&self.digest);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl std::fmt::Debug for LoginCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let size = self.entries.read().map_or(0, |e| e.len());
        f.debug_struct("LoginCache").field("entries", &size).finish_non_exhaustive()
    }
}

impl LoginCache {
    fn new() -> Self {
        let mac = match Hmac::<Sha256>::new_from_slice(&rand::random::<[u8; 32]>()) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC takes keys of any length"),
        };
        LoginCache { mac, entries: RwLock::default(), running: Mutex::default() }
    }

    /// Whether the password of the credential of `digest` matches `hash`,
    /// by argon2 on the pool; a match against `good` (the user's current
    /// hash; `None` for the decoy) is remembered before anyone hears of it.
    ///
    /// Argon2 runs once for a credential however many requests bring it at
    /// once. A data plane that has just started, or a client that opens many
    /// connections together, sends a burst of requests with one credential
    /// nobody has verified yet; one run each would take a core for seconds
    /// and fill the pool's queue, so the rest of the burst, and every other
    /// client's login, would be refused as busy.
    async fn verified(
        self: &Arc<Self>,
        digest: [u8; 32],
        hash: Arc<StoredHash>,
        good: Option<&Arc<str>>,
        password: impl Fn() -> Vec<u8>,
        guard: &LoginGuard,
    ) -> Result<bool, Busy> {
        loop {
            let publisher = match self.turn(digest, &hash) {
                Turn::Wait(mut outcome) => match outcome.wait_for(Option::is_some).await.ok().and_then(|told| *told) {
                    Some(outcome) => return outcome,
                    // The run ended untold: try again, perhaps running it now.
                    None => continue,
                },
                Turn::Run(publisher) => publisher,
            };
            let outcome = guard.passwords.verify(hash.clone(), password()).await;
            if let (Ok(true), Some(phc)) = (outcome, good) {
                self.remember(digest, phc.clone());
            }
            // Nobody may be waiting: nothing to tell then.
            let _ = publisher.outcome.send(Some(outcome));
            return outcome;
        }
    }

    fn turn(self: &Arc<Self>, digest: [u8; 32], hash: &Arc<StoredHash>) -> Turn {
        let mut running = lock(&self.running);
        if let Some(run) = running.get(&digest)
            && Arc::ptr_eq(&run.hash, hash)
        {
            return Turn::Wait(run.outcome.clone());
        }
        // Another run for this credential, against another hash, is left to
        // finish untouched: its Publisher removes only its own entry.
        let (outcome, receiver) = watch::channel(None);
        running.insert(digest, Running { hash: hash.clone(), outcome: receiver });
        Turn::Run(Publisher { cache: self.clone(), digest, outcome })
    }

    fn digest(&self, credentials: &[u8]) -> [u8; 32] {
        let mut mac = self.mac.clone();
        mac.update(credentials);
        mac.finalize().into_bytes().into()
    }

    /// True when this credential passed against `phc`, the user's current
    /// hash: a changed password makes old entries useless at once.
    fn knows(&self, digest: &[u8; 32], phc: &Arc<str>) -> bool {
        let Ok(entries) = self.entries.read() else { return false };
        entries.get(digest).is_some_and(|known| Arc::ptr_eq(known, phc) || known == phc)
    }

    fn remember(&self, digest: [u8; 32], phc: Arc<str>) {
        let Ok(mut entries) = self.entries.write() else { return };
        if entries.len() >= CACHE_CAPACITY
            && !entries.contains_key(&digest)
            && let Some(victim) = entries.keys().next().copied()
        {
            entries.remove(&victim);
        }
        entries.insert(digest, phc);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.read().map_or(0, |e| e.len())
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)]
mod tests {
    use super::*;
    use crate::policy::auth_failures::AuthFailures;
    use crate::policy::password::VerifierPool;
    use argon2::{Argon2, PasswordHasher as _};

    fn phc(password: &str) -> String {
        // Cheap parameters keep the test fast; verification reads them from the PHC string.
        let params = argon2::Params::new(1024, 1, 1, None).unwrap();
        let argon = Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        argon.hash_password(password.as_bytes()).unwrap().to_string()
    }

    fn consumer(name: &str, hash: String) -> v1::Consumer {
        v1::Consumer { username: name.into(), basic_auth_password_hash: hash, ..Default::default() }
    }

    /// The verdict alone, under a generous failure limit.
    async fn check(auth: &BasicAuth, credentials: &[u8]) -> Option<Arc<str>> {
        static GUARD: std::sync::OnceLock<LoginGuard> = std::sync::OnceLock::new();
        let guard = GUARD.get_or_init(|| LoginGuard {
            failures: Arc::new(AuthFailures::new(1_000, Duration::from_secs(60))),
            ..LoginGuard::default()
        });
        auth.verify(credentials, guard).await.unwrap()
    }

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    #[test]
    fn presented_table() {
        let ok = format!("Basic {}", STANDARD.encode("ann:s3cr:et"));
        let long_credentials = format!("ann:{}", "p".repeat(200));
        let long = format!("Basic {}", STANDARD.encode(&long_credentials));
        let cases: Vec<(String, Option<Presented>)> = vec![
            (ok.clone(), Some(Presented::Credentials(Credentials::from_slice(b"ann:s3cr:et")))),
            (ok.replace("Basic", "basic"), Some(Presented::Credentials(Credentials::from_slice(b"ann:s3cr:et")))),
            // Longer than the stack room: the same, from the heap.
            (long.clone(), Some(Presented::Credentials(Credentials::from_slice(long_credentials.as_bytes())))),
            ("Basic !!!".into(), Some(Presented::Malformed)),
            (format!("Basic {}", STANDARD.encode("no-colon")), Some(Presented::Malformed)),
            ("Basic".into(), Some(Presented::Malformed)),
            ("Bearer abc.def.ghi".into(), None),
            ("garbage".into(), None),
        ];
        for (value, want) in cases {
            assert_eq!(BasicAuth::presented(&header(&value)), want, "{value}");
        }
    }

    #[tokio::test]
    async fn verify_table_and_cache() {
        let consumers =
            vec![consumer("ann", phc("right")), consumer("bob", phc("other")), consumer("nopass", String::new())];
        let auth = BasicAuth::compile(&v1::BasicAuth::default(), "shop", &consumers, None).unwrap();
        assert_eq!(auth.challenge(), "Basic realm=\"shop\", charset=\"UTF-8\"");
        let cases: &[(&[u8], Option<&str>)] = &[
            (b"ann:right", Some("ann")),
            (b"ann:wrong", None),
            (b"bob:right", None),
            (b"bob:other", Some("bob")),
            (b"nobody:right", None),
            (b"nopass:", None),
            (b"ann:", None),
        ];
        for (credentials, want) in cases {
            let got = check(&auth, credentials).await;
            assert_eq!(got.as_deref(), *want, "{}", String::from_utf8_lossy(credentials));
        }
        // Only good credentials are remembered.
        assert_eq!(auth.cache.len(), 2);
        assert_eq!(check(&auth, b"ann:right").await.as_deref(), Some("ann"));
    }

    #[tokio::test]
    async fn cache_survives_swap_but_not_a_password_change() {
        let first = BasicAuth::compile(&v1::BasicAuth::default(), "a", &[consumer("ann", phc("old"))], None).unwrap();
        assert!(check(&first, b"ann:old").await.is_some());

        // Same hash in the next snapshot: the entry is carried over and used.
        let same_hash = first.users["ann"].phc.to_string();
        let second =
            BasicAuth::compile(&v1::BasicAuth::default(), "a", &[consumer("ann", same_hash)], Some(&first)).unwrap();
        assert!(Arc::ptr_eq(&first.cache, &second.cache));
        let digest = second.cache.digest(b"ann:old");
        assert!(second.cache.knows(&digest, &second.users["ann"].phc));

        // Password changed: the cached entry no longer counts and argon2 says no.
        let third =
            BasicAuth::compile(&v1::BasicAuth::default(), "a", &[consumer("ann", phc("new"))], Some(&second)).unwrap();
        assert!(!third.cache.knows(&digest, &third.users["ann"].phc));
        assert!(check(&third, b"ann:old").await.is_none());
        assert!(check(&third, b"ann:new").await.is_some());
    }

    #[tokio::test]
    async fn a_guessed_username_is_limited_before_argon2_but_a_known_credential_passes() {
        let auth = BasicAuth::compile(&v1::BasicAuth::default(), "a", &[consumer("ann", phc("right"))], None).unwrap();
        let guard =
            LoginGuard { failures: Arc::new(AuthFailures::new(2, Duration::from_secs(60))), ..LoginGuard::default() };
        assert_eq!(auth.verify(b"ann:right", &guard).await, Ok(Some("ann".into())));
        for guess in [b"ann:one" as &[u8], b"ann:two"] {
            assert_eq!(auth.verify(guess, &guard).await, Ok(None));
        }
        assert!(matches!(auth.verify(b"ann:three", &guard).await, Err(NotChecked::Limited(_))));
        // The owner, verified before, is not locked out by the guesser.
        assert_eq!(auth.verify(b"ann:right", &guard).await, Ok(Some("ann".into())));
        // Unknown usernames are counted the same way.
        for _ in 0..2 {
            assert_eq!(auth.verify(b"nobody:x", &guard).await, Ok(None));
        }
        assert!(matches!(auth.verify(b"nobody:x", &guard).await, Err(NotChecked::Limited(_))));
    }

    /// A guard whose pool runs one check at a time and queues none: a second
    /// argon2 run at the same time would be refused as busy.
    fn one_at_a_time() -> LoginGuard {
        LoginGuard { passwords: Arc::new(VerifierPool::new(1, 0)), ..LoginGuard::default() }
    }

    #[tokio::test]
    async fn a_burst_with_one_new_credential_runs_argon2_once() {
        let auth = BasicAuth::compile(&v1::BasicAuth::default(), "a", &[consumer("ann", phc("right"))], None).unwrap();
        let guard = one_at_a_time();
        let burst = (0..40).map(|_| auth.verify(b"ann:right", &guard));
        for verdict in futures_util::future::join_all(burst).await {
            assert_eq!(verdict, Ok(Some("ann".into())));
        }
        // The same for a wrong password: one run, every request refused.
        let burst = (0..40).map(|_| auth.verify(b"ann:wrong", &guard));
        for verdict in futures_util::future::join_all(burst).await {
            assert_eq!(verdict, Ok(None));
        }
        assert!(lock(&auth.cache.running).is_empty(), "finished runs leave the table");
    }

    #[tokio::test]
    async fn those_waiting_run_it_themselves_when_the_request_running_it_goes_away() {
        // Costly enough that the first run cannot end before the test looks at it, even on a loaded machine.
        let params = argon2::Params::new(32 * 1024, 1, 1, None).unwrap();
        let argon = Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let costly = argon.hash_password(b"right").unwrap().to_string();
        let auth = BasicAuth::compile(&v1::BasicAuth::default(), "a", &[consumer("ann", costly)], None).unwrap();
        let guard = one_at_a_time();
        let mut running = Box::pin(auth.verify(b"ann:right", &guard));
        assert!(futures_util::poll!(running.as_mut()).is_pending());
        let mut waiting = Box::pin(auth.verify(b"ann:right", &guard));
        assert!(futures_util::poll!(waiting.as_mut()).is_pending());
        // The client that brought it first hangs up.
        drop(running);
        assert_eq!(waiting.await, Ok(Some("ann".into())));
        assert!(lock(&auth.cache.running).is_empty());
    }

    #[tokio::test]
    async fn a_run_against_an_old_hash_is_not_waited_for_by_a_newer_snapshot() {
        let old = BasicAuth::compile(&v1::BasicAuth::default(), "a", &[consumer("ann", phc("old"))], None).unwrap();
        let new =
            BasicAuth::compile(&v1::BasicAuth::default(), "a", &[consumer("ann", phc("new"))], Some(&old)).unwrap();
        let guard = LoginGuard { passwords: Arc::new(VerifierPool::new(2, 0)), ..LoginGuard::default() };
        // The same credential at once under both snapshots: each is checked against its own hash.
        let (under_old, under_new) = tokio::join!(old.verify(b"ann:new", &guard), new.verify(b"ann:new", &guard));
        assert_eq!(under_old, Ok(None));
        assert_eq!(under_new, Ok(Some("ann".into())));
    }

    #[test]
    fn cache_is_bounded() {
        let cache = LoginCache::new();
        let phc: Arc<str> = "x".into();
        for i in 0..(CACHE_CAPACITY + 50) {
            cache.remember(cache.digest(format!("u:{i}").as_bytes()), phc.clone());
        }
        assert_eq!(cache.len(), CACHE_CAPACITY);
    }

    #[test]
    fn bad_hash_fails_compile() {
        let err =
            BasicAuth::compile(&v1::BasicAuth::default(), "a", &[consumer("ann", "plain".into())], None).unwrap_err();
        assert!(err.contains("consumer `ann`"), "{err}");
    }
}
