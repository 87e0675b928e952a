"""bench/profile --gateways: Sluice, nginx and HAProxy side by side under callgrind, on the same requests:
user-space instructions and heap allocation calls per request, which do not move with the machine's load.

Each gateway runs alone under `valgrind --tool=callgrind --instr-atstart=no` (nginx `master_process off`,
one worker, in the foreground; HAProxy `nbthread 1`; Sluice `SLUICE_WORKER_THREADS=1`), with upstream
keep-alive and no per-request logging, in front of the same `sluice-test-upstream` processes (not under
valgrind). Per case: counting is switched on, `warmup` requests go through the case's keep-alive client
connections (so every connection, upstream ones and TLS sessions included, is open), the counters are
zeroed, `requests` more go through, and the dump's totals are divided by them. Loopback only; every
process is stopped by pid."""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import peers, procs
from .callgrind import callgrind_control, dump_costs, self_costs
from .context import (BASIC_HEADER, BASIC_PASSWORD, BASIC_USER, Certs, body_1066, check_same_job, htpasswd_ssha,
                      make_certs)
from .sluice import Sluice


@dataclass
class Case:
    name: str
    what: str
    method: str
    tls: bool
    body: bytes | None
    headers: dict[str, str]


def cases() -> list[Case]:
    body = body_1066()
    json_body = {"Content-Type": "application/json"}
    return [
        Case("proxy", "POST of a 1,066-byte JSON body to one upstream (bench/run's `proxy`)", "POST", False, body,
             json_body),
        Case("get", "GET, round robin over 3 upstreams (bench/run's `round-robin`)", "GET", False, None, {}),
        Case("secured", "HTTPS in, basic auth, a per-consumer rate limit that never rejects, HTTPS to the "
             "upstream; the same POST (bench/run's `secured`)", "POST", True, body,
             {**json_body, "Authorization": BASIC_HEADER}),
    ]


@dataclass
class Gateway:
    """One gateway under callgrind: its process and, per case name, where to send the case's request."""
    name: str
    proc: procs.Proc
    urls: dict[str, tuple[str, int, str]]  # case -> (host, port, path)
    same_job: bool = True  # adds what Sluice adds (see peers.FORWARDED_FIELDS)


def valgrind(workdir: Path, name: str, simulate: bool) -> list[str]:
    """`simulate`: also callgrind's cache and branch-predictor simulation (several times slower)."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={workdir}/callgrind.{name}.%p",
            *(["--cache-sim=yes", "--branch-sim=yes", *core_cache()] if simulate else [])]


def core_cache(cache: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> list[str]:
    """callgrind's last-level cache set to one core's own L2, read from sysfs: on a virtual machine the L3
    callgrind would take is the host's, shared with every other guest, and a gateway's per-connection state
    that outgrows the L2 is what is missed from one request of a connection to its next."""
    for index in sorted(cache.glob("index*")):
        def read(name: str) -> str:
            return (index / name).read_text().strip()
        try:
            if read("level") == "2" and read("type") == "Unified":
                size = int(read("size").rstrip("K")) * 1024
                return [f"--LL={size},{read('ways_of_associativity')},{read('coherency_line_size')}"]
        except (OSError, ValueError):
            return []
    return []


class Clients:
    """`connections` keep-alive client connections to one gateway for one case, each driven by its own
    thread, so the gateway sees the same concurrency whatever it is."""

    def __init__(self, case: Case, target: tuple[str, int, str], ca: Path, connections: int):
        host, port, self.path = target
        self.case = case
        context = ssl.create_default_context(cafile=str(ca)) if case.tls else None
        self.conns = [http.client.HTTPSConnection(host, port, timeout=300, context=context) if case.tls
                      else http.client.HTTPConnection(host, port, timeout=300) for _ in range(connections)]

    def send(self, total: int) -> None:
        failures: list[str] = []
        each = [total // len(self.conns) + (1 if i < total % len(self.conns) else 0) for i in range(len(self.conns))]

        def run(conn: http.client.HTTPConnection, n: int) -> None:
            try:
                for _ in range(n):
                    conn.request(self.case.method, self.path, body=self.case.body, headers=self.case.headers)
                    response = conn.getresponse()
                    response.read()
                    if response.status // 100 != 2:
                        failures.append(f"{self.case.method} {self.path} -> {response.status}")
                        return
            except OSError as e:
                failures.append(f"{self.case.method} {self.path}: {e}")

        threads = [threading.Thread(target=run, args=(conn, n)) for conn, n in zip(self.conns, each)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise RuntimeError(f"{self.case.name}: {len(failures)} failures, first: {failures[0]}")

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


def measure(gateway: Gateway, case: Case, ca: Path, workdir: Path, connections: int, warmup: int,
            requests: int) -> dict:
    pid = str(gateway.proc.pid)
    clients = Clients(case, gateway.urls[case.name], ca, connections)
    try:
        callgrind_control("-i", "on", pid)
        clients.send(warmup)
        callgrind_control("-z", pid)
        clients.send(requests)
        before = set(workdir.glob(f"callgrind.{gateway.name}.*"))
        callgrind_control("-d", case.name, pid)
        callgrind_control("-i", "off", pid)
    finally:
        clients.close()
    dumps = sorted(set(workdir.glob(f"callgrind.{gateway.name}.*")) - before, key=lambda f: f.stat().st_mtime)
    if not dumps:
        raise RuntimeError(f"callgrind wrote no dump for {gateway.name} {case.name}")
    events, allocations = dump_costs(dumps[-1])
    figures = {"instructions": events["Ir"] / requests, "allocations": allocations / requests,
               "top": top_functions(dumps[-1], requests)}
    simulated = {event: count / requests for event, count in events.items() if event != "Ir"}
    return {**figures, "simulated": simulated} if simulated else figures


# How many functions RESULTS.md names per gateway and case, by their own instructions (issue 26: where a
# target is missed, what is left).
TOP_FUNCTIONS = 12


def top_functions(dump: Path, requests: int) -> list[list]:
    """The functions that executed the most instructions themselves (callees not counted), as
    [name, instructions per request], most first."""
    costs = sorted(self_costs(dump).items(), key=lambda item: -item[1])[:TOP_FUNCTIONS]
    return [[name, count / requests] for name, count in costs]


def check_upstream_saw(gateway: Gateway, case: Case, ca: Path) -> None:
    """One request before measuring: the answer is the upstream's echo of the whole body and, where the
    case authenticates, the upstream saw the consumer and not the credentials; a wrong password is refused."""
    host, port, path = gateway.urls[case.name]
    context = ssl.create_default_context(cafile=str(ca)) if case.tls else None

    def once(headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        conn = (http.client.HTTPSConnection(host, port, timeout=300, context=context) if case.tls
                else http.client.HTTPConnection(host, port, timeout=300))
        try:
            conn.request(case.method, path, body=case.body, headers=headers)
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    status, answered, data = once(case.headers)
    if status != 200:
        raise RuntimeError(f"{gateway.name} {case.name}: {status} {data[:300]!r}")
    echo = json.loads(data)
    if gateway.same_job:
        check_same_job(f"{gateway.name} {case.name}", echo, answered)
    if echo.get("body_len") != len(case.body or b""):
        raise RuntimeError(f"{gateway.name} {case.name}: the upstream got {echo.get('body_len')} body bytes")
    if "Authorization" in case.headers:
        seen = {k.lower(): v for k, v in echo.get("headers", {}).items()}
        if "authorization" in seen or seen.get("x-consumer-username") != BASIC_USER:
            raise RuntimeError(f"{gateway.name} {case.name}: the upstream saw {seen}")
        status, _, _ = once({**case.headers, "Authorization": "Basic Zm9vOmJhcg=="})
        if status != 401:
            raise RuntimeError(f"{gateway.name} {case.name}: a wrong password got {status}")


@dataclass
class Upstreams:
    plain: str
    pool: list[str]
    tls: str


def start_sluice(bins: Path, workdir: Path, up: Upstreams, certs: Certs, simulate: bool) -> tuple[Sluice, Gateway]:
    sluice = Sluice(bins, workdir, gateway_cpus=None, gateway_cores=1)
    sluice.start_control_plane()
    dp = sluice.start_data_plane("sluice-dp", wrapper=valgrind(workdir, "sluice", simulate))
    sluice.configure({
        "certificates": [certs.sluice_default("profile")],
        "upstreams": [{"name": "backend", "targets": [{"url": f"http://{up.plain}"}]},
                      {"name": "pool", "targets": [{"url": f"http://{a}"} for a in up.pool],
                       "balance": "round_robin"},
                      {"name": "backend-tls", "targets": [{"url": f"https://{up.tls}"}],
                       "tls": {"ca_bundle": certs.ca.read_text()}}],
        "consumers": [{"username": BASIC_USER, "basic_auth": {"password": BASIC_PASSWORD}}],
        "apis": [{"name": "shop", "path_prefix": "/shop/v2", "upstream": "backend"},
                 {"name": "rr", "path_prefix": "/api", "upstream": "pool"},
                 {"name": "secured", "path_prefix": "/secured", "strip_prefix": True, "upstream": "backend-tls",
                  "policies": [{"basic_auth": {}},
                               {"rate_limit": {"requests": 1_000_000_000, "per": "1h", "key": "consumer"}}]}],
    }, timeout=300)
    host, port = dp.http.rsplit(":", 1)
    tls_port = dp.https.rsplit(":", 1)[1]
    return sluice, Gateway("sluice", dp.proc, {
        "proxy": (host, int(port), "/shop/v2/products"),
        "get": (host, int(port), "/api/products"),
        "secured": (host, int(tls_port), "/secured/shop/v2/products"),
    })


def start_nginx(workdir: Path, up: Upstreams, certs: Certs, simulate: bool, same_job: bool = True) -> Gateway:
    """`same_job`: adding what Sluice adds (`peers.FORWARDED_FIELDS`); else `nginx-bare`, the earlier
    baseline, which adds nothing to the request or the answer."""
    name = "nginx" if same_job else "nginx-bare"
    d = workdir / name
    peers.nginx_dirs(d)
    port, tls_port = procs.free_port(), procs.free_port()
    plain = peers.proxy_to("http", "backend", same_job)
    pool = peers.proxy_to("http", "pool", same_job)
    secured = peers.secured_server(peers.Tls(certs.leaf, certs.leaf_key, certs.ca), htpasswd_ssha(d / "htpasswd"),
                                   "backend_tls", same_job)
    servers = [
        f"listen 127.0.0.1:{port};\n        location / {{{plain}\n        }}\n        location /api/ {{{pool}\n        }}",
        secured.replace("LISTEN_PORT", str(tls_port)),
    ]
    upstreams = "".join([peers.nginx_upstream("backend", [up.plain]), peers.nginx_upstream("pool", up.pool),
                         peers.nginx_upstream("backend_tls", [up.tls])])
    conf = d / "nginx.conf"
    conf.write_text(peers.nginx_conf(d, 1, servers, upstreams, peers.PER_CONSUMER_ZONE, single_process=True))
    proc = procs.start(name, [*valgrind(workdir, name, simulate), "nginx", "-c", str(conf), "-p", str(d)], workdir,
                       stop_signal=signal.SIGTERM)
    procs.wait_tcp(port, timeout=120, proc=proc)
    procs.wait_tcp(tls_port, timeout=120, proc=proc)
    return Gateway(name, proc, {"proxy": ("127.0.0.1", port, "/shop/v2/products"),
                                "get": ("127.0.0.1", port, "/api/products"),
                                "secured": ("127.0.0.1", tls_port, "/shop/v2/products")}, same_job)


def start_haproxy(workdir: Path, up: Upstreams, certs: Certs, simulate: bool) -> Gateway:
    """HAProxy with `nbthread 1`: plain HTTP (one upstream, and a round-robin pool for /api), and the secured
    case: TLS in, `http-request auth` against a userlist, a stick table counting each consumer's requests
    (a limit never reached), the credentials removed and the consumer named, TLS (verified) to the upstream."""
    d = workdir / "haproxy"
    d.mkdir(parents=True, exist_ok=True)
    port, tls_port = procs.free_port(), procs.free_port()
    path = d / "haproxy.cfg"
    path.write_text(haproxy_conf(d, port, tls_port, up, certs))
    proc = procs.start("haproxy", [*valgrind(workdir, "haproxy", simulate), "haproxy", "-db", "-f", str(path)], workdir)
    procs.wait_tcp(port, timeout=120, proc=proc)
    procs.wait_tcp(tls_port, timeout=120, proc=proc)
    return Gateway("haproxy", proc, {"proxy": ("127.0.0.1", port, "/shop/v2/products"),
                                     "get": ("127.0.0.1", port, "/api/products"),
                                     "secured": ("127.0.0.1", tls_port, "/shop/v2/products")})


def haproxy_conf(d: Path, port: int, tls_port: int, up: Upstreams, certs: Certs) -> str:
    pem = d / "leaf-and-key.pem"
    pem.write_text(certs.leaf.read_text() + certs.leaf_key.read_text())
    return f"""{peers.haproxy_global(d, 1)}{peers.HAPROXY_DEFAULTS}
userlist consumers
    user {BASIC_USER} insecure-password {BASIC_PASSWORD}

frontend fe
    bind 127.0.0.1:{port}
{peers.haproxy_forwarding("http")}    use_backend pool if {{ path_beg /api/ }}
    default_backend be

frontend fe_tls
    bind 127.0.0.1:{tls_port} ssl crt {pem} alpn http/1.1
{peers.haproxy_forwarding("https")}    stick-table type string len 64 size 10k expire 1h store http_req_rate(1h)
    http-request auth realm bench unless {{ http_auth(consumers) }}
    http-request track-sc0 http_auth_user
    http-request deny deny_status 429 if {{ sc_http_req_rate(0) gt 1000000000 }}
    http-request set-header X-Consumer-Username %[http_auth_user]
    http-request del-header Authorization
    default_backend be_tls

backend be
{peers.haproxy_servers([up.plain])}

backend pool
    balance roundrobin
{peers.haproxy_servers(up.pool)}

backend be_tls
{peers.haproxy_servers([up.tls], "t", f" ssl verify required ca-file {certs.ca} sni str(localhost)")}
"""


def run(bins: Path, workdir: Path, names: list[str], connections: int, warmup: int, requests: int,
        simulate: bool = False) -> dict:
    """Every gateway in `names` in turn, each through every case; the figures per gateway and case. `simulate`:
    also the simulated cache misses and mispredicted branches per request (see `valgrind`)."""
    certs = make_certs(workdir / "certs")
    start = lambda name, argv: procs.start(name, argv, workdir)  # noqa: E731
    upstream = lambda name, *extra: start(name, [str(bins / "sluice-test-upstream"), "--addr", "127.0.0.1:0",  # noqa: E731
                                                 "--name", name, *extra])
    started = [upstream("u1"), *(upstream(f"rr{i}") for i in range(1, 4)),
               upstream("u-tls", "--tls-cert", str(certs.leaf), "--tls-key", str(certs.leaf_key))]
    addrs = [p.first_json_line()["addr"] for p in started]
    up = Upstreams(addrs[0], addrs[1:4], addrs[4])
    results: dict[str, dict] = {}
    try:
        for name in names:
            procs.log(f"{name} under callgrind")
            sluice = None
            if name == "sluice":
                sluice, gateway = start_sluice(bins, workdir, up, certs, simulate)
            elif name in ("nginx", "nginx-bare"):
                gateway = start_nginx(workdir, up, certs, simulate, same_job=name == "nginx")
            else:
                gateway = start_haproxy(workdir, up, certs, simulate)
            try:
                results[name] = {}
                for case in cases():
                    check_upstream_saw(gateway, case, certs.ca)
                    figures = measure(gateway, case, certs.ca, workdir, connections, warmup, requests)
                    results[name][case.name] = figures
                    procs.log(f"{name} {case.name}: {figures['instructions']:,.0f} instructions, "
                              f"{figures['allocations']:.1f} allocations per request")
            finally:
                if sluice is not None:
                    sluice.stop()
                else:
                    gateway.proc.stop(grace=30)
    finally:
        for proc in started:
            proc.stop()
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "connections": connections,
            "warmup": warmup, "requests": requests,
            "cases": {c.name: c.what for c in cases()}, "gateways": results}


def table(figures: dict) -> list[str]:
    """Markdown: instructions and allocations per request, per case and gateway, with Sluice's ratio to nginx."""
    gateways = list(figures["gateways"])
    head = ["case", *(f"{g} instr/req" for g in gateways), *(f"{g} allocs/req" for g in gateways)]
    versus = [peer for peer in ("nginx", "nginx-bare") if "sluice" in gateways and peer in gateways]
    head += [f"sluice instr vs {peer}" for peer in versus]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in figures["cases"]:
        row = [case]
        got = {g: figures["gateways"][g].get(case) for g in gateways}
        row += [f"{got[g]['instructions']:,.0f}" if got[g] else "–" for g in gateways]
        row += [f"{got[g]['allocations']:.1f}" if got[g] else "–" for g in gateways]
        for peer in versus:
            s, n = got["sluice"], got[peer]
            row.append(f"{s['instructions'] / n['instructions']:.2f}x" if s and n else "–")
        lines.append("| " + " | ".join(row) + " |")
    return lines


# callgrind's simulated events worth a column, in its names: data writes, L1 misses (instruction fetch, data
# read, data write), misses of the core's L2 (`core_cache`; instruction fetch, data read, data write) and
# mispredicted branches (conditional, indirect).
SIMULATED = {"Dw": "data writes", "I1mr": "L1i misses", "D1mr": "L1d read misses", "D1mw": "L1d write misses",
             "ILmr": "L2 instr. misses", "DLmr": "L2 read misses", "DLmw": "L2 write misses",
             "Bcm": "cond. branches missed", "Bim": "indirect branches missed"}


def simulated_table(figures: dict) -> list[str]:
    """Markdown: the simulated events per request (`run(..., simulate=True)`), a row per gateway and case."""
    head = ["gateway", "case", "instr/req", *SIMULATED.values()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for gateway, by_case in figures["gateways"].items():
        for case, got in by_case.items():
            events = got.get("simulated", {})
            row = [gateway, case, f"{got['instructions']:,.0f}", *(f"{events.get(e, 0):,.0f}" for e in SIMULATED)]
            lines.append("| " + " | ".join(row) + " |")
    return lines
