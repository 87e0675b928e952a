//! Integration tests of the control plane, one binary for the crate (link time): each module drives a real
//! server over sockets.

mod admin;
mod database;
mod fleet;
mod sync;
