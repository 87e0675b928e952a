//! The data plane's integration tests on 127.0.0.1 with ephemeral ports, fed
//! by a fake control plane: the proxy path in-process (`gateway`, the real
//! `App`), and real `sluice-dp` and `sluice-test-upstream` processes where the
//! binary itself is under test. One binary keeps link time down.

mod certs;
mod fake_cp;
mod gateway;
mod raw_http;
mod support;

mod compilable;
mod grpc;
mod hostile_clients;
mod hostile_headers;
mod hostile_paths;
mod http1_requests;
mod http1_responses;
mod lifecycle;
mod metrics;
mod observe;
mod openapi;
mod policies;
mod proxy;
mod rate_limit;
mod sync;
mod test_upstream;
mod tls;
mod trace;
