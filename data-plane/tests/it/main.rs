//! The data plane's integration tests: real `sluice-dp` and
//! `sluice-test-upstream` processes on 127.0.0.1 with ephemeral ports, driven
//! by a fake control plane where sync is involved. One binary keeps link time down.

mod fake_cp;
mod support;

mod lifecycle;
mod openapi;
mod policies;
mod proxy;
mod rate_limit;
mod sync;
mod test_upstream;
mod tls;
