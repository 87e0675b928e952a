//! A small WebDriver client for the browser tests: starts Debian's
//! `chromedriver` on an ephemeral port, opens a headless Chromium session and
//! drives it (navigate, find, type, click, read text, run a script, take a
//! screenshot). WebDriver is JSON over HTTP, so this is reqwest and a few
//! endpoints of the W3C protocol rather than a crate. Like the shared
//! services, a missing `chromedriver` or `chromium` skips a test outside CI
//! and fails it under `CI=true`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::services::in_ci;
use crate::{WAIT, eventually};

/// The key WebDriver's "send keys" reads as Enter.
pub const ENTER: &str = "\u{E007}";

/// The W3C name of the field that holds an element reference.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where Debian's packages put them (`apt-get install chromium chromium-driver`).
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// A running `chromedriver`, in a process group of its own so that the
/// browsers it started go with it.
pub struct Chromedriver {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl Chromedriver {
    /// Starts chromedriver on a port of its choosing. `Ok(None)`: not
    /// installed and not under CI (the test should return after the note).
    pub async fn start() -> Result<Option<Self>> {
        let missing: Vec<&str> =
            [CHROMEDRIVER, CHROMIUM].into_iter().filter(|path| !Path::new(path).exists()).collect();
        if !missing.is_empty() {
            if in_ci() {
                bail!("{} missing, and CI=true: install Debian's chromium and chromium-driver", missing.join(" and "));
            }
            eprintln!("skipping: {} missing (apt-get install chromium chromium-driver)", missing.join(" and "));
            return Ok(None);
        }
        let mut child = Command::new(CHROMEDRIVER)
            .args(["--port=0", "--allowed-ips=127.0.0.1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .context("starting chromedriver")?;
        let stdout = child.stdout.take().context("chromedriver stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        // "ChromeDriver was started successfully on port 38985." (an earlier line names the port asked for, 0)
        let port = tokio::time::timeout(WAIT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(port) = line.split("started successfully on port ").nth(1) {
                    return port.trim_end_matches('.').trim().parse::<u16>().context("chromedriver's port");
                }
            }
            bail!("chromedriver exited before it listened")
        })
        .await
        .context("chromedriver did not say its port")??;
        // Keep reading so that chromedriver never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
        Ok(Some(Self { child, base: format!("http://127.0.0.1:{port}"), http }))
    }

    /// A new headless Chromium with a fresh profile and a laptop-sized window.
    pub async fn browser(&self) -> Result<Browser> {
        let capabilities = json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": CHROMIUM,
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                             "--window-size=1366,900", "--no-first-run", "--no-default-browser-check"],
                },
            }},
        });
        let value =
            call(&self.http, reqwest::Method::POST, &format!("{}/session", self.base), Some(capabilities)).await?;
        let id = value["sessionId"].as_str().with_context(|| format!("no sessionId in {value}"))?;
        Ok(Browser { http: self.http.clone(), session: format!("{}/session/{id}", self.base) })
    }

    /// Kills chromedriver and every browser it started (the process group,
    /// by its leader's pid).
    pub async fn stop(mut self) -> Result<()> {
        kill_group(&self.child);
        self.child.kill().await.ok();
        Ok(())
    }
}

impl Drop for Chromedriver {
    /// A failed test does not get to `stop`; its browsers must not outlive it.
    fn drop(&mut self) {
        kill_group(&self.child);
    }
}

fn kill_group(child: &Child) {
    if let Some(pid) = child.id() {
        let _ =
            std::process::Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).stderr(Stdio::null()).status();
    }
}

/// One browser session.
pub struct Browser {
    http: reqwest::Client,
    session: String,
}

/// An element of the page, as the session knows it.
#[derive(Debug, Clone)]
pub struct Element {
    id: String,
}

impl Browser {
    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
        call(&self.http, method, &format!("{}{path}", self.session), body).await
    }

    pub async fn goto(&self, url: &str) -> Result<()> {
        self.command(reqwest::Method::POST, "/url", Some(json!({ "url": url }))).await.map(drop)
    }

    pub async fn current_url(&self) -> Result<String> {
        let value = self.command(reqwest::Method::GET, "/url", None).await?;
        value.as_str().map(str::to_owned).context("url is not a string")
    }

    /// The first element matching a CSS selector, now.
    pub async fn find(&self, css: &str) -> Result<Element> {
        let value = self.command(reqwest::Method::POST, "/element", Some(selector(css))).await?;
        element(&value).with_context(|| format!("no element {css}"))
    }

    /// Every element matching a CSS selector, now.
    pub async fn find_all(&self, css: &str) -> Result<Vec<Element>> {
        let value = self.command(reqwest::Method::POST, "/elements", Some(selector(css))).await?;
        Ok(value.as_array().into_iter().flatten().filter_map(element).collect())
    }

    /// Waits until an element matching `css` exists (pages render after their API calls).
    pub async fn wait_for(&self, css: &str) -> Result<Element> {
        eventually(css, Duration::from_millis(100), || async { self.find(css).await.is_ok() }).await?;
        self.find(css).await
    }

    /// Waits until the text of the first element matching `css` contains `needle`; returns that text.
    pub async fn wait_for_text(&self, css: &str, needle: &str) -> Result<String> {
        let what = format!("{css} to contain {needle:?}");
        let found = eventually(&what, Duration::from_millis(100), || async {
            match self.find(css).await {
                Ok(element) => self.text(&element).await.is_ok_and(|text| text.contains(needle)),
                Err(_) => false,
            }
        })
        .await;
        match found {
            Ok(()) => self.text(&self.find(css).await?).await,
            Err(error) => {
                let seen = match self.find(css).await {
                    Ok(element) => self.text(&element).await.unwrap_or_default(),
                    Err(_) => "(no such element)".into(),
                };
                Err(error.context(format!("last text of {css}: {seen}")))
            }
        }
    }

    /// Clears an input and types `text` into it.
    pub async fn fill(&self, element: &Element, text: &str) -> Result<()> {
        self.command(reqwest::Method::POST, &format!("/element/{}/clear", element.id), Some(json!({}))).await?;
        self.type_keys(element, text).await
    }

    pub async fn type_keys(&self, element: &Element, text: &str) -> Result<()> {
        let path = format!("/element/{}/value", element.id);
        self.command(reqwest::Method::POST, &path, Some(json!({ "text": text }))).await.map(drop)
    }

    pub async fn click(&self, element: &Element) -> Result<()> {
        self.command(reqwest::Method::POST, &format!("/element/{}/click", element.id), Some(json!({}))).await.map(drop)
    }

    /// Finds then clicks.
    pub async fn click_on(&self, css: &str) -> Result<()> {
        let element = self.wait_for(css).await?;
        self.click(&element).await
    }

    /// The rendered text of an element.
    pub async fn text(&self, element: &Element) -> Result<String> {
        let value = self.command(reqwest::Method::GET, &format!("/element/{}/text", element.id), None).await?;
        Ok(value.as_str().unwrap_or_default().to_owned())
    }

    /// An element's attribute, `None` when absent.
    pub async fn attribute(&self, element: &Element, name: &str) -> Result<Option<String>> {
        let value =
            self.command(reqwest::Method::GET, &format!("/element/{}/attribute/{name}", element.id), None).await?;
        Ok(value.as_str().map(str::to_owned))
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page and returns its result.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value> {
        self.command(reqwest::Method::POST, "/execute/sync", Some(json!({ "script": script, "args": args }))).await
    }

    /// Saves a PNG of the viewport to `path`.
    pub async fn screenshot(&self, path: &Path) -> Result<()> {
        let value = self.command(reqwest::Method::GET, "/screenshot", None).await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(value.as_str().context("screenshot is not a string")?)
            .context("screenshot is not base64")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }

    /// Ends the session (the browser exits).
    pub async fn quit(self) -> Result<()> {
        call(&self.http, reqwest::Method::DELETE, &self.session, None).await.map(drop)
    }
}

fn selector(css: &str) -> Value {
    json!({ "using": "css selector", "value": css })
}

fn element(value: &Value) -> Option<Element> {
    value.get(ELEMENT_KEY).and_then(Value::as_str).map(|id| Element { id: id.to_owned() })
}

/// One WebDriver command: the answer's `value`, or its `error` and `message` as an error.
async fn call(http: &reqwest::Client, method: reqwest::Method, url: &str, body: Option<Value>) -> Result<Value> {
    let mut request = http.request(method.clone(), url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.with_context(|| format!("WebDriver {method} {url}"))?;
    let status = response.status();
    let mut answer: Value = response.json().await.with_context(|| format!("WebDriver {method} {url}: not JSON"))?;
    let value = answer.get_mut("value").map(Value::take).unwrap_or(Value::Null);
    if !status.is_success() {
        let error = value["error"].as_str().unwrap_or("unknown error");
        let message = value["message"].as_str().unwrap_or_default().lines().next().unwrap_or_default();
        return Err(anyhow!("WebDriver {method} {url}: {status} {error}: {message}"));
    }
    Ok(value)
}

/// Where a test saves its screenshots: `target/screenshots/<name>` beside the
/// workspace's build output (not committed).
pub fn screenshot_dir(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("screenshots").join(name)
}
