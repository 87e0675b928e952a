//! docker-compose.yml without Docker: every service that the Dockerfile builds
//! is started as a local process, running the binary of its Dockerfile stage
//! (`ENTRYPOINT`) with exactly the compose file's `command:` (else the stage's
//! `CMD`) and exactly its `environment:` (nothing inherited), as many times as
//! `deploy.replicas` says; then the demo config is applied and a request goes
//! through each data plane to the demo upstream. This keeps the compose file
//! honest: a flag or variable the binaries do not take fails here. The
//! `observability` profile's Prometheus targets are then scraped from these
//! processes and the Grafana dashboard's queries checked against what they
//! export (`observability.rs`).
//!
//! The only substitutions, because there is no container network here:
//! * `${VAR}`, `${VAR:-default}`, `${VAR:?message}` are filled from
//!   `.env.example`, as compose fills them from `.env`;
//! * a listen address `0.0.0.0:PORT` becomes `127.0.0.1:0` (an ephemeral port;
//!   the bound one is read from the process's JSON address line);
//! * `SERVICE:PORT` naming another started service (`http://control-plane:9090`)
//!   becomes that process's bound `127.0.0.1:port`;
//! * the `postgres` service is the machine's PostgreSQL: a database URL whose
//!   host is `postgres` becomes the URL of a fresh test database (so its user,
//!   password and database name change along with the host);
//! * a named volume is a directory of the test's own, and a path under a
//!   service's mount point (`/certs/ca.pem`) a path in that directory;
//! * services without `build:` (postgres; redis, prometheus and grafana, behind
//!   profiles) are not started;
//! * a one-shot service (`restart: "no"`, like `certs`) runs to completion,
//!   and must succeed, before the services that depend on it start.
//!
//! The Dockerfile's runtime stages are also checked here: distroless base,
//! a non-root `USER`, no `RUN` (nothing installed, no compiler).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use sluice_testkit::postgres::FreshDatabase;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::support::{WAIT, binary, eventually};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One build stage of the Dockerfile.
#[derive(Debug, Default)]
struct Stage {
    from: String,
    user: Option<String>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    runs: usize,
}

/// Stages by name (`FROM image AS name`), reading only the instructions the
/// checks need. Continuation lines are joined first.
fn dockerfile_stages(text: &str) -> Result<BTreeMap<String, Stage>> {
    let joined = text.replace("\\\n", " ");
    let mut stages = BTreeMap::new();
    let mut current: Option<(String, Stage)> = None;
    for line in joined.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (instruction, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim();
        match instruction.to_ascii_uppercase().as_str() {
            "FROM" => {
                if let Some((name, stage)) = current.take() {
                    stages.insert(name, stage);
                }
                let words: Vec<&str> = rest.split_whitespace().collect();
                let name = match words.as_slice() {
                    [image, as_, name] if as_.eq_ignore_ascii_case("as") => (image, name),
                    _ => bail!("unnamed stage `FROM {rest}`: every stage needs `AS name`"),
                };
                current = Some((name.1.to_string(), Stage { from: name.0.to_string(), ..Stage::default() }));
            }
            other => {
                let Some((_, stage)) = current.as_mut() else { continue };
                match other {
                    "USER" => stage.user = Some(rest.to_string()),
                    "ENTRYPOINT" => stage.entrypoint = serde_json::from_str(rest).context("ENTRYPOINT in exec form")?,
                    "CMD" => stage.cmd = serde_json::from_str(rest).context("CMD in exec form")?,
                    "RUN" => stage.runs += 1,
                    _ => {}
                }
            }
        }
    }
    if let Some((name, stage)) = current {
        stages.insert(name, stage);
    }
    Ok(stages)
}

/// `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?message}` and `$$`,
/// as compose interpolates them.
fn interpolate(text: &str, vars: &HashMap<String, String>) -> Result<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("$$") {
            out.push('$');
            rest = after;
            continue;
        }
        let Some(body) = rest.strip_prefix("${") else { bail!("unbraced variable in {text:?}: write ${{VAR}}") };
        let end = body.find('}').with_context(|| format!("unclosed ${{ in {text:?}"))?;
        let expression = &body[..end];
        let name_end = expression.find([':', '-', '?']).unwrap_or(expression.len());
        let (name, operator) = expression.split_at(name_end);
        let value = vars.get(name).filter(|v| !v.is_empty() || !operator.starts_with(':'));
        let value = match (value, operator) {
            (Some(v), _) => v.clone(),
            (None, op) if op.starts_with(":-") || op.starts_with('-') => op.trim_start_matches(':')[1..].to_string(),
            (None, op) if op.starts_with(":?") || op.starts_with('?') => bail!("{name} is required: {op}"),
            (None, _) => String::new(),
        };
        out.push_str(&value);
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn env_file(path: &Path) -> Result<HashMap<String, String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect())
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `--grpc-addr` or `SLUICE_GRPC_ADDR` -> `grpc_addr`, the key the binary
/// prints its bound address under.
fn address_key(setting: &str) -> String {
    setting.trim_start_matches("--").trim_start_matches("SLUICE_").replace('-', "_").to_ascii_lowercase()
}

/// A service as compose would start it, after substitution.
struct Service {
    name: String,
    program: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    /// Container port and the flag or variable that set it.
    listens: Vec<(u16, String)>,
    replicas: usize,
    depends_on: Vec<String>,
    healthcheck: Vec<String>,
    /// Named volume and where the service mounts it.
    mounts: Vec<(String, String)>,
    one_shot: bool,
}

/// Rewrites one value: listen addresses to ephemeral ports (recording them),
/// other services' `name:port` to their bound addresses, `postgres` to the
/// test database, paths in mounted volumes to the volumes' directories.
struct Rewriter<'a> {
    bound: &'a HashMap<(String, u16), SocketAddr>,
    database_url: &'a str,
    /// Mount point -> the volume's directory.
    mounts: Vec<(String, PathBuf)>,
}

impl Rewriter<'_> {
    fn value(&self, setting: &str, value: &str, listens: &mut Vec<(u16, String)>) -> String {
        if let Some(port) = value.strip_prefix("0.0.0.0:").and_then(|p| p.parse::<u16>().ok()) {
            listens.push((port, setting.to_string()));
            return "127.0.0.1:0".into();
        }
        for (mount, dir) in &self.mounts {
            if let Some(rest) =
                value.strip_prefix(mount.as_str()).filter(|rest| rest.is_empty() || rest.starts_with('/'))
            {
                return format!("{}{rest}", dir.display());
            }
        }
        if value.starts_with("postgres://") && value.contains("@postgres:") {
            return self.database_url.to_string();
        }
        let mut value = value.to_string();
        for ((service, port), addr) in self.bound {
            value = value.replace(&format!("{service}:{port}"), &addr.to_string());
        }
        value
    }
}

fn services(compose: &Value, stages: &BTreeMap<String, Stage>) -> Result<Vec<(Service, Value)>> {
    let mut out = Vec::new();
    for (name, spec) in compose["services"].as_object().context("no services")? {
        let Some(target) = spec["build"]["target"].as_str() else { continue };
        let stage = stages.get(target).with_context(|| format!("{name}: no Dockerfile stage {target}"))?;
        ensure!(
            stage.from.starts_with("gcr.io/distroless/"),
            "{target}: runtime base {} is not distroless",
            stage.from
        );
        let user = stage.user.as_deref().unwrap_or("root");
        ensure!(!matches!(user.split(':').next(), Some("root" | "0")), "{target} runs as {user}");
        ensure!(stage.runs == 0, "{target} runs commands in the runtime image");
        let program = stage.entrypoint.first().with_context(|| format!("{target}: no ENTRYPOINT"))?;
        let program = Path::new(program).file_name().and_then(|f| f.to_str()).context("entrypoint")?.to_string();
        let args = match spec.get("command") {
            Some(Value::Array(args)) => args.iter().map(scalar).collect(),
            Some(other) => bail!("{name}: write command in exec form (a list), not {other}"),
            None => stage.cmd.clone(),
        };
        let depends_on = match &spec["depends_on"] {
            Value::Array(list) => list.iter().map(scalar).collect(),
            Value::Object(map) => map.keys().cloned().collect(),
            _ => Vec::new(),
        };
        let healthcheck = spec["healthcheck"]["test"].as_array().map(|t| t.iter().map(scalar).collect());
        let mut mounts = Vec::new();
        for volume in spec["volumes"].as_array().into_iter().flatten() {
            let text = scalar(volume);
            let mut parts = text.split(':');
            let (Some(volume), Some(mount)) = (parts.next(), parts.next()) else {
                bail!("{name}: write volumes as NAME:/path[:ro], not {text}")
            };
            ensure!(compose["volumes"].get(volume).is_some(), "{name}: {volume} is not a named volume");
            mounts.push((volume.to_string(), mount.to_string()));
        }
        let service = Service {
            name: name.clone(),
            program,
            args,
            env: BTreeMap::new(),
            listens: Vec::new(),
            replicas: spec["deploy"]["replicas"].as_u64().map_or(1, |n| n as usize),
            depends_on,
            healthcheck: healthcheck.unwrap_or_default(),
            mounts,
            one_shot: scalar(&spec["restart"]) == "no",
        };
        out.push((service, spec.clone()));
    }
    Ok(out)
}

/// A started replica: its process, address line and collected stderr.
struct Running {
    _child: Child,
    line: Value,
    stderr: Arc<Mutex<String>>,
}

impl Running {
    fn addr(&self, key: &str) -> Result<SocketAddr> {
        scalar(&self.line[key]).parse().with_context(|| format!("no {key} in {}", self.line))
    }
}

async fn start(service: &Service, dir: &Path) -> Result<Running> {
    let mut child = Command::new(binary(&service.program))
        .args(&service.args)
        .env_clear()
        .envs(&service.env)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", service.program))?;
    let stderr = Arc::new(Mutex::new(String::new()));
    let sink = stderr.clone();
    let mut errors = BufReader::new(child.stderr.take().context("stderr")?).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = errors.next_line().await {
            if let Ok(mut buffer) = sink.lock() {
                buffer.push_str(&line);
                buffer.push('\n');
            }
        }
    });
    let mut stdout = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let first = tokio::time::timeout(WAIT, stdout.next_line()).await;
    let Ok(Ok(Some(first))) = first else {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let log = stderr.lock().map(|s| s.clone()).unwrap_or_default();
        bail!("{} printed no address line; stderr:\n{log}", service.name);
    };
    // Keep draining stdout (access log) so the process never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    let line = serde_json::from_str(&first).with_context(|| format!("{}: not JSON: {first}", service.name))?;
    Ok(Running { _child: child, line, stderr })
}

#[tokio::test]
async fn the_compose_stack_runs_as_written_and_serves_a_request() -> Result<()> {
    let Some(database) = FreshDatabase::create("compose").await? else { return Ok(()) };
    run_stack(&database.url).await
}

async fn run_stack(database_url: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let vars = env_file(&root().join(".env.example"))?;
    let compose: Value = yaml_serde::from_str(&std::fs::read_to_string(root().join("docker-compose.yml"))?)
        .context("docker-compose.yml is not YAML")?;
    let stages = dockerfile_stages(&std::fs::read_to_string(root().join("Dockerfile"))?)?;
    let mut pending = services(&compose, &stages)?;
    let names: Vec<String> = pending.iter().map(|(s, _)| s.name.clone()).collect();
    ensure!(names.len() == 4, "expected certs, control-plane, data-plane and demo-upstream to be built: {names:?}");

    let mut bound: HashMap<(String, u16), SocketAddr> = HashMap::new();
    let mut running: BTreeMap<String, (Service, Vec<Running>)> = BTreeMap::new();
    // In dependency order, so that each service's references resolve to bound addresses.
    while !pending.is_empty() {
        let ready = pending
            .iter()
            .position(|(s, _)| s.depends_on.iter().all(|d| running.contains_key(d) || !names.contains(d)))
            .context("depends_on has a cycle")?;
        let (mut service, spec) = pending.remove(ready);
        let mut mounts = Vec::new();
        for (volume, mount) in &service.mounts {
            let volume_dir = dir.path().join("volumes").join(volume);
            std::fs::create_dir_all(&volume_dir)?;
            mounts.push((mount.clone(), volume_dir));
        }
        let rewriter = Rewriter { bound: &bound, database_url, mounts };
        let mut listens = Vec::new();
        let mut args = Vec::new();
        let mut previous = String::new();
        for arg in &service.args {
            let arg = interpolate(arg, &vars)?;
            args.push(rewriter.value(&previous, &arg, &mut listens));
            previous = arg;
        }
        for (key, value) in spec["environment"].as_object().into_iter().flatten() {
            let value = interpolate(&scalar(value), &vars)?;
            service.env.insert(key.clone(), rewriter.value(key, &value, &mut listens));
        }
        service.args = args;
        service.listens = listens;
        if service.one_shot {
            let output = Command::new(binary(&service.program))
                .args(&service.args)
                .env_clear()
                .envs(&service.env)
                .current_dir(dir.path())
                .output()
                .await?;
            ensure!(output.status.success(), "{} failed: {}", service.name, String::from_utf8_lossy(&output.stderr));
            running.insert(service.name.clone(), (service, Vec::new()));
            continue;
        }
        let mut replicas = Vec::new();
        for _ in 0..service.replicas {
            replicas.push(start(&service, dir.path()).await?);
        }
        // Replicas have no fixed host ports; references to a scaled service go to the first.
        for (port, setting) in &service.listens {
            bound.insert((service.name.clone(), *port), replicas[0].addr(&address_key(setting))?);
        }
        running.insert(service.name.clone(), (service, replicas));
    }

    let (cp, cps) = running.get("control-plane").context("control-plane")?;
    let (dp, dps) = running.get("data-plane").context("data-plane")?;
    let admin_url = format!("http://{}", cps[0].addr("admin_addr")?);
    let admin_token = cp.env.get("SLUICE_ADMIN_TOKEN").context("SLUICE_ADMIN_TOKEN")?;
    ensure!(dps.len() == 2, "two data planes by default, got {}", dps.len());
    ensure!(cps[0].line["grpc_tls"] == true, "the planes sync over TLS by default: {}", cps[0].line);
    ensure!(dp.env.get("SLUICE_CONTROL_PLANE").is_some_and(|url| url.starts_with("https://")), "{:?}", dp.env);

    // The readiness healthcheck, run as Docker would inside each data-plane
    // container: same binary, same environment, with the ops port it bound.
    ensure!(dp.healthcheck.first().map(String::as_str) == Some("CMD"), "healthcheck: {:?}", dp.healthcheck);
    let probe_program = dp.healthcheck.get(1).and_then(|p| Path::new(p).file_name()).context("probe")?;
    for replica in dps {
        let mut env = dp.env.clone();
        for (_, setting) in dp.listens.iter().filter(|(_, s)| s.starts_with("SLUICE_")) {
            env.insert(setting.clone(), replica.addr(&address_key(setting))?.to_string());
        }
        let probe = || async {
            Command::new(binary(probe_program.to_str().unwrap_or_default()))
                .args(&dp.healthcheck[2..])
                .env_clear()
                .envs(&env)
                .output()
                .await
                .is_ok_and(|o| o.status.success())
        };
        let log = || replica.stderr.lock().map(|s| s.clone()).unwrap_or_default();
        eventually("the data plane's healthcheck to pass", probe).await.with_context(log)?;
    }

    // The demo config, pointed at the demo upstream's bound address.
    let demo = std::fs::read_to_string(root().join("examples/demo.yaml"))?;
    let upstream = bound.get(&("demo-upstream".into(), 9001)).context("demo-upstream:9001")?;
    let demo_file = dir.path().join("demo.yaml");
    std::fs::write(&demo_file, demo.replace("demo-upstream:9001", &upstream.to_string()))?;
    let applied = Command::new(binary("sluice"))
        .args(["--admin-url", &admin_url, "--admin-token", admin_token, "apply", "-f"])
        .arg(&demo_file)
        .output()
        .await?;
    ensure!(applied.status.success(), "apply: {}", String::from_utf8_lossy(&applied.stderr));

    let client = reqwest::Client::new();
    for replica in dps {
        let url = format!("http://{}/demo/hello", replica.addr("http_addr")?);
        let served = || async {
            let Ok(response) = client.get(&url).header("apikey", "demo-key").send().await else { return false };
            response.status() == 200
                && response.json::<Value>().await.is_ok_and(|echo| echo["server"] == "demo" && echo["path"] == "/hello")
        };
        eventually("the demo API through the data plane", served).await?;
        let anonymous = client.get(&url).send().await?;
        ensure!(anonymous.status() == 401, "without the key: {}", anonymous.status());
    }

    let nodes: Value =
        client.get(format!("{admin_url}/v1/data-planes")).bearer_auth(admin_token).send().await?.json().await?;
    ensure!(nodes["items"].as_array().map(Vec::len) == Some(2), "data planes: {nodes}");

    // The demo's rate limit (60 a minute per consumer and node) refuses one, so
    // that the dashboard's rate-limit panel has its series too.
    let url = format!("http://{}/demo/more", dps[0].addr("http_addr")?);
    let mut limited = false;
    for _ in 0..70 {
        if client.get(&url).header("apikey", "demo-key").send().await?.status() == 429 {
            limited = true;
            break;
        }
    }
    ensure!(limited, "the demo's rate limit never refused");

    // Prometheus's targets, scraped as it would inside the compose network.
    let prometheus = std::fs::read_to_string(root().join("deploy/prometheus/prometheus.yml"))?;
    let mut scrapes = Vec::new();
    for (host, port, path) in crate::observability::scrape_targets(&prometheus)? {
        let (service, replicas) =
            running.get(&host).with_context(|| format!("prometheus.yml scrapes {host}, no service"))?;
        let (_, setting) = service.listens.iter().find(|(listen, _)| *listen == port).with_context(|| {
            format!("prometheus.yml scrapes {host}:{port}; {host} listens on {:?}", service.listens)
        })?;
        for replica in replicas {
            let url = format!("http://{}{path}", replica.addr(&address_key(setting))?);
            let response = client.get(&url).send().await?;
            ensure!(response.status() == 200, "{url}: {}", response.status());
            scrapes.push(response.text().await?);
        }
    }
    ensure!(scrapes.len() == 3, "two data planes and a control plane scraped, got {}", scrapes.len());
    crate::observability::check_dashboard(&root(), &scrapes)
}

#[test]
fn interpolation_follows_compose() -> Result<()> {
    let vars: HashMap<String, String> = [("A".into(), "x".into()), ("E".into(), String::new())].into();
    assert_eq!(interpolate("${A}/${B:-d}/${E:-d}/${E-d}/$$", &vars)?, "x/d/d//$");
    assert!(interpolate("${B:?set B}", &vars).is_err());
    Ok(())
}
