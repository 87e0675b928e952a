//! Exact balance of client connections across the proxy workers: a worker
//! accepts only while it holds no more open connections than the least
//! loaded worker plus [`SLACK`], as Envoy's `exact_balance` does.
//!
//! Why: every worker accepts on its own copy of the listening socket, and a
//! keep-alive connection stays on the worker that accepted it. Left to the
//! race for `accept`, one worker often took most of a burst of new
//! connections, and a different worker in the next burst. Each worker keeps
//! its own upstream connections, and glibc gives each worker thread its own
//! arena: as the split moved from one burst to the next, upstream connections
//! were opened again on the other worker, and each arena kept the memory of
//! its own busiest burst. A fixed split also lets the workers share the load
//! when the gateway has cores of its own.
//!
//! A held-back worker waits for the counts to change. The least loaded worker
//! always may accept, so some worker always does; a worker that ends for any
//! reason ends the data plane (see `app`), so no count is left behind by a
//! worker that no longer accepts.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use metrics::Gauge;
use tokio::sync::Notify;

/// How many connections a worker may hold over the least loaded one. Not 0:
/// the workers would then take turns, one accept each, through a wake-up
/// from the other thread.
const SLACK: usize = 2;

/// Open client connections per worker, so operators see the split too.
const METRIC_OPEN_CONNECTIONS: &str = "sluice_open_connections";

/// The open connections of each worker.
#[derive(Debug)]
pub struct Balance {
    workers: Box<[Open]>,
    changed: Notify,
}

#[derive(Debug)]
struct Open {
    count: AtomicUsize,
    /// `sluice_open_connections{worker}`, resolved once.
    gauge: Gauge,
}

impl Balance {
    pub fn new(workers: usize) -> Arc<Self> {
        metrics::describe_gauge!(METRIC_OPEN_CONNECTIONS, "Client connections open, per proxy worker");
        let open = |worker: usize| Open {
            count: AtomicUsize::new(0),
            gauge: metrics::gauge!(METRIC_OPEN_CONNECTIONS, "worker" => worker.to_string()),
        };
        Arc::new(Balance { workers: (0..workers).map(open).collect(), changed: Notify::new() })
    }

    /// The handle worker `worker` accepts through.
    pub fn seat(self: &Arc<Self>, worker: usize) -> Seat {
        Seat { balance: self.clone(), worker }
    }
}

/// One worker's place in the [`Balance`].
#[derive(Debug, Clone)]
pub struct Seat {
    balance: Arc<Balance>,
    worker: usize,
}

impl Seat {
    /// Resolves once this worker may accept another connection.
    pub async fn turn(&self) {
        loop {
            // Registered before the check, so a change between the two is not missed.
            let changed = self.balance.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.may_accept() {
                return;
            }
            changed.await;
        }
    }

    fn may_accept(&self) -> bool {
        let workers = &self.balance.workers;
        let least = workers.iter().map(|w| w.count.load(Ordering::Relaxed)).min().unwrap_or(0);
        workers.get(self.worker).is_none_or(|mine| mine.count.load(Ordering::Relaxed) <= least + SLACK)
    }

    /// Counts an accepted connection for as long as the returned guard lives.
    pub fn hold(&self) -> Held {
        if let Some(mine) = self.balance.workers.get(self.worker) {
            mine.count.fetch_add(1, Ordering::Relaxed);
            mine.gauge.increment(1.0);
        }
        self.balance.changed.notify_waiters();
        Held { seat: self.clone() }
    }
}

/// One open connection of a worker; dropping it (the connection's end) counts it out.
#[derive(Debug)]
pub struct Held {
    seat: Seat,
}

impl Drop for Held {
    fn drop(&mut self) {
        let Seat { balance, worker } = &self.seat;
        if let Some(mine) = balance.workers.get(*worker) {
            mine.count.fetch_sub(1, Ordering::Relaxed);
            mine.gauge.decrement(1.0);
        }
        balance.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_worker_ahead_by_more_than_the_slack_waits_for_the_others() {
        let balance = Balance::new(2);
        let (first, second) = (balance.seat(0), balance.seat(1));
        let held: Vec<Held> = (0..=SLACK).map(|_| first.hold()).collect();
        let waiting = tokio::spawn({
            let first = first.clone();
            async move { first.turn().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "worker 0 holds {} against 0 and still may accept", held.len());
        // The other worker may accept meanwhile ...
        tokio::time::timeout(Duration::from_secs(1), second.turn()).await.expect("worker 1 held back");
        // ... and its next connection, or one of worker 0's ending, lets worker 0 go on.
        let _other = second.hold();
        tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("worker 0 still held back").unwrap();

        let _more = first.hold();
        let waiting = tokio::spawn({
            let first = first.clone();
            async move { first.turn().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        drop(held);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("a closed connection freed no turn")
            .unwrap();
    }
}
