//! The admin REST API over real sockets, each scenario on SQLite and (with `SLUICE_TEST_DATABASE_URL`)
//! PostgreSQL: auth, CRUD and pagination of every collection, conflicts, error shapes, secrets, specs,
//! whole-config import/export, snapshots and the OpenAPI document.

mod config;
mod docs;
mod edge_rules;
mod errors;
mod limits;
mod resources;
mod secrets;
pub mod support;
mod unusable;
