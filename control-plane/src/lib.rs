//! Sluice control plane: stores the gateway configuration, serves the admin
//! REST API, and pushes numbered snapshots to data planes over gRPC; what
//! the data planes report back (version, target health, traffic) is shown
//! through the admin API.

pub mod admin;
pub mod app;
pub mod certificates;
pub mod credentials;
pub mod diff;
pub mod model;
pub mod nesting;
pub mod pki;
pub mod prepare;
pub mod secrets;
pub mod settings;
pub mod snapshot;
pub mod specs;
pub mod store;
pub mod sync;
pub mod telemetry;
pub mod tls;
pub mod tokens;
