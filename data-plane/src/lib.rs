//! Sluice data plane: receives snapshots from the control plane (`sync`),
//! compiles them into routing tables (`routing`), and proxies traffic by the
//! current table (`proxy`, `upstream`); `app` assembles the process, `ops`
//! serves probes and metrics, `trace` exports the requests' spans.
//!
//! The request path, top-down; each module uses only those below it:
//! `proxy` -> `routing` -> `policy` / `openapi` -> `upstream` -> `tls`, with
//! `base` (what they all share) at the bottom.

// The process around the request path.
pub mod app;
pub mod backoff;
pub mod listener;
pub mod ops;
pub mod settings;
pub mod snapshot_cache;
pub mod sync;
pub mod trace;

// The request path (alphabetical here; the order it runs in is above).
pub mod base;
pub mod openapi;
pub mod policy;
pub mod proxy;
pub mod routing;
pub mod tls;
pub mod upstream;

// Helpers with no place in the flow.
mod clock;
mod fast_map;
