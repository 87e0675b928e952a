"""The scenarios of issue 5. Each starts what it needs, measures, stops all of
it (by pid) and returns a JSON-able dict for results/ and RESULTS.md."""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from contextlib import contextmanager

from . import peers, procs
from . import policies as per_policy
from .context import (BASIC_HEADER, BASIC_USER, BASIC_PASSWORD, SMALL_BODY, Context, body_1066, check,
                      htpasswd_ssha, make_certs, request_headers, send)
from .load import Request, Target, rounds, summarize, wrk
from .sluice import Sluice


def upstream_cfg(name: str, addrs: list[str], scheme: str = "http", **extra) -> dict:
    return {"name": name, "targets": [{"url": f"{scheme}://{a}"} for a in addrs], "balance": "round_robin", **extra}


SHOP_API = {"name": "shop", "path_prefix": "/shop/v2", "upstream": "backend"}


class Stack:
    """A scenario's folder and everything it started there, stopped together (by pid) at its end."""

    def __init__(self, ctx: Context, name: str) -> None:
        self.ctx = ctx
        self.dir = ctx.scenario_dir(name)
        self.items: list = []
        # The machine's load when the scenario began, for RESULTS.md.
        self.info = {"uptime_before": open("/proc/loadavg").read().split()[:3]}

    def add(self, item):
        self.items.append(item)
        return item

    def stop(self) -> None:
        for item in reversed(self.items):
            item.stop()

    def upstream(self, name: str, tls=None) -> str:
        up, addr = self.ctx.upstream(self.dir, name, tls=tls)
        self.add(up)
        return addr

    def sluice(self, n_data_planes: int = 1, snapshot_cache: bool = False) -> Sluice:
        ctx = self.ctx
        s = self.add(Sluice(ctx.bins, self.dir, ctx.gateway_cpus, ctx.gateway_cores, cp_cpus=ctx.other_cpus))
        s.start(n_data_planes, snapshot_cache)
        return s

    def shop(self) -> tuple[Sluice, str]:
        """One upstream `u1` and a Sluice with one data plane proxying /shop/v2 to it."""
        addr = self.upstream("u1")
        sluice = self.sluice()
        sluice.configure({"upstreams": [upstream_cfg("backend", [addr])], "apis": [SHOP_API]})
        return sluice, addr

    def file(self, name: str, data: bytes):
        path = self.dir / name
        path.write_bytes(data)
        return path

    def nginx(self, label: str, addrs: list[str], path: str, req: Request | None = None) -> Target:
        ng, port = peers.nginx_plain(self.dir, self.ctx.gateway_cores, self.ctx.gateway_cpus, addrs)
        return Target(label, f"http://127.0.0.1:{port}{path}", self.add(ng), req or Request())

    def plain_peers(self, addrs: list[str], path: str, req: Request | None = None) -> list[Target]:
        """nginx and (where installed) HAProxy proxying `path` to `addrs`, round robin."""
        targets = [self.nginx("nginx", addrs, path, req)]
        if peers.have_haproxy():
            hp, port = peers.start_haproxy(self.dir, self.ctx.gateway_cores, self.ctx.gateway_cpus, addrs)
            targets.append(Target("haproxy", f"http://127.0.0.1:{port}{path}", self.add(hp), req or Request()))
        return targets

    def rounds(self, targets: list[Target], connections: int, **out) -> dict:
        """The targets measured in turn; the scenario's dict for results/, with `out` added."""
        ctx = self.ctx
        gateways = rounds(targets, connections, ctx.duration, ctx.warmup, ctx.rounds, ctx.layout)
        return {**self.info, "connections": connections, **out, "gateways": gateways}


@contextmanager
def scenario(ctx: Context, name: str):
    stack = Stack(ctx, name)
    try:
        yield stack
    finally:
        stack.stop()


def check_forwarded(target: Target, n_bytes: int) -> dict:
    """The target answers 2xx and its upstream got the whole body; the echo, for further checks."""
    echo = check(target)
    assert echo.get("body_len") == n_bytes, f"{target.label} forwarded {echo.get('body_len')} bytes"
    return echo


def refused(target: Target, status: int, why: str) -> None:
    """The target's request is answered `status`: else the thing measured is not on."""
    try:
        check(target)
    except RuntimeError as e:
        assert str(status) in str(e), e
        return
    raise AssertionError(f"{target.label}: {why}")


# --- proxy: Membrane test 1 ---------------------------------------------------

def proxy(ctx: Context) -> dict:
    with scenario(ctx, "proxy") as stack:
        sluice, addr = stack.shop()
        req = Request("POST", stack.file("body.json", body_1066()))
        dp = sluice.dps[0]
        targets = [Target("sluice", f"http://{dp.http}/shop/v2/products", dp.proc, req),
                   *stack.plain_peers([addr], "/shop/v2/products", req)]
        for t in targets:
            check_forwarded(t, 1066)
        return stack.rounds(targets, 175, body_bytes=1066)


# --- secured: Membrane test 2 -------------------------------------------------

def secured_config(certs, addr_tls: str, addr_plain: str) -> dict:
    """Sluice's side of `secured` (also bench/compare's): HTTPS in with `certs`' leaf, /shop/v2 behind basic
    auth and a per-consumer rate limit that never rejects, to the TLS upstream at `addr_tls`; /plain the same
    request proxied in plain text to `addr_plain`, for the secured/proxy ratio."""
    return {
        "certificates": [certs.sluice_default("bench")],
        "upstreams": [upstream_cfg("backend-tls", [addr_tls], "https", tls={"ca_bundle": certs.ca.read_text()}),
                      upstream_cfg("backend", [addr_plain])],
        "consumers": [{"username": BASIC_USER, "basic_auth": {"password": BASIC_PASSWORD}}],
        "apis": [
            {"name": "shop", "path_prefix": "/shop/v2", "upstream": "backend-tls",
             "policies": [{"basic_auth": {}},
                          {"rate_limit": {"requests": 1_000_000_000, "per": "1h", "key": "consumer"}}]},
            {"name": "plain", "path_prefix": "/plain", "strip_prefix": True, "upstream": "backend"},
        ]}


def secured(ctx: Context) -> dict:
    with scenario(ctx, "secured") as stack:
        d = stack.dir
        certs = make_certs(d / "certs")
        addr_tls = stack.upstream("u-tls", tls=certs)
        addr = stack.upstream("u-plain")
        sluice = stack.sluice()
        sluice.configure(secured_config(certs, addr_tls, addr))
        body = stack.file("body.json", body_1066())
        dp = sluice.dps[0]
        secured_req = Request("POST", body, BASIC_HEADER)
        targets = [
            Target("sluice", f"https://{dp.https}/shop/v2/products", dp.proc, secured_req),
            Target("sluice-proxy", f"http://{dp.http}/plain/shop/v2/products", dp.proc, Request("POST", body)),
        ]
        ng, port = peers.nginx_secured(d, ctx.gateway_cores, ctx.gateway_cpus, addr_tls, peers.Tls(
            certs.leaf, certs.leaf_key, certs.ca), htpasswd_ssha(d / "htpasswd"))
        targets.append(Target("nginx", f"https://127.0.0.1:{port}/shop/v2/products", stack.add(ng), secured_req))
        for t in targets:
            echo = check_forwarded(t, 1066)
            if t.label != "sluice-proxy":
                hdrs = {k.lower(): v for k, v in echo.get("headers", {}).items()}
                assert "authorization" not in hdrs, f"{t.label} forwarded the credentials"
                assert hdrs.get("x-consumer-username") == BASIC_USER, f"{t.label}: no consumer header"
        for t in targets[:1] + targets[2:]:
            refused(Target(t.label, t.url, t.gateway, Request("POST", body, "Basic Zm9vOmJhcg==")), 401,
                    "let a wrong password through")
        return stack.rounds(targets, 175, body_bytes=1066)


# --- openapi: Membrane test 3 -------------------------------------------------

def openapi(ctx: Context) -> dict:
    with scenario(ctx, "openapi") as stack:
        addr = stack.upstream("u1")
        spec = (ctx.fixtures / "fruitshop-v2-2-0.oas.yml").read_text()
        sluice = stack.sluice()
        sluice.configure({
            "upstreams": [upstream_cfg("backend", [addr])],
            "specs": [{"name": "fruitshop", "content": spec}],
            "apis": [
                {"name": "shop", "path_prefix": "/shop/v2", "upstream": "backend",
                 "openapi": {"spec": "fruitshop", "validate_requests": True}},
                {"name": "plain", "path_prefix": "/plain", "strip_prefix": True, "upstream": "backend"},
            ]})
        bad = stack.file("bad.json", b'{"name":"Mangos","price":-1}')
        dp = sluice.dps[0]
        req = Request("POST", stack.file("body.json", SMALL_BODY))
        targets = [
            Target("sluice", f"http://{dp.http}/shop/v2/products", dp.proc, req),
            Target("sluice-proxy", f"http://{dp.http}/plain/shop/v2/products", dp.proc, req),
            stack.nginx("nginx-proxy", [addr], "/shop/v2/products", req),
        ]
        for t in targets:
            check(t)
        refused(Target("x", targets[0].url, dp.proc, Request("POST", bad)), 400,
                "the openapi API accepted a negative price: validation is not on")
        return stack.rounds(targets, 175, body_bytes=len(SMALL_BODY))


# --- policies: what each policy costs per request ---------------------------------

def policies(ctx: Context) -> dict:
    """One API per policy (bench/lib/policies.py, the same as bench/profile's) on one data plane, each
    taking the request that passes it, in turn with a plain API: req/s and CPU per request against it."""
    with scenario(ctx, "policies") as stack:
        addr = stack.upstream("u1")
        sluice = stack.sluice()
        cases = per_policy.cases()
        sluice.configure(per_policy.config(ctx.fixtures, addr, cases))
        body = stack.file("body.json", SMALL_BODY)
        dp = sluice.dps[0]
        targets = []
        for case in cases:
            request = case["request"]
            # One body for all, so the APIs differ only in their policy.
            assert request["body"] == SMALL_BODY, f"{case['api']['name']}: not the shared body"
            targets.append(Target(case["api"]["name"], f"http://{dp.http}{case['path']}", dp.proc,
                                  Request(request["method"], body, headers=request["headers"])))
        checks = {t.label: check_policy(t) for t in targets}
        return stack.rounds(targets, 175, body_bytes=len(SMALL_BODY), checks=checks)


def check_policy(target: Target) -> list[str]:
    """The API passes its request (2xx, the whole body reaching the upstream) and its policy shows that it
    ran: a request it must refuse gets the refusal, or the passing response carries the policy's mark.
    Without this a policy left off (or a request matching another API) would measure as free."""
    label = target.label
    status, headers, data = send(target.url, target.request.method, target.request.body_file.read_bytes(),
                                 request_headers(target.request))
    if not 200 <= status < 300:
        raise RuntimeError(f"{label}: {target.request.method} {target.url} -> {status}: {data[:500]!r}")
    echo = json.loads(data)
    assert echo.get("body_len") == len(SMALL_BODY), f"{label} forwarded {echo.get('body_len')} bytes"
    shown = [f"2xx, {len(SMALL_BODY)} bytes upstream"]
    if label in per_policy.marks():
        where, name, want = per_policy.marks()[label]
        seen = headers if where == "response" else {k.lower(): v for k, v in echo.get("headers", {}).items()}
        got = seen.get(name)
        assert got is not None and want in (None, got), f"{label}: {where} header {name} is {got!r}: policy off?"
        shown.append(f"{where} header `{name}: {got}`")
    if label in per_policy.refusals():
        what, bad, want_status = per_policy.refusals()[label]
        got_status, _, data = send(target.url, bad["method"], bad["body"], bad["headers"])
        assert got_status == want_status, f"{label}: {what} got {got_status}, not {want_status}: {data[:300]!r}"
        shown.append(f"{what} → {want_status}")
    return shown


# --- round-robin: BunGate's test ----------------------------------------------

def round_robin(ctx: Context) -> dict:
    with scenario(ctx, "round-robin") as stack:
        addrs = [stack.upstream(f"rr{i + 1}") for i in range(3)]
        sluice = stack.sluice()
        sluice.configure({"upstreams": [upstream_cfg("pool", addrs)],
                          "apis": [{"name": "rr", "path_prefix": "/", "upstream": "pool"}]})
        dp = sluice.dps[0]
        targets = [Target("sluice", f"http://{dp.http}/api/products", dp.proc),
                   *stack.plain_peers(addrs, "/api/products")]
        spread = {}
        for t in targets:
            seen = [check(t).get("server") for _ in range(6)]
            spread[t.label] = sorted(set(seen))
            assert len(set(seen)) == 3, f"{t.label} did not spread over the 3 upstreams: {seen}"
        return stack.rounds(targets, 150, upstreams=3)


# --- memory -------------------------------------------------------------------

def many_apis(n: int, upstream: str = "backend") -> list[dict]:
    return [{"name": f"api-{i:05d}", "path_prefix": f"/api/{i:05d}", "upstream": upstream} for i in range(n)]


def settle_rss(proc: procs.Proc, secs: float = 1.5) -> int:
    time.sleep(secs)
    return proc.rss_kb()


def memory(ctx: Context) -> dict:
    with scenario(ctx, "memory") as stack:
        d = stack.dir
        addr = stack.upstream("u1")
        sluice = stack.sluice()
        dp = sluice.dps[0]
        out = {"sluice": {}, "nginx": {}}
        out["sluice"]["rss_started_kb"] = settle_rss(dp.proc)
        sluice.configure({"upstreams": [upstream_cfg("backend", [addr])], "apis": [SHOP_API]})
        out["sluice"]["rss_idle_1_api_kb"] = settle_rss(dp.proc)
        sluice.configure({"upstreams": [upstream_cfg("backend", [addr])], "apis": many_apis(1000)})
        out["sluice"]["rss_idle_1000_apis_kb"] = settle_rss(dp.proc)

        ng1, _ = peers.nginx_plain(d / "min", ctx.gateway_cores, ctx.gateway_cpus, [addr])
        out["nginx"]["rss_idle_1_api_kb"] = settle_rss(ng1)
        ng1.stop()
        ng, port = peers.nginx_plain(d, ctx.gateway_cores, ctx.gateway_cpus, [addr],
                                     locations=[f"/api/{i:05d}" for i in range(1000)])
        stack.add(ng)
        out["nginx"]["rss_idle_1000_apis_kb"] = settle_rss(ng)
        targets = [Target("sluice", f"http://{dp.http}/api/00500/products", dp.proc),
                   Target("nginx", f"http://127.0.0.1:{port}/api/00500/products", ng)]
        for t in targets:
            check(t)
        loaded = rounds(targets, 500, ctx.duration, ctx.warmup, max(1, ctx.rounds - 1), ctx.layout)
        for label, summary in loaded.items():
            out[label]["rss_500_conns_kb"] = summary["rss_load_kb"]["max"]
            out[label]["load"] = summary
            out[label]["rss_after_load_kb"] = settle_rss(targets[0].gateway if label == "sluice" else ng)
        return {**stack.info, "apis": 1000, "connections": 500, "gateways": out}


# --- push -----------------------------------------------------------------------

def probe_api(rev: int) -> dict:
    return {"name": "probe", "path_prefix": "/probe", "upstream": "backend",
            "policies": [{"headers": {"response": {"set": {"x-bench-rev": str(rev)}}}}]}


def watch_rev(hostport: str, rev: int, t0: float, out: dict, key: str, timeout: float = 15.0) -> None:
    """Polls the data plane (keep-alive) until it serves x-bench-rev == rev; records seconds since t0."""
    host, port = hostport.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    want = str(rev)
    try:
        while time.perf_counter() - t0 < timeout:
            conn.request("GET", "/probe/x")
            resp = conn.getresponse()
            resp.read()
            if resp.getheader("x-bench-rev") == want:
                out[key] = time.perf_counter() - t0
                return
    finally:
        conn.close()
    out[key] = None


def compile_stats(dp) -> tuple[float, float]:
    return (dp.metric("sluice_snapshot_compile_seconds_sum") or 0.0,
            dp.metric("sluice_snapshot_compile_seconds_count") or 0.0)


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(q / 100 * (len(values) - 1))))
    return values[k]


def push(ctx: Context) -> dict:
    with scenario(ctx, "push") as stack:
        d = stack.dir
        addr = stack.upstream("u1")
        sluice = stack.sluice(n_data_planes=2, snapshot_cache=True)
        dp1, dp2 = sluice.dps
        base = {"upstreams": [upstream_cfg("backend", [addr])], "apis": [probe_api(0)]}
        sluice.configure(base)

        # 1. admin write -> new behaviour served on each data plane
        writes = 20 if ctx.quick else 100
        procs.log(f"  {writes} writes, watching both data planes")
        per_dp: dict[str, list[float]] = {dp1.node_id: [], dp2.node_id: []}
        write_s, missed = [], 0
        for rev in range(1, writes + 1):
            w0 = time.perf_counter()
            sluice.put_api(probe_api(rev))
            t0 = time.perf_counter()
            write_s.append(t0 - w0)
            seen: dict = {}
            threads = [threading.Thread(target=watch_rev, args=(dp.http, rev, t0, seen, dp.node_id))
                       for dp in (dp1, dp2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for node, secs in seen.items():
                if secs is None:
                    missed += 1
                else:
                    per_dp[node].append(secs * 1000)
            time.sleep(0.02)
        every = [v for vs in per_dp.values() for v in vs]
        visible = {
            "writes": writes, "missed": missed,
            "admin_write_ms_p50": statistics.median(write_s) * 1000,
            "p50_ms": statistics.median(every), "p99_ms": percentile(every, 99), "max_ms": max(every),
            "per_data_plane": {n: {"p50_ms": statistics.median(v), "p99_ms": percentile(v, 99)}
                               for n, v in per_dp.items() if v},
        }
        procs.log(f"  write->served p50 {visible['p50_ms']:.1f} ms p99 {visible['p99_ms']:.1f} ms")

        # 2. compile+swap time and snapshot size for 1,000 and 10,000 APIs
        sizes = {}
        for n in (1000, 10000):
            config = {"upstreams": [upstream_cfg("backend", [addr])], "apis": [probe_api(0), *many_apis(n)]}
            before = compile_stats(dp1)
            w0 = time.perf_counter()
            version = sluice.put_config(config)
            put_s = time.perf_counter() - w0
            sluice.wait_applied(version, timeout=300)
            applied_s = time.perf_counter() - w0
            after = compile_stats(dp1)
            first = (after[0] - before[0]) / max(1.0, after[1] - before[1])
            swaps = []
            single_writes = []
            # CPU time of every process over the single-API writes: what one
            # write costs the control plane and each data plane, all steps
            # included (admin call, diff, snapshot build, push, decode, verify,
            # compile, cache, freeing the old table), whatever the machine's load.
            processes = [sluice.cp, dp1.proc, dp2.proc]
            cpu_before = [p.cpu_seconds() for p in processes]
            n_writes = 1 if ctx.quick else 5
            for k in range(n_writes):
                before = compile_stats(dp1)
                w0 = time.perf_counter()
                version = sluice.put_api({**many_apis(1)[0], "strip_prefix": k % 2 == 0})
                single_writes.append(time.perf_counter() - w0)
                sluice.wait_applied(version, timeout=300)
                after = compile_stats(dp1)
                if after[1] > before[1]:
                    swaps.append((after[0] - before[0]) / (after[1] - before[1]))
                time.sleep(0.2)  # the replaced table is freed just after the swap
            cpu_ms = [(p.cpu_seconds() - b) / n_writes * 1000 for p, b in zip(processes, cpu_before)]
            cache = d / f"{dp2.node_id}.snapshot"
            sizes[str(n)] = {
                "apis": n + 1,
                "put_config_s": put_s, "put_to_applied_s": applied_s,
                "first_compile_ms": first * 1000,
                "compile_ms": [s * 1000 for s in swaps],
                "compile_ms_median": statistics.median(swaps) * 1000 if swaps else None,
                "single_api_write_s_median": statistics.median(single_writes),
                "write_cpu_ms": {"cp": cpu_ms[0], "dps": cpu_ms[1:]},
                "snapshot_bytes": cache.stat().st_size if cache.exists() else None,
                "dp_rss_kb": dp1.proc.rss_kb(),
                "cp_rss_kb": sluice.cp.rss_kb(),
            }
            procs.log(f"  {n} APIs: compile {sizes[str(n)]['compile_ms_median']} ms, "
                      f"snapshot {sizes[str(n)]['snapshot_bytes']} bytes, PUT {put_s:.2f}s, CPU ms per write "
                      f"cp {cpu_ms[0]:.1f} dps {' '.join(f'{c:.1f}' for c in cpu_ms[1:])}")

        # 3. live traffic p99 while 10,000-API snapshots swap every second, vs. without
        target = Target("sluice", f"http://{dp1.http}/probe/x", dp1.proc)
        check(target)
        wrk(target, 175, ctx.warmup, ctx.layout, sample_rss=False)
        runs = {"quiet": [], "swapping": []}
        swap_counts = []
        for r in range(ctx.rounds):
            for mode in ("quiet", "swapping"):
                stop = threading.Event()
                puts = [0]

                def swapper() -> None:
                    k = 0
                    while not stop.is_set():
                        t = time.monotonic()
                        k += 1
                        sluice.put_api({**many_apis(1)[0], "strip_prefix": k % 2 == 0})
                        puts[0] += 1
                        stop.wait(max(0.0, 1.0 - (time.monotonic() - t)))

                before = compile_stats(dp1)
                th = threading.Thread(target=swapper, daemon=True)
                if mode == "swapping":
                    th.start()
                result = wrk(target, 175, ctx.duration, ctx.layout)
                stop.set()
                if mode == "swapping":
                    th.join()
                    swap_counts.append(compile_stats(dp1)[1] - before[1])
                runs[mode].append(result)
                procs.log(f"  round {r + 1} {mode:<9} {result['rps']:>8.0f} req/s p99 "
                          f"{result['p99_us'] / 1000:.2f} ms errors {result['errors']}"
                          + (f" swaps {swap_counts[-1]:.0f}" if mode == "swapping" else ""))
        live = {m: summarize(rs, dp1.proc.rss_kb()) for m, rs in runs.items()}
        live["swaps_per_run"] = swap_counts
        q, s = live["quiet"]["p99_ms"]["median"], live["swapping"]["p99_ms"]["median"]
        live["p99_ratio"] = s / q if q else None
        return {**stack.info, "visible": visible, "sizes": sizes, "live": live}


# --- soak -------------------------------------------------------------------------

def soak(ctx: Context, total: int = 1_000_000) -> dict:
    with scenario(ctx, "soak") as stack:
        sluice, _ = stack.shop()
        dp = sluice.dps[0]
        body = stack.file("body.json", body_1066())
        target = Target("sluice", f"http://{dp.http}/shop/v2/products", dp.proc, Request("POST", body))
        check(target)
        rss_before = dp.proc.rss_kb()
        procs.log(f"  {total} requests (bounded at 600 s)")
        result = wrk(target, 175, 600, ctx.layout, stop_after_total=total)
        return {**stack.info, "target_requests": total, "result": result, "rss_before_kb": rss_before,
                "rss_after_kb": settle_rss(dp.proc)}


ALL = {"proxy": proxy, "secured": secured, "openapi": openapi, "policies": policies,
       "round-robin": round_robin, "memory": memory, "push": push, "soak": soak}
