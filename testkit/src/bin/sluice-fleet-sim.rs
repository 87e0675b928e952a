//! `sluice-fleet-sim`: a fleet of simulated data planes in one process, for
//! the `fleet` benchmark (bench/lib/fleet.py). Starts `--nodes` sync clients
//! (testkit's `SimNode`, one TCP connection each) against a control plane
//! and reports on stdout, one JSON object a line:
//!
//! * `{"connected": n, "at_ms": t}` whenever the number of open streams changes;
//! * `{"version": v, "arrivals_ms": [...]}` once every node received version
//!   `v` (or the next line's version superseded it on some node), with
//!   each node's arrival time.
//!
//! Times are Unix milliseconds (the wall clock), so the caller can compare
//! them with when it wrote. Runs until `--seconds` pass or it is killed.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use sluice_testkit::sim_node::{Arrival, SimNode, SimOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;

struct Args {
    control_plane: String,
    cluster_token: String,
    nodes: usize,
    seconds: u64,
    heartbeat: Duration,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        control_plane: "http://127.0.0.1:9090".into(),
        cluster_token: String::new(),
        nodes: 100,
        seconds: 600,
        heartbeat: Duration::from_secs(5),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--control-plane" => args.control_plane = value()?,
            "--cluster-token" => args.cluster_token = value()?,
            "--nodes" => args.nodes = value()?.parse().context("--nodes")?,
            "--seconds" => args.seconds = value()?.parse().context("--seconds")?,
            "--heartbeat-ms" => args.heartbeat = Duration::from_millis(value()?.parse().context("--heartbeat-ms")?),
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    Ok(args)
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let (wall, mono) = (SystemTime::now(), Instant::now());
    let to_unix = |at: Instant| unix_ms(wall + at.saturating_duration_since(mono));
    let (observer, mut arrivals) = mpsc::unbounded_channel::<Arrival>();
    let mut nodes = Vec::with_capacity(args.nodes);
    for index in 0..args.nodes {
        let mut options =
            SimOptions::new(args.control_plane.clone(), args.cluster_token.clone(), format!("sim-{index:05}"));
        options.heartbeat = args.heartbeat;
        nodes.push(SimNode::start_observed(options, index, Some(observer.clone()))?);
    }
    drop(observer);

    let deadline = tokio::time::sleep(Duration::from_secs(args.seconds));
    tokio::pin!(deadline);
    let mut poll = tokio::time::interval(Duration::from_millis(20));
    let mut connected = usize::MAX;
    // Per version: arrival time by node; a node's newest version so far.
    let mut by_version: BTreeMap<u64, Vec<Option<u64>>> = BTreeMap::new();
    let mut newest = vec![0u64; args.nodes];
    loop {
        tokio::select! {
            () = &mut deadline => break,
            _ = poll.tick() => {
                let now = nodes.iter().filter(|n| n.state().connected).count();
                if now != connected {
                    connected = now;
                    println!("{}", serde_json::json!({ "connected": now, "at_ms": unix_ms(SystemTime::now()) }));
                }
            }
            arrival = arrivals.recv() => {
                let Some(arrival) = arrival else { break };
                newest[arrival.node] = newest[arrival.node].max(arrival.version);
                let slots = by_version.entry(arrival.version).or_insert_with(|| vec![None; args.nodes]);
                slots[arrival.node].get_or_insert(to_unix(arrival.at));
                // A version is complete once every node has it or a newer one.
                while let Some((&version, slots)) = by_version.first_key_value() {
                    let complete = slots.iter().zip(&newest).all(|(slot, n)| slot.is_some() || *n > version);
                    if !complete {
                        break;
                    }
                    let times: Vec<u64> = slots.iter().flatten().copied().collect();
                    println!("{}", serde_json::json!({ "version": version, "arrivals_ms": times }));
                    by_version.remove(&version);
                }
            }
        }
    }
    Ok(())
}
