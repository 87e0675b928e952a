//! The control plane's listeners (admin API and sync server) below HTTP:
//! accepts TCP connections and, where TLS is configured, completes each
//! handshake in its own task (so a slow or silent client never holds up the
//! accept loop) with a server configuration reloaded from its files when they
//! change, so rotating a certificate needs no restart. With a client CA, a
//! peer without a certificate that chains to it is refused at the handshake.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use sluice_proto::tls::{PemFileError, certificates, private_key, roots};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::TcpConnectInfo;

/// How often the certificate files are looked at for changes.
const RELOAD_INTERVAL: Duration = Duration::from_secs(1);
/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once per listener; further connections wait in
/// the accept queue rather than each costing a task and a buffer.
const MAX_HANDSHAKES: usize = 256;
/// How long, and for how many bytes, a refused client is read after our
/// alert before its connection is closed (see [`close_after_alert`]).
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    File(#[from] PemFileError),
    #[error("{}: {reason}", .path.display())]
    Unusable { path: PathBuf, reason: String },
}

/// Where a listener's certificate, key and (for mutual TLS) client CA are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Peers must present a certificate chaining to one of these.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    fn paths(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.cert, &self.key].into_iter().chain(&self.client_ca)
    }
}

/// A server configuration built from [`TlsFiles`], rebuilt when they change.
pub struct ReloadingConfig {
    files: TlsFiles,
    alpn: Vec<Vec<u8>>,
    current: ArcSwap<ServerConfig>,
    /// What the files looked like when `current` was built (or last failed to).
    seen: Mutex<Vec<Option<FileStamp>>>,
}

/// Enough of a file's metadata to notice a replacement: editors and
/// certificate tools write a new file and rename it, or swap a symlink.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &PathBuf) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp { modified: meta.modified().ok(), len: meta.len(), inode: meta.ino() })
}

impl ReloadingConfig {
    /// Builds the configuration once (a bad file fails start-up) and starts
    /// watching the files; the watch ends when the returned value is dropped.
    pub fn load(files: TlsFiles, alpn: &[&[u8]]) -> Result<Arc<Self>, TlsError> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let seen = files.paths().map(stamp).collect();
        let config = build(&files, &alpn)?;
        let reloading = Arc::new(Self { files, alpn, current: ArcSwap::from_pointee(config), seen: Mutex::new(seen) });
        tokio::spawn(watch(Arc::downgrade(&reloading)));
        Ok(reloading)
    }

    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    /// Rebuilds when a file changed since the last look. A change that does
    /// not load (say the certificate is replaced before its key) keeps the
    /// configuration in use, and is retried when the files change again.
    fn reload_if_changed(&self) {
        let now: Vec<Option<FileStamp>> = self.files.paths().map(stamp).collect();
        {
            let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if *seen == now {
                return;
            }
            *seen = now;
        }
        match build(&self.files, &self.alpn) {
            Ok(config) => {
                self.current.store(Arc::new(config));
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded from its files");
            }
            Err(e) => tracing::error!(
                error = %e,
                "TLS files changed but cannot be loaded; still serving the previous certificate"
            ),
        }
    }
}

async fn watch(config: Weak<ReloadingConfig>) {
    let mut tick = tokio::time::interval(RELOAD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(config) = config.upgrade() else { return };
        // Metadata reads and PEM parsing touch the disk.
        let _ = tokio::task::spawn_blocking(move || config.reload_if_changed()).await;
    }
}

fn build(files: &TlsFiles, alpn: &[Vec<u8>]) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let unusable = |path: &PathBuf, reason: String| TlsError::Unusable { path: path.clone(), reason };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| unusable(&files.cert, e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider)
                .build()
                .map_err(|e| unusable(ca, format!("cannot verify client certificates with it: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certificates(&files.cert)?, private_key(&files.key)?)
        .map_err(|e| unusable(&files.key, format!("does not fit the certificate {}: {e}", files.cert.display())))?;
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

/// An accepted connection, in clear or after its TLS handshake.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// tonic reads the peer address (`Request::remote_addr`) from this.
impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        match self {
            Conn::Plain(s) => s.connect_info(),
            Conn::Tls(s) => s.get_ref().0.connect_info(),
        }
    }
}

/// The client's address, for the admin API's handlers (`ConnectInfo<ClientAddr>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

impl Connected<IncomingStream<'_, Incoming>> for ClientAddr {
    fn connect_info(stream: IncomingStream<'_, Incoming>) -> Self {
        ClientAddr(*stream.remote_addr())
    }
}

/// A listener's stream of ready connections: an axum [`Listener`] for the
/// admin API and a `Stream` for tonic's `serve_with_incoming`.
///
/// [`Listener`]: axum::serve::Listener
pub struct Incoming {
    ready: mpsc::Receiver<(Conn, SocketAddr)>,
    local_addr: SocketAddr,
    accept_loop: tokio::task::JoinHandle<()>,
}

impl Incoming {
    /// Starts accepting on `listener`; `name` labels the log lines.
    pub fn new(listener: TcpListener, tls: Option<Arc<ReloadingConfig>>, name: &'static str) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (ready_tx, ready) = mpsc::channel(64);
        let accept_loop = tokio::spawn(accept_loop(listener, tls, name, ready_tx));
        Ok(Self { ready, local_addr, accept_loop })
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<ReloadingConfig>>,
    name: &'static str,
    ready: mpsc::Sender<(Conn, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: pause rather than spin.
                tracing::warn!(listener = name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Small gRPC and admin frames go out at once rather than waiting for an ACK.
        let _ = stream.set_nodelay(true);
        let Some(tls) = &tls else {
            if ready.send((Conn::Plain(stream), peer)).await.is_err() {
                return;
            }
            continue;
        };
        let Ok(permit) = handshakes.clone().acquire_owned().await else { return };
        let acceptor = TlsAcceptor::from(tls.current());
        let ready = ready.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream).into_fallible()).await;
            drop(permit);
            match handshake {
                Ok(Ok(stream)) => {
                    let _ = ready.send((Conn::Tls(Box::new(stream)), peer)).await;
                }
                Ok(Err((e, stream))) => {
                    tracing::warn!(listener = name, %peer, error = %e, "TLS handshake refused");
                    close_after_alert(stream).await;
                }
                Err(_) => tracing::warn!(listener = name, %peer, "TLS handshake not finished in time; closed"),
            }
        });
    }
}

/// Under TLS 1.3 a client whose certificate we refuse has finished its side
/// of the handshake and sent its first request before our alert reaches it.
/// Closing with that request unread would make the kernel answer with a
/// reset, which can discard the alert before the client reads it, and the
/// client would only see "connection closed". So our side is shut first and
/// what the client still sends is read (bounded in time and bytes) until it
/// closes, as nginx's lingering close does.
async fn close_after_alert(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let mut read = 0;
    let drain = async {
        while read < LINGER_BYTES {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

impl axum::serve::Listener for Incoming {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // The accept loop only ends when it is aborted, i.e. never while this listener is served.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local_addr)
    }
}

impl futures_util::Stream for Incoming {
    type Item = io::Result<Conn>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().ready.poll_recv(cx).map(|ready| ready.map(|(conn, _)| Ok(conn)))
    }
}
