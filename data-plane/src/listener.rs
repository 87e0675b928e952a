//! Listening sockets with an accept queue long enough for bursts of new
//! connections.
//!
//! `TcpListener::bind` (tokio, as the standard library) asks for a queue of
//! 128. Connections the proxy has not accepted yet wait in that queue; once
//! it is full the kernel drops the next handshakes, and their clients try
//! again only after a second. 500 clients connecting at once overflowed it
//! (the kernel's `ListenOverflows` counter) and stalled their first requests
//! for a second. nginx asks for 511; this asks for 4,096, which the kernel
//! caps at `net.core.somaxconn` (4,096 by default since Linux 5.4).

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// How many not yet accepted connections the kernel may queue per listener.
pub const ACCEPT_BACKLOG: u32 = 4096;

/// Binds `addr` (with `SO_REUSEADDR`, as `TcpListener::bind` does on Unix,
/// so a restart can bind while old connections linger in TIME_WAIT) and
/// listens with [`ACCEPT_BACKLOG`].
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Connections the kernel completes while the proxy has not accepted
    /// them yet wait in the queue; past its length, handshakes are dropped
    /// and a client's connect hangs (retried after 1 s, 3 s, ... while the
    /// queue stays full). With `TcpListener::bind`'s 128 this test times out.
    #[tokio::test]
    async fn a_burst_of_connections_waits_for_accept_instead_of_being_dropped() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let connects = (0..300).map(|_| tokio::net::TcpStream::connect(addr));
        let connected =
            tokio::time::timeout(Duration::from_secs(5), futures_util::future::try_join_all(connects)).await;
        assert_eq!(connected.expect("every handshake completes before any accept").unwrap().len(), 300);
        drop(listener);
    }
}
