//! Sluice data plane: receives snapshots from the control plane (`sync`),
//! compiles them into routing tables (`routing`), and proxies traffic by the
//! current table (`proxy`, `upstream`); `app` assembles the process, `ops`
//! serves probes and metrics.

pub mod app;
pub mod backoff;
mod clock;
mod fast_map;
pub mod listener;
pub mod openapi;
pub mod ops;
pub mod policy;
pub mod problem;
pub mod proxy;
pub mod routing;
pub mod settings;
pub mod snapshot_cache;
pub mod sync;
pub mod tls;
pub mod upstream;
