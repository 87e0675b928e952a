//! Thread per core: the proxy listeners are served by a set of worker
//! threads, each with a single-threaded Tokio runtime of its own, instead of
//! by one work-stealing runtime.
//!
//! Why: a proxied request is two connections (client and upstream) handing
//! work to each other. On a work-stealing runtime their tasks drift apart
//! across threads, and every hand-off between threads costs a cross-thread
//! wake-up and cache misses. Here a client connection, the upstream connections it uses
//! (each worker keeps its own idle ones, see [`worker::current`]) and their timers
//! all live on one thread, as in nginx or Envoy.
//!
//! Every worker accepts on its own copy (`dup`) of each listening socket,
//! while it holds no more than its share of the open connections (see
//! `balance`). Control work (sync, ops, health checks) stays on the main runtime.

use std::sync::Arc;
use std::thread;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio_rustls::TlsAcceptor;

use super::balance::{Balance, Seat};
use super::{ProxyOptions, serve_listener};
use crate::base::worker;
use crate::routing::TableStore;

/// What the workers serve.
pub struct Listeners {
    pub http: TcpListener,
    pub https: TcpListener,
    pub tls: Arc<rustls::ServerConfig>,
}

/// How the workers are told to stop: `drain` asks them to stop accepting
/// and finish in-flight requests; `end` drops whatever is left and ends the
/// threads. A drained worker keeps running until `end`: a connection to an
/// upstream lives on the worker that opened it, and may still carry another
/// worker's request (the one HTTP/2 connection per target is shared).
pub struct Stop {
    pub drain: watch::Receiver<bool>,
    pub end: watch::Receiver<bool>,
}

/// Starts [`worker::count`] workers serving both listeners. Each returned receiver
/// yields its worker's end: `Ok` once drained (or ended), `Err` if its
/// listener failed; a dropped sender means the worker panicked.
pub fn start(
    listeners: Listeners,
    tables: Arc<TableStore>,
    options: ProxyOptions,
    stop: &Stop,
) -> std::io::Result<Vec<oneshot::Receiver<std::io::Result<()>>>> {
    let http = listeners.http.into_std()?;
    let https = listeners.https.into_std()?;
    let count = worker::count();
    let balance = Balance::new(count);
    let mut ends = Vec::with_capacity(count);
    for index in 0..count {
        let (http, https) = (http.try_clone()?, https.try_clone()?);
        let seat = balance.seat(index);
        let (tables, tls, options) = (tables.clone(), listeners.tls.clone(), options.clone());
        let (drain, end) = (stop.drain.clone(), stop.end.clone());
        let (end_tx, end_rx) = oneshot::channel();
        thread::Builder::new().name(format!("sluice-proxy-{index}")).spawn(move || {
            worker::enter(index);
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = end_tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                let served = tokio::select! {
                    served = serve_both(http, https, tables, options, tls, seat, drain) => served,
                    () = stopped(end.clone()) => Ok(()),
                };
                let _ = end_tx.send(served);
                stopped(end).await;
            });
            // Dropping the runtime here drops the connections still open.
        })?;
        ends.push(end_rx);
    }
    Ok(ends)
}

/// One worker's share: both listeners, on this thread's runtime.
async fn serve_both(
    http: std::net::TcpListener,
    https: std::net::TcpListener,
    tables: Arc<TableStore>,
    options: ProxyOptions,
    tls: Arc<rustls::ServerConfig>,
    seat: Seat,
    drain: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let (http, https) = (TcpListener::from_std(http)?, TcpListener::from_std(https)?);
    let http = serve_listener(http, tables.clone(), options.clone(), None, seat.clone(), stopped(drain.clone()));
    let https = serve_listener(https, tables, options.over_tls(), Some(TlsAcceptor::from(tls)), seat, stopped(drain));
    let (http, https) = tokio::join!(http, https);
    http.and(https)
}

/// Resolves once `signal` says stop. The guard `wait_for` returns is not
/// `Send`; it is dropped in here, so connection tasks can await this.
pub(crate) async fn stopped(mut signal: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = signal.wait_for(|stop| *stop).await;
}
