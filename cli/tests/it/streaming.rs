//! Large bodies stream through a real `sluice-dp` both ways without the data
//! plane holding them in memory: its resident set is measured from /proc.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use reqwest::Method;
use serde_json::{Value, json};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::support::{Cluster, WAIT, eventually, rss_kib, served_by};

const MIB: u64 = 1024 * 1024;
const SIZE: u64 = 100 * MIB;
const CHUNK: usize = 64 * 1024;
static ZEROES: [u8; CHUNK] = [0; CHUNK];
/// Bound of one whole 100 MB transfer: generous, since a debug build on a
/// shared machine is slow, and this is a memory check, not a timing one.
const TRANSFER: Duration = Duration::from_secs(120);

/// Streaming keeps only a few frames per connection in flight (hyper's read
/// buffers and the h1 write queue, tens to hundreds of KiB); a proxy that
/// buffered a body would grow by the whole 100 MB. 16 MiB leaves room for
/// allocator noise and the pool's connection state while still catching any
/// buffering of even a sixth of the body.
const MAX_GROWTH_KIB: u64 = 16 * 1024;

/// A request body generated chunk by chunk: the test never holds 100 MB either.
fn generated_body(total: u64) -> BoxBody<Bytes, std::io::Error> {
    let chunks = futures_util::stream::unfold(total, |left| async move {
        if left == 0 {
            return None;
        }
        let len = left.min(CHUNK as u64) as usize;
        Some((Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(&ZEROES[..len]))), left - len as u64))
    });
    StreamBody::new(chunks).boxed()
}

/// Samples the process's RSS every 20 ms until stopped; returns the peak in KiB.
fn sample_peak(pid: u32, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    let peak = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(rss) = rss_kib(pid) {
                peak.fetch_max(rss, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        peak.load(Ordering::Relaxed)
    })
}

#[tokio::test]
async fn a_100_mb_upload_and_download_stream_through_without_growing_the_data_plane() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let Cluster { cp: _cp, admin, upstream: _u1, backend: a1, dp } = Cluster::start(dir.path(), "dp-stream").await?;
    let pid = dp.pid()?;
    let proxy = dp.addr("http_addr")?;
    let client = reqwest::Client::builder().timeout(TRANSFER).build()?;

    admin.create_upstream("pool", a1).await?;
    admin
        .ok(
            Method::POST,
            "/v1/apis",
            Some(json!({ "name": "files", "path_prefix": "/files", "strip_prefix": true, "upstream": "pool" })),
        )
        .await?;
    let probe = format!("http://{proxy}/files/probe");
    eventually("the API on the data plane", || async { served_by(&client, &probe).await.is_ok() }).await?;
    let idle = rss_kib(pid)?;

    // Warm up with small transfers so that pooled connections, buffers and
    // lazily initialised state exist before the baseline is taken.
    upload(&format!("http://{proxy}/files/sink?discard_body=1"), 4 * MIB).await?;
    download(&client, &format!("http://{proxy}/files/bytes/{}", 4 * MIB), 4 * MIB).await?;
    let before = rss_kib(pid)?;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_peak(pid, stop.clone());
    upload(&format!("http://{proxy}/files/sink?discard_body=1"), SIZE).await?;
    download(&client, &format!("http://{proxy}/files/bytes/{SIZE}"), SIZE).await?;
    stop.store(true, Ordering::Relaxed);
    let peak = tokio::time::timeout(WAIT, sampler).await.context("sampler hung")??;
    let after = rss_kib(pid)?;
    let peak = peak.max(after);

    eprintln!("data plane RSS: idle {idle} KiB, before {before} KiB, peak {peak} KiB, after {after} KiB");
    ensure!(
        peak.saturating_sub(before) <= MAX_GROWTH_KIB,
        "RSS grew from {before} KiB to a peak of {peak} KiB while streaming 2 x 100 MB"
    );
    Ok(())
}

/// Uploads through hyper's client, whose request body is a stream of frames.
async fn upload(url: &str, size: u64) -> Result<()> {
    let client = Client::builder(TokioExecutor::new()).build_http::<BoxBody<Bytes, std::io::Error>>();
    let request = http::Request::put(url.parse::<http::Uri>()?)
        .header(http::header::CONTENT_LENGTH, size)
        .body(generated_body(size))?;
    let response = tokio::time::timeout(TRANSFER, client.request(request)).await.context("upload timed out")??;
    ensure!(response.status() == 200, "upload: {}", response.status());
    let body =
        tokio::time::timeout(WAIT, response.into_body().collect()).await.context("upload answer timed out")??;
    let echo: Value = serde_json::from_slice(&body.to_bytes())?;
    ensure!(echo["body_len"].as_u64() == Some(size), "the upstream counted {} bytes", echo["body_len"]);
    Ok(())
}

/// Reads the response chunk by chunk, counting bytes without keeping them.
async fn download(client: &reqwest::Client, url: &str, size: u64) -> Result<()> {
    let mut response = client.get(url).send().await?;
    ensure!(response.status() == 200, "download: {}", response.status());
    let mut received = 0u64;
    while let Some(chunk) = response.chunk().await? {
        received += chunk.len() as u64;
    }
    ensure!(received == size, "downloaded {received} of {size} bytes");
    Ok(())
}
