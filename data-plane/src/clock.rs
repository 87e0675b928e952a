//! A monotonic millisecond clock that fits in an atomic, for deadlines kept in
//! `AtomicU64`s (target ejections, idle client connections).

use std::sync::OnceLock;
use std::time::Instant;

/// Milliseconds since the first call, plus one: never 0, so 0 can mean "unset".
pub(crate) fn now_ms() -> u64 {
    ms_at(Instant::now())
}

/// [`now_ms`] at `at`, for a caller that has just read the clock anyway.
pub(crate) fn ms_at(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let since = at.saturating_duration_since(*EPOCH.get_or_init(Instant::now));
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX - 1) + 1
}
