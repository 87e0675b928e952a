//! Fleet convergence, model-based (issue 24): a real `sluice-cp` process and
//! simulated data planes (testkit's `SimNode`, some slow, some refusing some
//! content), driven through a random sequence of writes, reverts, rollbacks,
//! lost pushes, pauses, disconnects, restarts without cache and control-plane
//! restarts. After every step, every connected node that is not paused must
//! run the newest snapshot it does not refuse, and the control plane must say
//! so, within a generous deadline.
//!
//! Seeded and reproducible: the seed is printed first;
//! `SLUICE_FLEET_MODEL_SEED=<seed>` replays a run and
//! `SLUICE_FLEET_MODEL_STEPS=<n>` makes it longer (default 30 steps).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sluice_proto::v1::policy::Kind;
use sluice_testkit::sim_node::{Faults, Pushed, SimNode, SimOptions};
use sluice_testkit::{Process, control_plane_args};

const ADMIN_TOKEN: &str = "fleet-model-admin-token";
const CLUSTER_TOKEN: &str = "fleet-model-cluster-token";
/// Bound on every convergence wait: generous, since the machine is shared.
const CONVERGE: Duration = Duration::from_secs(30);
/// Values API `a`'s header takes: few, so that writes often revert to
/// content (and a hash) seen before.
const VALUES: u32 = 4;

/// The configuration the model varies: API `a`'s header value, and whether
/// API `b` exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Content {
    value: u32,
    with_b: bool,
}

impl Content {
    fn document(self) -> Value {
        let mut apis = vec![json!({
            "name": "a", "path_prefix": "/a", "upstream": "u",
            "policies": [{ "headers": { "request": { "set": { "x-rev": format!("v{}", self.value) } } } }],
        })];
        if self.with_b {
            apis.push(json!({ "name": "b", "path_prefix": "/b", "upstream": "u" }));
        }
        json!({ "upstreams": [{ "name": "u", "targets": [{ "url": "http://127.0.0.1:9" }] }], "apis": apis })
    }
}

/// What each simulated node refuses: node 1 refuses `a` = v3, node 3 any
/// configuration with `b`, as data planes of another build might.
fn refusal(node: usize) -> Option<fn(Content) -> bool> {
    match node {
        1 => Some(|c: Content| c.value == 3),
        3 => Some(|c: Content| c.with_b),
        _ => None,
    }
}

/// Reads the model's content back out of a pushed snapshot.
fn content_of(pushed: &Pushed) -> Option<Content> {
    let snapshot = pushed.decode().ok()?;
    let a = snapshot.apis.iter().find(|api| api.name == "a")?;
    let value = a.policies.iter().find_map(|p| match &p.kind {
        Some(Kind::Headers(h)) => h.request.as_ref()?.set.iter().find(|v| v.name == "x-rev").map(|v| v.value.clone()),
        _ => None,
    })?;
    let value = value.strip_prefix('v')?.parse().ok()?;
    Some(Content { value, with_b: snapshot.apis.iter().any(|api| api.name == "b") })
}

struct ControlPlane {
    process: Process,
    admin: String,
    grpc: std::net::SocketAddr,
}

struct Fleet {
    dir: tempfile::TempDir,
    cp: ControlPlane,
    http: reqwest::Client,
    nodes: Vec<SimNode>,
    /// version -> (hash, content) of every committed snapshot.
    history: BTreeMap<u64, (String, Option<Content>)>,
    current: Content,
    rng: StdRng,
    seed: u64,
}

async fn start_control_plane(dir: &std::path::Path, grpc: &str) -> Result<ControlPlane> {
    let database = format!("sqlite://{}", dir.join("sluice.db").display());
    let secret = "5e".repeat(32);
    let mut args = control_plane_args(&database, grpc, ADMIN_TOKEN, CLUSTER_TOKEN, &secret);
    // A lost push is sent again after this long.
    args.extend(["--ack-timeout", "1s"]);
    let process = Process::spawn(env!("CARGO_BIN_EXE_sluice-cp"), &args, &[("RUST_LOG", "info")]).await?;
    let admin = format!("http://{}", process.addr("admin_addr")?);
    let grpc = process.addr("grpc_addr")?;
    Ok(ControlPlane { process, admin, grpc })
}

impl Fleet {
    async fn start(seed: u64) -> Result<Fleet> {
        let dir = tempfile::tempdir()?;
        let cp = start_control_plane(dir.path(), "127.0.0.1:0").await?;
        let mut fleet = Fleet {
            dir,
            cp,
            http: reqwest::Client::new(),
            nodes: Vec::new(),
            history: BTreeMap::new(),
            current: Content { value: 0, with_b: false },
            rng: StdRng::seed_from_u64(seed),
            seed,
        };
        fleet.record_head(None).await?;
        let current = fleet.current;
        fleet.put(current).await?;
        for index in 0..4 {
            let mut options =
                SimOptions::new(format!("http://{}", fleet.cp.grpc), CLUSTER_TOKEN, format!("sim-{index}"));
            options.heartbeat = Duration::from_millis(500);
            options.reconnect_delay = Duration::from_millis(50);
            let node = SimNode::start(options)?;
            let refuses = refusal(index);
            node.set_faults(Faults {
                // Node 2 compiles slowly, so pushes overlap with commits.
                delay: if index == 2 { Duration::from_millis(150) } else { Duration::ZERO },
                lose_next: 0,
                refuse: refuses.map(|refuses| {
                    Arc::new(move |pushed: &Pushed| {
                        content_of(pushed).filter(|c| refuses(*c)).map(|c| format!("this build cannot take {c:?}"))
                    }) as _
                }),
            });
            fleet.nodes.push(node);
        }
        Ok(fleet)
    }

    async fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
        let mut request = self.http.request(method, format!("{}{path}", self.cp.admin)).bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.with_context(|| format!("admin {path}"))?;
        let status = response.status();
        let text = response.text().await?;
        ensure!(status.is_success(), "admin {path}: {status}: {text}");
        Ok(if text.is_empty() { Value::Null } else { serde_json::from_str(&text)? })
    }

    /// Records the head's version and hash, with `content` when known.
    async fn record_head(&mut self, content: Option<Content>) -> Result<u64> {
        let page = self.admin(reqwest::Method::GET, "/v1/snapshots?limit=1", None).await?;
        let head = page["items"].get(0).context("no snapshot")?;
        let version = head["version"].as_u64().context("version")?;
        let hash = head["hash"].as_str().context("hash")?.to_owned();
        self.history.entry(version).or_insert((hash, content));
        Ok(version)
    }

    async fn put(&mut self, content: Content) -> Result<()> {
        self.admin(reqwest::Method::PUT, "/v1/config", Some(content.document())).await?;
        self.current = content;
        self.record_head(Some(content)).await?;
        Ok(())
    }

    fn random_content(&mut self) -> Content {
        Content { value: self.rng.random_range(0..VALUES), with_b: self.rng.random_bool(0.3) }
    }

    /// The hash node `index` must end on: the newest snapshot whose content it
    /// does not refuse.
    fn expected(&self, index: usize) -> Option<&str> {
        self.history.values().rev().find_map(|(hash, content)| {
            let refused = match (refusal(index), content) {
                (Some(refuses), Some(content)) => refuses(*content),
                _ => false,
            };
            (!refused).then_some(hash.as_str())
        })
    }

    /// The invariant: every connected node not paused runs its expected
    /// snapshot, and the control plane records it so.
    async fn check(&self, step: usize, what: &str) -> Result<()> {
        for (index, node) in self.nodes.iter().enumerate() {
            if node.is_paused() {
                continue;
            }
            let expected = self.expected(index).context("no expected snapshot")?.to_owned();
            node.wait_until(CONVERGE, |state| {
                state.connected && state.running.as_ref().is_some_and(|(_, hash)| *hash == expected)
            })
            .await
            .with_context(|| format!("seed {} step {step} ({what}): node {index} did not converge", self.seed))?;
        }
        let deadline = tokio::time::Instant::now() + CONVERGE;
        loop {
            let page = self.admin(reqwest::Method::GET, "/v1/data-planes", None).await?;
            let wrong: Vec<String> = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, node)| !node.is_paused())
                .filter_map(|(index, node)| {
                    let expected = self.expected(index)?;
                    let record = page["items"].as_array()?.iter().find(|r| r["node_id"] == node.node_id());
                    let fine = record.is_some_and(|r| r["connected"] == true && r["applied_hash"] == expected);
                    (!fine).then(|| format!("{}: {record:?}", node.node_id()))
                })
                .collect();
            if wrong.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("seed {} step {step} ({what}): the control plane's records disagree: {wrong:?}", self.seed);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn restart_control_plane(&mut self) -> Result<()> {
        self.cp.process.kill().await?;
        let grpc = self.cp.grpc.to_string();
        self.cp = start_control_plane(self.dir.path(), &grpc).await?;
        Ok(())
    }

    /// One random event; returns its description.
    async fn step(&mut self) -> Result<String> {
        let node = self.rng.random_range(0..self.nodes.len());
        Ok(match self.rng.random_range(0..10) {
            0..=2 => {
                let content = self.random_content();
                self.put(content).await?;
                format!("write {content:?}")
            }
            3 => {
                // Issue 24, finding 1: a change and its revert while a node is stopped.
                let before = self.current;
                let change = Content { value: (before.value + 1) % VALUES, ..before };
                self.nodes[node].pause();
                self.put(change).await?;
                self.put(before).await?;
                // Resumed only once the revert has reached the rest of the
                // fleet, i.e. the control plane took it in while the node was
                // still stopped on the change.
                let witness = if node == 0 { 2 } else { 0 };
                let head = self.expected(witness).context("no head")?.to_owned();
                self.nodes[witness]
                    .wait_until(CONVERGE, |state| state.running.as_ref().is_some_and(|(_, hash)| *hash == head))
                    .await?;
                self.nodes[node].resume();
                format!("node {node} paused over a write and its revert")
            }
            4 => {
                let versions: Vec<u64> = self.history.keys().copied().collect();
                let version = versions[self.rng.random_range(0..versions.len())];
                let content = self.history[&version].1;
                self.admin(reqwest::Method::POST, &format!("/v1/snapshots/{version}/rollback"), None).await?;
                if let Some(content) = content {
                    self.current = content;
                }
                self.record_head(content).await?;
                format!("rollback to {version}")
            }
            5 => {
                self.nodes[node].update_faults(|faults| faults.lose_next = 1);
                let content = self.random_content();
                self.put(content).await?;
                format!("node {node} loses the next push; write {content:?}")
            }
            6 => {
                self.nodes[node].hang_up();
                format!("node {node} drops its stream")
            }
            7 => {
                self.nodes[node].restart_without_cache();
                format!("node {node} restarts without cache")
            }
            8 => {
                for _ in 0..self.rng.random_range(2..6) {
                    let content = self.random_content();
                    self.put(content).await?;
                }
                "burst of writes".to_owned()
            }
            _ => {
                self.restart_control_plane().await?;
                "control plane restart".to_owned()
            }
        })
    }
}

#[tokio::test]
async fn every_node_converges_after_any_sequence_of_events() -> Result<()> {
    let seed = match std::env::var("SLUICE_FLEET_MODEL_SEED") {
        Ok(seed) => seed.parse().context("SLUICE_FLEET_MODEL_SEED")?,
        Err(_) => rand::rng().random(),
    };
    let steps: usize = match std::env::var("SLUICE_FLEET_MODEL_STEPS") {
        Ok(steps) => steps.parse().context("SLUICE_FLEET_MODEL_STEPS")?,
        Err(_) => 30,
    };
    eprintln!("fleet model: seed {seed} (replay with SLUICE_FLEET_MODEL_SEED={seed}), {steps} steps");
    let mut fleet = Fleet::start(seed).await?;
    fleet.check(0, "start").await?;
    for step in 1..=steps {
        let what = fleet.step().await?;
        eprintln!("step {step}: {what}");
        if let Err(error) = fleet.check(step, &what).await {
            eprintln!("control plane log:\n{}", fleet.cp.process.stderr());
            return Err(error);
        }
    }
    Ok(())
}
