//! Sluice control plane: stores the gateway configuration, serves the admin
//! REST API, and pushes numbered snapshots to data planes over gRPC.

pub mod model;
pub mod diff;
pub mod prepare;
pub mod snapshot;
pub mod specs;
pub mod certificates;
pub mod secrets;
pub mod credentials;
pub mod sync;
pub mod store;
pub mod admin;
