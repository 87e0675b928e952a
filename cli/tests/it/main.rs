//! End-to-end tests of the whole gateway: the real `sluice-cp`, `sluice-dp`,
//! `sluice` and `sluice-test-upstream` binaries on 127.0.0.1 with ephemeral
//! ports, talking over real sockets, gRPC and SQLite.

mod cluster;
mod dashboard;
mod jwks;
mod planes_tls;
mod resilience;
mod secrets_at_rest;
mod standalone;
mod streaming;
mod support;
mod tls;
mod websocket;
// deployment and operator experience (issue 6)
mod admin_tokens;
mod cli_roundtrip;
mod compose;
mod observability;
mod replicas;
