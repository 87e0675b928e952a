//! Failed authentications per client address and per username, read by the
//! authentication step before it checks anything: after `limit` failures
//! within a window the subject gets 429 until the window ends, so guessing
//! costs the gateway no hash. One table per process, shared by every API,
//! of fixed size: a flood of distinct addresses or usernames evicts entries
//! (the least failed first) instead of growing it.

use std::hash::BuildHasher as _;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::Counter;

use super::password::VerifierPool;
use super::rate_limit::Cidr;
use crate::clock::now_ms;

/// Failures allowed per subject and window unless configured.
pub const DEFAULT_AUTH_FAILURE_LIMIT: u32 = 10;
pub const DEFAULT_AUTH_FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Sets of [`WAYS`] entries each: 8,192 subjects tracked at once, in under
/// 200 KiB whatever the traffic.
const SETS: usize = 2_048;
const WAYS: usize = 4;

/// Who failed to authenticate.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    Address(IpAddr),
    Username(&'a [u8]),
}

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// The subject's keyed hash; 0 marks a free entry.
    tag: u64,
    /// When the subject's current window began.
    since_ms: u64,
    failures: u32,
}

#[derive(Debug)]
pub struct AuthFailures {
    /// 0 turns the limit off.
    limit: u32,
    window_ms: u64,
    /// Keyed per process (SipHash): clients choose the subjects, and must not
    /// be able to aim them at one set to evict a victim's entry.
    hasher: std::collections::hash_map::RandomState,
    sets: Box<[Mutex<[Entry; WAYS]>]>,
    failures_total: Counter,
    limited_total: Counter,
}

impl Default for AuthFailures {
    fn default() -> Self {
        AuthFailures::new(DEFAULT_AUTH_FAILURE_LIMIT, DEFAULT_AUTH_FAILURE_WINDOW)
    }
}

impl AuthFailures {
    pub fn new(limit: u32, window: Duration) -> Self {
        AuthFailures {
            limit,
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1),
            hasher: std::collections::hash_map::RandomState::new(),
            sets: (0..SETS).map(|_| Mutex::new([Entry::default(); WAYS])).collect(),
            failures_total: metrics::counter!("sluice_auth_failures_total"),
            limited_total: metrics::counter!("sluice_auth_limited_total"),
        }
    }

    /// How long until `subject` may try again, when it has used up its failures.
    pub fn retry_after(&self, subject: Subject<'_>) -> Option<Duration> {
        if self.limit == 0 {
            return None;
        }
        let (set, tag) = self.locate(subject);
        let now = now_ms();
        let entries = self.lock(set);
        let entry = entries.iter().find(|e| e.tag == tag)?;
        let elapsed = now.saturating_sub(entry.since_ms);
        if entry.failures < self.limit || elapsed >= self.window_ms {
            return None;
        }
        self.limited_total.increment(1);
        Some(Duration::from_millis(self.window_ms - elapsed))
    }

    /// Counts a failed authentication of `subject`.
    pub fn record(&self, subject: Subject<'_>) {
        if matches!(subject, Subject::Address(_)) {
            self.failures_total.increment(1);
        }
        if self.limit == 0 {
            return;
        }
        let (set, tag) = self.locate(subject);
        let now = now_ms();
        let window = self.window_ms;
        let expired = |e: &Entry| now.saturating_sub(e.since_ms) >= window;
        let mut entries = self.lock(set);
        if let Some(entry) = entries.iter_mut().find(|e| e.tag == tag) {
            if expired(entry) {
                *entry = Entry { tag, since_ms: now, failures: 1 };
            } else {
                entry.failures = entry.failures.saturating_add(1);
            }
            return;
        }
        // A free or expired entry, else the one with the fewest failures: a
        // subject near its limit is the last to be forgotten.
        let victim = entries.iter_mut().min_by_key(|e| if e.tag == 0 || expired(e) { (0, 0) } else { (1, e.failures) });
        if let Some(victim) = victim {
            *victim = Entry { tag, since_ms: now, failures: 1 };
        }
    }

    fn locate(&self, subject: Subject<'_>) -> (usize, u64) {
        let hash = match subject {
            Subject::Address(ip) => self.hasher.hash_one((0u8, ip.to_canonical())),
            Subject::Username(name) => self.hasher.hash_one((1u8, name)),
        };
        // The low bits pick the set; the tag is never 0 (a free entry).
        ((hash as usize) % SETS, hash | 1)
    }

    fn lock(&self, set: usize) -> std::sync::MutexGuard<'_, [Entry; WAYS]> {
        self.sets[set].lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What every API's authentication shares in one process: the failure
/// table, the password pool, and the proxies whose `X-Forwarded-For` names
/// the client (the same `--trusted-proxies` as rate limits).
#[derive(Debug, Clone, Default)]
pub struct LoginGuard {
    pub failures: Arc<AuthFailures>,
    pub passwords: Arc<VerifierPool>,
    pub trusted_proxies: Arc<[Cidr]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_after_the_failures_of_a_window() {
        let table = AuthFailures::new(3, Duration::from_secs(60));
        let ip = Subject::Address("192.0.2.7".parse().unwrap());
        let other = Subject::Address("192.0.2.8".parse().unwrap());
        for _ in 0..2 {
            table.record(ip);
            assert_eq!(table.retry_after(ip), None);
        }
        table.record(ip);
        let retry = table.retry_after(ip).expect("limited after three failures");
        assert!(retry <= Duration::from_secs(60) && retry > Duration::from_secs(50), "{retry:?}");
        assert_eq!(table.retry_after(other), None, "another address is not");
        assert_eq!(table.retry_after(Subject::Username(b"192.0.2.7")), None, "nor a username spelled the same");

        // Past the window the count starts over.
        let short = AuthFailures::new(1, Duration::from_millis(1));
        short.record(Subject::Username(b"ann"));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(short.retry_after(Subject::Username(b"ann")), None);
        // Off: never limited.
        let off = AuthFailures::new(0, Duration::from_secs(60));
        off.record(ip);
        assert_eq!(off.retry_after(ip), None);
    }

    #[test]
    fn a_flood_of_subjects_stays_in_the_table_and_spares_the_most_failed() {
        let table = AuthFailures::new(5, Duration::from_secs(60));
        let guessed = Subject::Username(b"alice");
        for _ in 0..5 {
            table.record(guessed);
        }
        for n in 0..100_000u32 {
            table.record(Subject::Username(&n.to_be_bytes()));
        }
        assert!(table.retry_after(guessed).is_some(), "one failure each never evicts five");
        assert_eq!(table.sets.len() * WAYS, 8_192);
    }
}
