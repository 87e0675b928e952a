"""Load generation with wrk, and the A B A B rounds that compare gateways."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .procs import Proc, log

LUA = Path(__file__).resolve().parent.parent / "lua" / "bench.lua"


@dataclass
class Request:
    """What wrk sends: method, optional JSON body file, optional Authorization, and any other headers
    (`headers`, sent last: they win over the Content-Type a body file implies and over `auth`)."""
    method: str = "GET"
    body_file: Path | None = None
    auth: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def header_lines(self) -> str:
        """`headers` as BENCH_HEADERS for lua/bench.lua: one `Name: value` a line."""
        for name, value in self.headers.items():
            if "\n" in name + value or ":" in name:
                raise ValueError(f"header {name!r}: {value!r} cannot go through BENCH_HEADERS")
        return "\n".join(f"{name}: {value}" for name, value in self.headers.items())


@dataclass
class Target:
    """One gateway under test: where to send the load, and whose processes to measure."""
    label: str
    url: str
    gateway: Proc
    request: Request = field(default_factory=Request)


@dataclass
class Layout:
    """Which cores the client uses (taskset list or None) and how many wrk threads."""
    client_cpus: str | None
    client_threads: int


def wrk(target: Target, connections: int, duration: float, layout: Layout,
        stop_after_total: int = 0, sample_rss: bool = True) -> dict:
    """One wrk run against target; returns wrk's figures plus the gateway's CPU and RSS over the run."""
    threads = max(1, min(layout.client_threads, connections))
    argv = ["wrk", "--latency", "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(duration))}s",
            "--timeout", "5s", "-s", str(LUA), target.url]
    if layout.client_cpus is not None:
        argv = ["taskset", "-c", layout.client_cpus, *argv]
    env = {"BENCH_METHOD": target.request.method,
           "BENCH_BODY_FILE": str(target.request.body_file or ""),
           "BENCH_AUTH": target.request.auth or "",
           "BENCH_HEADERS": target.request.header_lines(),
           "BENCH_STOP_AFTER": str(-(-stop_after_total // threads) if stop_after_total else 0),
           "PATH": "/usr/local/bin:/usr/bin:/bin"}
    peak = [target.gateway.rss_kb()]
    done = threading.Event()

    def sampler() -> None:
        while not done.wait(0.5):
            peak.append(target.gateway.rss_kb())

    sampler_thread = threading.Thread(target=sampler, daemon=True)
    user_before, kernel_before = target.gateway.cpu_split()
    sleeps_before = target.gateway.sleeps()
    started = time.monotonic()
    if sample_rss:
        sampler_thread.start()
    try:
        run = _run_wrk(argv, env, duration, target.gateway if stop_after_total else None)
    finally:
        done.set()
    wall = time.monotonic() - started
    user_after, kernel_after = target.gateway.cpu_split()
    sleeps = target.gateway.sleeps() - sleeps_before
    user, kernel = user_after - user_before, kernel_after - kernel_before
    cpu = user + kernel
    line = next((l for l in run.stdout.splitlines() if l.startswith("BENCH_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no result for {target.label}: {run.stdout[-500:]} {run.stderr[-500:]}")
    result = json.loads(line[len("BENCH_JSON "):])
    secs = result["duration_us"] / 1e6
    socket_errors = result["connect_errors"] + result["read_errors"] + result["write_errors"] + result["timeouts"]
    result.update({
        "label": target.label,
        "connections": connections - connections % threads,  # wrk gives each thread connections // threads
        "threads": threads,
        "wall_s": round(wall, 3),
        "rps": result["requests"] / secs if secs else 0.0,
        "socket_errors": socket_errors,
        "errors": socket_errors + result["status_errors"],
        "gateway_cpu_s": round(cpu, 3),
        "cpu_us_per_req": per_request_us(cpu, result["requests"]),
        "user_us_per_req": per_request_us(user, result["requests"]),
        "kernel_us_per_req": per_request_us(kernel, result["requests"]),
        "sleeps_per_req": sleeps / result["requests"] if result["requests"] else None,
        "rss_load_kb": max(peak),
    })
    return result


def per_request_us(seconds: float, requests: int) -> float | None:
    return seconds / requests * 1e6 if requests else None


def per_cpu_second(run: dict) -> float | None:
    """Requests served per second of the gateway's CPU time (utime+stime) in one run: with the gateway
    alone on its core (`--pin`), what a core of it serves, however much load the client side offered."""
    cpu = run.get("gateway_cpu_s")
    return run["requests"] / cpu if cpu else None


def core_busy(run: dict) -> float | None:
    """The gateway's CPU time over the run's wall time: 1.0 is one core kept busy the whole run."""
    cpu, wall = run.get("gateway_cpu_s"), run.get("wall_s")
    return cpu / wall if cpu is not None and wall else None


def _run_wrk(argv: list[str], env: dict, duration: float, watch: Proc | None) -> subprocess.CompletedProcess:
    """Runs wrk. With `watch` (a request-count-bounded run), wrk's threads stop by themselves but its main
    thread sleeps out -d; once the gateway has gone idle (no CPU used for a second) wrk gets SIGINT, on
    which it prints its summary as usual."""
    popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if watch is not None:
        started, last = time.monotonic(), watch.cpu_seconds()
        while popen.poll() is None and time.monotonic() - started < duration + 30:
            time.sleep(1.0)
            now = watch.cpu_seconds()
            if time.monotonic() - started > 5 and now - last < 0.02:
                popen.send_signal(signal.SIGINT)
                break
            last = now
    try:
        out, err = popen.communicate(timeout=duration + 60)
    except subprocess.TimeoutExpired:
        popen.kill()
        out, err = popen.communicate()
    return subprocess.CompletedProcess(argv, popen.returncode, out, err)


def rounds(targets: list[Target], connections: int, duration: float, warmup: float, n_rounds: int,
           layout: Layout, between=None) -> dict[str, dict]:
    """Warms each target up, then runs them in turn (A B A B ...) for n_rounds; returns per-label summaries."""
    runs: dict[str, list[dict]] = {t.label: [] for t in targets}
    idle: dict[str, int] = {t.label: t.gateway.rss_kb() for t in targets}
    for t in targets:
        log(f"  warm-up {t.label} {warmup:.0f}s")
        wrk(t, connections, warmup, layout, sample_rss=False)
    for r in range(n_rounds):
        for t in targets:
            if between:
                between(t)
            result = wrk(t, connections, duration, layout)
            runs[t.label].append(result)
            log(f"  round {r + 1}/{n_rounds} {t.label:<16} {result['rps']:>9.0f} req/s  p99 "
                f"{result['p99_us'] / 1000:6.2f} ms  errors {result['errors']}  "
                f"cpu/req {fmt_us(result['cpu_us_per_req'])}")
    return {label: summarize(rs, idle[label]) for label, rs in runs.items()}


def fmt_us(value) -> str:
    return "-" if value is None else f"{value:.1f} us"


def spread(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(runs: list[dict], rss_idle_kb: int) -> dict:
    return {
        "runs": runs,
        "rps": spread([r["rps"] for r in runs]),
        "p50_ms": spread([r["p50_us"] / 1000 for r in runs]),
        "p99_ms": spread([r["p99_us"] / 1000 for r in runs]),
        "p999_ms": spread([r["p999_us"] / 1000 for r in runs]),
        "errors": sum(r["errors"] for r in runs),
        "requests": sum(r["requests"] for r in runs),
        "cpu_us_per_req": spread([r["cpu_us_per_req"] for r in runs]),
        "req_per_cpu_s": spread([per_cpu_second(r) for r in runs]),
        "core_busy": spread([core_busy(r) for r in runs]),
        "user_us_per_req": spread([r.get("user_us_per_req") for r in runs]),
        "kernel_us_per_req": spread([r.get("kernel_us_per_req") for r in runs]),
        "sleeps_per_req": spread([r.get("sleeps_per_req") for r in runs]),
        "rss_idle_kb": rss_idle_kb,
        "rss_load_kb": spread([r["rss_load_kb"] for r in runs]),
        "connections": runs[0]["connections"] if runs else None,
    }
