//! A monotonic millisecond clock that fits in an atomic, for deadlines kept in
//! `AtomicU64`s (target ejections, idle client connections).

use std::sync::OnceLock;
use std::time::Instant;

/// Milliseconds since the first call, plus one: never 0, so 0 can mean "unset".
pub(crate) fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
}
