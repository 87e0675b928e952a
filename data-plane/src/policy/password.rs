//! Argon2 password checks for `basic_auth`, beside the authentication step:
//! stored hashes parsed once per snapshot (within the cost bounds both planes
//! share, `sluice_proto::password`), and one process-wide pool that runs the
//! verifications, so that a flood of guesses costs a bounded number of
//! threads, a bounded amount of memory, and gives that memory back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use argon2::password_hash::phc::PasswordHash;
use argon2::{Algorithm, Argon2, Block, Params, Version};
use tokio::sync::Semaphore;

/// A stored password hash with everything a verification needs.
pub struct StoredHash {
    algorithm: Algorithm,
    version: Version,
    params: Params,
    salt: Box<[u8]>,
    expected: Box<[u8]>,
}

// Salt and digest stay out of logs.
impl std::fmt::Debug for StoredHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredHash")
            .field("algorithm", &self.algorithm)
            .field("m", &self.params.m_cost())
            .field("t", &self.params.t_cost())
            .field("p", &self.params.p_cost())
            .finish_non_exhaustive()
    }
}

impl StoredHash {
    /// Parses an Argon2 PHC string; refuses one above the shared cost bounds.
    pub fn parse(phc: &str) -> Result<Self, String> {
        sluice_proto::check_password_hash(phc)?;
        let hash = PasswordHash::new(phc).map_err(|e| format!("the password hash is not a PHC string: {e}"))?;
        let algorithm = Algorithm::new(hash.algorithm.as_str()).map_err(|e| e.to_string())?;
        let version = match hash.version {
            Some(number) => Version::try_from(number).map_err(|e| e.to_string())?,
            None => Version::default(),
        };
        let params = Params::try_from(&hash).map_err(|e| e.to_string())?;
        let salt = hash.salt.as_ref().ok_or("the password hash has no salt")?;
        let expected = hash.hash.as_ref().ok_or("the password hash has no digest")?;
        Ok(StoredHash { algorithm, version, params, salt: salt.as_ref().into(), expected: expected.as_bytes().into() })
    }

    /// A hash no password matches, with the same cost as `self`: checked for
    /// unknown usernames, so they take as long as known ones and the timing
    /// does not tell which usernames exist.
    pub fn decoy_like(&self) -> Self {
        StoredHash {
            algorithm: self.algorithm,
            version: self.version,
            params: self.params.clone(),
            salt: rand::random::<[u8; 16]>().into(),
            expected: (0..self.expected.len()).map(|_| rand::random::<u8>()).collect(),
        }
    }

    /// The decoy for an API whose consumers have no password yet: the
    /// control plane's default cost.
    pub fn default_decoy() -> Self {
        StoredHash {
            algorithm: Algorithm::Argon2id,
            version: Version::V0x13,
            params: Params::default(),
            salt: rand::random::<[u8; 16]>().into(),
            expected: rand::random::<[u8; 32]>().into(),
        }
    }

    /// Runs Argon2 (slow on purpose: call it on the [`VerifierPool`]).
    fn matches(&self, password: &[u8]) -> bool {
        let argon = Argon2::new(self.algorithm, self.version, self.params.clone());
        let mut blocks = memory(self.params.block_count());
        let mut out = vec![0u8; self.expected.len()];
        if argon.hash_password_into_with_memory(password, &self.salt, &mut out, &mut blocks[..]).is_err() {
            return false;
        }
        // Constant time: no early exit on the first differing byte.
        out.iter().zip(self.expected.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// Argon2's working memory for one verification. The capacity is at least
/// [`ALWAYS_MAPPED_BLOCKS`] so that glibc's malloc serves it with its own
/// `mmap` and unmaps it on free: smaller blocks come from a thread's heap
/// arena after the first one is freed (the allocator raises its mmap
/// threshold to the freed size), and each verifying thread's arena then
/// keeps tens of MiB after a flood of logins. Only the pages used count as
/// resident: the capacity beyond `blocks` is address space, not memory.
fn memory(blocks: usize) -> Vec<Block> {
    let mut memory = Vec::with_capacity(blocks.max(ALWAYS_MAPPED_BLOCKS));
    memory.resize(blocks, Block::default());
    memory
}

/// Just over glibc's largest dynamic mmap threshold (32 MiB on 64-bit), in
/// 1 KiB Argon2 blocks.
const ALWAYS_MAPPED_BLOCKS: usize = 33 * 1024;

/// Why a verification did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many password checks are waiting")]
pub struct Busy;

/// Runs Argon2 verifications on at most `slots` blocking threads at once;
/// at most `queue` more wait for a slot, and any beyond are refused at once
/// ([`Busy`]) rather than held in memory. One per process, shared by every
/// API's `basic_auth`.
#[derive(Debug)]
pub struct VerifierPool {
    slots: Semaphore,
    waiting: AtomicUsize,
    queue: usize,
}

impl Default for VerifierPool {
    /// One slot per core, and room for 64 waiting checks per slot.
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        VerifierPool::new(cores, cores * 64)
    }
}

impl VerifierPool {
    pub fn new(slots: usize, queue: usize) -> Self {
        VerifierPool { slots: Semaphore::new(slots.max(1)), waiting: AtomicUsize::new(0), queue }
    }

    /// Whether `password` matches `hash`, computed off the proxy workers.
    pub async fn verify(&self, hash: Arc<StoredHash>, password: Vec<u8>) -> Result<bool, Busy> {
        let permit = match self.slots.try_acquire() {
            Ok(permit) => permit,
            Err(_) => {
                // Counted out when dropped: a client that hangs up while
                // queued must not keep its place in the count.
                let queued = Queued::join(&self.waiting);
                if queued.ahead >= self.queue {
                    return Err(Busy);
                }
                let acquired = self.slots.acquire().await;
                drop(queued);
                acquired.map_err(|_| Busy)?
            }
        };
        metrics::counter!("sluice_password_verifications_total").increment(1);
        let matched = tokio::task::spawn_blocking(move || hash.matches(&password)).await.unwrap_or(false);
        drop(permit);
        Ok(matched)
    }
}

/// One place in the queue of a [`VerifierPool`], held while waiting.
struct Queued<'a> {
    waiting: &'a AtomicUsize,
    /// How many were waiting before this one.
    ahead: usize,
}

impl<'a> Queued<'a> {
    fn join(waiting: &'a AtomicUsize) -> Self {
        Queued { waiting, ahead: waiting.fetch_add(1, Ordering::Relaxed) }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use argon2::PasswordHasher as _;

    use super::*;

    fn phc(password: &str, m: u32) -> String {
        let params = Params::new(m, 1, 1, None).unwrap();
        let argon = Argon2::new(Algorithm::Argon2id, Version::V0x13, params);
        argon.hash_password(password.as_bytes()).unwrap().to_string()
    }

    #[tokio::test]
    async fn verifies_like_the_argon2_crate_and_decoys_never_match() {
        let pool = VerifierPool::new(1, 4);
        let stored = Arc::new(StoredHash::parse(&phc("right", 1024)).unwrap());
        assert_eq!(pool.verify(stored.clone(), b"right".to_vec()).await, Ok(true));
        assert_eq!(pool.verify(stored.clone(), b"wrong".to_vec()).await, Ok(false));
        assert_eq!(pool.verify(stored.clone(), Vec::new()).await, Ok(false));
        let decoy = Arc::new(stored.decoy_like());
        assert_eq!(decoy.params.m_cost(), 1024, "a decoy costs what the real hash costs");
        assert_eq!(pool.verify(decoy, b"right".to_vec()).await, Ok(false));
    }

    #[test]
    fn hashes_above_the_bounds_are_refused() {
        let too_costly = "$argon2id$v=19$m=4194304,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA";
        assert!(StoredHash::parse(too_costly).unwrap_err().contains("m=4194304"));
        assert!(StoredHash::parse("plain").is_err());
    }

    #[tokio::test]
    async fn a_full_queue_is_refused_at_once() {
        let pool = Arc::new(VerifierPool::new(1, 1));
        let slow = Arc::new(StoredHash::parse(&phc("pw", 32 * 1024)).unwrap());
        // One running, one waiting; a third finds the queue full.
        let first = tokio::spawn({
            let (pool, slow) = (pool.clone(), slow.clone());
            async move { pool.verify(slow, b"x".to_vec()).await }
        });
        let second = tokio::spawn({
            let (pool, slow) = (pool.clone(), slow.clone());
            async move { pool.verify(slow, b"y".to_vec()).await }
        });
        let filled = || pool.slots.available_permits() == 0 && pool.waiting.load(Ordering::Relaxed) == 1;
        for _ in 0..10_000 {
            if filled() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(filled(), "one check running, one waiting");
        assert_eq!(pool.verify(slow.clone(), b"z".to_vec()).await, Err(Busy));
        // A waiting check whose client hung up leaves the queue.
        second.abort();
        assert!(second.await.is_err_and(|e| e.is_cancelled()));
        assert_eq!(pool.waiting.load(Ordering::Relaxed), 0);
        assert_eq!(first.await.unwrap(), Ok(false));
        assert_eq!(pool.verify(slow, b"w".to_vec()).await, Ok(false));
    }
}
