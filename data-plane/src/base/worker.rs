//! Which proxy worker thread this is, at the bottom of the request path: the
//! proxy's workers (`proxy::workers`) set it when they start, and per-worker
//! state below the proxy (each upstream target's idle connections) reads it.

use std::cell::Cell;
use std::num::NonZero;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// How many workers this process runs; 0 until [`plan`] says.
static PLANNED: AtomicUsize = AtomicUsize::new(0);

/// Records how many workers the process will start (0: one per core), before
/// anything that sizes per-worker state (a snapshot's upstream pools) is built.
pub fn plan(count: usize) {
    PLANNED.store(count, Ordering::Relaxed);
}

/// The workers planned, or one per core this process may use (its CPU
/// affinity and cgroup quota) where the plan says 0 or nobody planned
/// (tests and tools that serve on a runtime of their own).
pub fn count() -> usize {
    match PLANNED.load(Ordering::Relaxed) {
        0 => thread::available_parallelism().map_or(1, NonZero::get),
        n => n,
    }
}

/// The proxy worker this thread is, counting from 0; 0 off the workers too.
pub fn current() -> usize {
    WORKER.with(Cell::get)
}

/// Marks this thread as proxy worker `index`, once, as the worker starts.
pub(crate) fn enter(index: usize) {
    WORKER.with(|worker| worker.set(index));
}
