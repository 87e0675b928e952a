//! A real WebSocket session through `sluice-dp`: the upgrade is passed through
//! and frames flow both ways until a clean close.

use std::net::SocketAddr;

use anyhow::{Context, Result, bail, ensure};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

use crate::support::{Admin, WAIT, control_plane, data_plane, eventually, served_by, upstream};

/// A WebSocket echo server on an ephemeral port, living as long as the test's runtime.
async fn echo_server() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { return };
                // Reading answers pings and close frames by itself; data frames are sent back.
                while let Some(Ok(message)) = ws.next().await {
                    if (message.is_text() || message.is_binary()) && ws.send(message).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

#[tokio::test]
async fn websocket_messages_echo_through_the_proxy_and_close_cleanly() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cp = control_plane(dir.path()).await?;
    let admin = Admin::new(cp.addr("admin_addr")?);
    let dp = data_plane(cp.addr("grpc_addr")?, "dp-ws").await?;
    let proxy = dp.addr("http_addr")?;
    let ws_addr = echo_server().await?;
    // A plain HTTP upstream too, to know when the node has the snapshot: the
    // echo server answers only WebSocket handshakes.
    let (_u1, a1) = upstream("u1", "127.0.0.1:0").await?;
    let client = reqwest::Client::builder().timeout(WAIT).build()?;

    admin.create_upstream("ws", ws_addr).await?;
    admin.create_upstream("http", a1).await?;
    admin.create_api("ws", "/ws", "ws").await?;
    admin.create_api("probe", "/probe", "http").await?;
    let probe = format!("http://{proxy}/probe");
    eventually("the APIs on the data plane", || async { served_by(&client, &probe).await.is_ok() }).await?;

    let (mut ws, handshake) =
        tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(format!("ws://{proxy}/ws/echo")))
            .await
            .context("handshake timed out")??;
    ensure!(handshake.status() == 101, "handshake: {}", handshake.status());

    let large: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let messages = [
        Message::text("hello through sluice"),
        Message::binary(vec![0u8, 1, 2, 254, 255]),
        Message::text("second text frame: ünïcödé"),
        Message::binary(large),
    ];
    for message in messages {
        ws.send(message.clone()).await?;
        let echoed = tokio::time::timeout(WAIT, ws.next()).await.context("no echo")?.context("stream ended")??;
        ensure!(echoed == message, "sent {message:?}, got back {echoed:?}");
    }

    // Clean close: our close frame is answered with the server's, then the stream ends.
    ws.close(None).await?;
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.context("close not answered")? {
            Some(Ok(Message::Close(_))) => {}
            None => break,
            Some(Ok(other)) => bail!("unexpected frame after close: {other:?}"),
            Some(Err(e)) => bail!("close was not clean: {e}"),
        }
    }
    Ok(())
}
