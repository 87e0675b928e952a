//! The in-process data plane the proxy-path tests run against: the real
//! `App::build` and `App::run_until` (proxy workers and their connection
//! balance, both proxy listeners, ops, the sync client) on 127.0.0.1:0, fed
//! by a fake control plane. A snapshot is live once the data plane ACKed it,
//! as in production.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_data_plane::app::{App, AppError};
use sluice_data_plane::settings::{Settings, Switch};
use sluice_proto::v1::{Snapshot, data_plane_message};
use tokio::sync::{Mutex, oneshot};
use tokio::task::JoinHandle;

use crate::fake_cp::{Connection, FakeControlPlane, seal};
use crate::support::WAIT;

/// Two workers whatever the machine: tests go through the balance between them.
const WORKERS: usize = 2;

pub struct Gateway {
    /// The plain-HTTP proxy listener (HTTP/1.1 and h2c).
    pub http: SocketAddr,
    /// The TLS proxy listener.
    pub https: SocketAddr,
    pub ops: SocketAddr,
    /// Kept serving for as long as the data plane runs.
    _control_plane: FakeControlPlane,
    /// The data plane's sync stream; one push at a time.
    stream: Mutex<Connection>,
    stop: Option<oneshot::Sender<()>>,
    run: Option<JoinHandle<Result<(), AppError>>>,
}

impl Gateway {
    /// A data plane serving `snapshot`.
    pub async fn start(snapshot: &Snapshot) -> Result<Self> {
        Self::start_with(snapshot, |_| {}).await
    }

    /// A data plane serving `snapshot`, with settings changed by `configure`.
    pub async fn start_with(snapshot: &Snapshot, configure: impl FnOnce(&mut Settings)) -> Result<Self> {
        let gateway = Self::start_empty(configure).await?;
        gateway.apply(snapshot).await?;
        Ok(gateway)
    }

    /// A data plane that has applied no snapshot yet.
    pub async fn start_empty(configure: impl FnOnce(&mut Settings)) -> Result<Self> {
        let mut control_plane = FakeControlPlane::start().await?;
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut settings = Settings {
            control_plane: control_plane.url(),
            http_addr: loopback,
            https_addr: loopback,
            ops_addr: loopback,
            node_id: Some("in-process".into()),
            access_log: Switch::Off,
            shutdown_grace_secs: 5,
            worker_threads: WORKERS,
            ..Settings::with_defaults()
        };
        configure(&mut settings);
        let app = App::build(settings).await?;
        let bound = app.bound().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let run = tokio::spawn(app.run_until(async {
            let _ = stopped.await;
        }));
        let stream = control_plane.accept().await?;
        Ok(Gateway {
            http: bound.http_addr,
            https: bound.https_addr,
            ops: bound.ops_addr,
            _control_plane: control_plane,
            stream: Mutex::new(stream),
            stop: Some(stop),
            run: Some(run),
        })
    }

    /// Pushes `snapshot` (sealed here) and waits for its ACK: from then on
    /// every new request is routed by it.
    pub async fn apply(&self, snapshot: &Snapshot) -> Result<()> {
        match self.push(snapshot).await? {
            data_plane_message::Message::Ack(_) => Ok(()),
            data_plane_message::Message::Nack(nack) => bail!("v{} refused: {}", nack.version, nack.error),
            other => bail!("expected an ACK or a NACK, got {other:?}"),
        }
    }

    /// Pushes `snapshot` and expects a NACK; returns its reason.
    pub async fn refuse(&self, snapshot: &Snapshot) -> Result<String> {
        match self.push(snapshot).await? {
            data_plane_message::Message::Nack(nack) => Ok(nack.error),
            other => bail!("expected a NACK, got {other:?}"),
        }
    }

    async fn push(&self, snapshot: &Snapshot) -> Result<data_plane_message::Message> {
        let snapshot = seal(snapshot.clone());
        let version = snapshot.version;
        let mut stream = self.stream.lock().await;
        stream.push(snapshot).await?;
        let reply = stream.reply().await?;
        let replied = match &reply {
            data_plane_message::Message::Ack(ack) => ack.version,
            data_plane_message::Message::Nack(nack) => nack.version,
            _ => version,
        };
        if replied != version {
            bail!("pushed v{version}, the reply is about v{replied}");
        }
        Ok(reply)
    }

    /// `http://<plain listener><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// Stops accepting, lets in-flight requests finish, and returns once the
    /// data plane has stopped.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let run = self.run.take().context("already stopped")?;
        // The grace period (5 s) plus room for a loaded machine.
        tokio::time::timeout(WAIT + Duration::from_secs(5), run).await.context("the data plane did not stop")???;
        Ok(())
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
