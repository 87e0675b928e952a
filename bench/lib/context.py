"""What every scenario shares: binaries, CPU layout, timing, fixtures, and the
helpers that start upstreams and generate request bodies and certificates."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import peers, procs
from .load import Layout, Request, Target

BASIC_USER, BASIC_PASSWORD = "loadtest", "secret"
BASIC_HEADER = "Basic " + base64.b64encode(f"{BASIC_USER}:{BASIC_PASSWORD}".encode()).decode()
SMALL_BODY = b'{"name":"Mangos","price":2.79}'


@dataclass
class Context:
    repo: Path
    bins: Path
    workdir: Path
    pin: bool
    quick: bool
    rounds: int
    duration: float
    warmup: float
    gateway_cpus: str | None
    other_cpus: str | None     # client (wrk) and upstreams
    gateway_cores: int
    client_threads: int

    @property
    def layout(self) -> Layout:
        return Layout(self.other_cpus, self.client_threads)

    @property
    def fixtures(self) -> Path:
        return self.repo / "examples" / "fruitshop"

    def scenario_dir(self, name: str) -> Path:
        d = self.workdir / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def upstream(self, workdir: Path, name: str, tls: "Certs | None" = None) -> tuple[procs.Proc, str]:
        argv = [str(self.bins / "sluice-test-upstream"), "--addr", "127.0.0.1:0", "--name", name]
        if tls is not None:
            argv += ["--tls-cert", str(tls.leaf), "--tls-key", str(tls.leaf_key)]
        proc = procs.start(f"upstream-{name}", argv, workdir, cpus=self.other_cpus)
        return proc, proc.first_json_line()["addr"]


def body_1066() -> bytes:
    """A deterministic 1,066-byte JSON product document (Membrane's test 1 body size)."""
    doc = {"name": "Mangos", "price": 2.79, "category": "fruit", "origin": "Brazil",
           "tags": [f"tag-{i}" for i in range(12)],
           "stock": [{"warehouse": f"W{i:02d}", "quantity": 10 * i + 7} for i in range(8)],
           "description": ""}
    base = len(json.dumps(doc, separators=(",", ":")).encode())
    filler = "Sweet, juicy and ripe. "
    text = (filler * 100)[: 1066 - base]
    doc["description"] = text
    data = json.dumps(doc, separators=(",", ":")).encode()
    assert len(data) == 1066, len(data)
    return data


@dataclass
class Certs:
    ca: Path
    leaf: Path
    leaf_key: Path

    def sluice_default(self, name: str) -> dict:
        """The leaf as the certificate Sluice's admin API takes, served for every host (`default`)."""
        return {"name": name, "chain": self.leaf.read_text(), "key": self.leaf_key.read_text(), "default": True}


def make_certs(d: Path) -> Certs:
    """A CA and a leaf for localhost / 127.0.0.1 (ECDSA P-256), made with openssl at run time."""
    d.mkdir(parents=True, exist_ok=True)
    ext = d / "leaf.ext"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                   "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=Sluice bench CA")
    run("req", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=localhost")
    run("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "leaf.pem", "-days", "2", "-extfile", "leaf.ext")
    return Certs(d / "ca.pem", d / "leaf.pem", d / "leaf.key")


def htpasswd_ssha(path: Path) -> Path:
    """nginx htpasswd with a salted SHA-1 ({SSHA}): see RESULTS.md on why not apr1."""
    salt = os.urandom(8)
    digest = hashlib.sha1(BASIC_PASSWORD.encode() + salt).digest()
    path.write_text(f"{BASIC_USER}:{{SSHA}}{base64.b64encode(digest + salt).decode()}\n")
    return path


def send(url: str, method: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, dict, bytes]:
    """One request on a new connection (HTTPS unverified: the run's own certificates); returns the status,
    the response headers (lower-cased names) and the body."""
    scheme, rest = url.split("://", 1)
    hostport, _, path = rest.partition("/")
    host, port = hostport.rsplit(":", 1)
    if scheme == "https":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, int(port), timeout=10, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, "/" + path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def request_headers(request: Request) -> dict[str, str]:
    """The headers wrk sends for request (as lua/bench.lua builds them), for requests made from Python."""
    headers = {"Content-Type": "application/json"} if request.body_file else {}
    if request.auth:
        headers["Authorization"] = request.auth
    for name, value in request.headers.items():
        headers = {k: v for k, v in headers.items() if k.lower() != name.lower()}
        headers[name] = value
    return headers


def check(target: Target, expect_header: str | None = None) -> dict:
    """One request through target before measuring it: must be 2xx; returns the echo (JSON) if any."""
    request = target.request
    body = request.body_file.read_bytes() if request.body_file else None
    status, answered, data = send(target.url, request.method, body, request_headers(request))
    if not 200 <= status < 300:
        raise RuntimeError(f"{target.label}: {request.method} {target.url} -> {status}: {data[:500]!r}")
    try:
        echo = json.loads(data)
    except ValueError:
        return {}
    check_same_job(target.label, echo, answered)
    return echo


def check_same_job(label: str, echo: dict, answered: dict[str, str]) -> None:
    """Every gateway compared adds what Sluice adds by default (`peers.FORWARDED_FIELDS`): the upstream's
    echo of the request's fields holds them, and so does the answer."""
    if not isinstance(echo, dict) or "headers" not in echo:
        return
    seen = {name.lower() for name in echo["headers"]}
    missing = [f for f in peers.FORWARDED_FIELDS if f not in seen]
    missing += [f"{f} (in the answer)" for f in peers.ANSWERED_FIELDS if f not in answered]
    if missing:
        raise RuntimeError(f"{label} does not do the same job as the others: no {', '.join(missing)}")
