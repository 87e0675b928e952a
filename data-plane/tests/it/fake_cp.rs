//! A fake control plane for the sync tests: a real tonic `ConfigSync` server
//! on 127.0.0.1 that hands each incoming stream to the test, which then reads
//! the data plane's messages and pushes snapshots by hand.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_proto::v1::config_sync_server::{ConfigSync, ConfigSyncServer};
use sluice_proto::v1::{
    Ack, Api, ControlPlaneMessage, DataPlaneMessage, Hello, Nack, Snapshot, Target, Upstream, control_plane_message,
    data_plane_message,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use crate::support::WAIT;

/// One data plane's stream as the test sees it.
pub struct Connection {
    /// The `authorization` metadata the data plane sent.
    pub authorization: Option<String>,
    pub hello: Hello,
    inbound: mpsc::UnboundedReceiver<DataPlaneMessage>,
    outbound: mpsc::Sender<Result<ControlPlaneMessage, Status>>,
}

impl Connection {
    pub async fn push(&self, snapshot: Snapshot) -> Result<()> {
        let message = ControlPlaneMessage { message: Some(control_plane_message::Message::Snapshot(snapshot)) };
        self.outbound.send(Ok(message)).await.context("data plane stream closed")
    }

    /// The next message that is not a heartbeat.
    pub async fn reply(&mut self) -> Result<data_plane_message::Message> {
        loop {
            let message = tokio::time::timeout(WAIT, self.inbound.recv())
                .await
                .context("no reply from the data plane")?
                .context("stream ended")?;
            match message.message {
                Some(data_plane_message::Message::Heartbeat(_)) => continue,
                Some(other) => return Ok(other),
                None => bail!("empty message"),
            }
        }
    }

    pub async fn ack(&mut self) -> Result<Ack> {
        match self.reply().await? {
            data_plane_message::Message::Ack(ack) => Ok(ack),
            other => bail!("expected Ack, got {other:?}"),
        }
    }

    pub async fn nack(&mut self) -> Result<Nack> {
        match self.reply().await? {
            data_plane_message::Message::Nack(nack) => Ok(nack),
            other => bail!("expected Nack, got {other:?}"),
        }
    }

    /// The next heartbeat, skipping nothing else (a reply in between is an error).
    pub async fn heartbeat(&mut self) -> Result<sluice_proto::v1::Heartbeat> {
        let message =
            tokio::time::timeout(WAIT, self.inbound.recv()).await.context("no heartbeat")?.context("ended")?;
        match message.message {
            Some(data_plane_message::Message::Heartbeat(heartbeat)) => Ok(heartbeat),
            other => bail!("expected a heartbeat, got {other:?}"),
        }
    }
}

/// How the fake answers a new stream.
#[derive(Clone, Default)]
struct Service {
    connections: Option<mpsc::UnboundedSender<Connection>>,
    /// When set, streams whose token differs are refused like the real control plane does.
    required_token: Option<String>,
}

#[tonic::async_trait]
impl ConfigSync for Service {
    type SyncStream = Pin<Box<dyn Stream<Item = Result<ControlPlaneMessage, Status>> + Send + 'static>>;

    async fn sync(&self, request: Request<Streaming<DataPlaneMessage>>) -> Result<Response<Self::SyncStream>, Status> {
        let authorization = request
            .metadata()
            .get(sluice_proto::AUTHORIZATION_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        if let Some(token) = &self.required_token
            && authorization.as_deref() != Some(format!("Bearer {token}").as_str())
        {
            return Err(Status::unauthenticated("invalid cluster token"));
        }
        let mut stream = request.into_inner();
        let hello = match stream.message().await? {
            Some(DataPlaneMessage { message: Some(data_plane_message::Message::Hello(hello)) }) => hello,
            other => return Err(Status::invalid_argument(format!("expected Hello first, got {other:?}"))),
        };
        let (in_tx, in_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(message)) = stream.message().await {
                if in_tx.send(message).is_err() {
                    break;
                }
            }
        });
        let (out_tx, out_rx) = mpsc::channel(16);
        let connection = Connection { authorization, hello, inbound: in_rx, outbound: out_tx };
        if let Some(connections) = &self.connections {
            let _ = connections.send(connection);
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(out_rx))))
    }
}

pub struct FakeControlPlane {
    pub addr: SocketAddr,
    connections: mpsc::UnboundedReceiver<Connection>,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeControlPlane {
    pub async fn start() -> Result<Self> {
        Self::start_on("127.0.0.1:0".parse()?, None).await
    }

    pub async fn start_with_token(token: &str) -> Result<Self> {
        Self::start_on("127.0.0.1:0".parse()?, Some(token.to_owned())).await
    }

    /// Starts on a given address (to come back where a stopped one was).
    pub async fn start_on(addr: SocketAddr, required_token: Option<String>) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let addr = listener.local_addr()?;
        let (tx, connections) = mpsc::unbounded_channel();
        let service = Service { connections: Some(tx), required_token };
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(ConfigSyncServer::new(service))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Self { addr, connections, stop: Some(stop), server })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next data plane stream.
    pub async fn accept(&mut self) -> Result<Connection> {
        tokio::time::timeout(WAIT, self.connections.recv())
            .await
            .context("no data plane connected")?
            .context("fake control plane stopped")
    }

    /// Stops serving; open streams end when their `Connection` is dropped.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(Duration::from_secs(5), &mut self.server).await.is_err() {
            self.server.abort();
        }
    }
}

/// A snapshot with one catch-all API routed to the given upstream URLs, with
/// a correct content hash.
pub fn snapshot(version: u64, upstream_urls: &[String]) -> Snapshot {
    let api = Api { name: "echo".into(), path_prefix: "/".into(), upstream: "backend".into(), ..Default::default() };
    let upstream = Upstream {
        name: "backend".into(),
        targets: upstream_urls.iter().map(|url| Target { url: url.clone(), weight: 1 }).collect(),
        ..Default::default()
    };
    seal(Snapshot { version, apis: vec![api], upstreams: vec![upstream], ..Default::default() })
}

/// Canonicalizes and stamps the content hash, as the control plane does.
pub fn seal(mut snapshot: Snapshot) -> Snapshot {
    sluice_proto::canonicalize(&mut snapshot);
    snapshot.hash = sluice_proto::content_hash(&snapshot);
    snapshot
}
