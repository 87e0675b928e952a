"""The `fleet` scenario (issue 24): one release control plane on 127.0.0.1 and
N simulated data planes (`sluice-fleet-sim`, testkit's SimNode: the sync
protocol without compiling, one TCP connection each) in one process.

Measures, against the issue's targets:
* a single-API write reaching every node: per write, from the admin call to
  the last node's arrival (p50/p99/max), and every node's arrival (p99);
* the control plane's CPU per such write (utime + stime from /proc, minus
  what the idle fleet costs it over the same time: heartbeats);
* its RSS with a 10,000-API configuration before any node is connected, the
  peak while that snapshot is pushed to every node and the RSS after;
* the whole fleet reconnecting after a control-plane restart: from the new
  process starting to every stream open again, and the kernel's
  ListenOverflows/ListenDrops over that time (/proc/net/netstat)."""

from __future__ import annotations

import json
import resource
import statistics
import time
from pathlib import Path

from . import procs
from .sluice import CLUSTER_TOKEN, Sluice

TARGETS = {"write_all_p99_ms": 250, "cpu_per_write_ms": 50, "rss_10k_mb": 200, "rss_after_push_mb": 250,
           "reconnect_s": 5, "listen_overflows": 0}


def netstat(*names: str) -> dict[str, int]:
    """TcpExt counters from /proc/net/netstat (what `nstat`/`netstat -s` print)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    out = {}
    for head, values in zip(lines[::2], lines[1::2]):
        if head.startswith("TcpExt:"):
            out = dict(zip(head.split()[1:], (int(v) for v in values.split()[1:])))
    return {n: out.get(n, 0) for n in names}


def status_kb(proc: procs.Proc, field: str) -> int:
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak(proc: procs.Proc) -> bool:
    """Resets VmHWM (Linux: writing 5 to clear_refs), so the next peak is this phase's."""
    try:
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class SimOutput:
    """Reads the simulator's JSON lines as they come."""

    def __init__(self, proc: procs.Proc) -> None:
        self.proc, self.offset, self.connected = proc, 0, []
        self.versions: dict[int, list[int]] = {}

    def poll(self) -> None:
        with self.proc.out.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        for line in chunk[:end].decode(errors="replace").splitlines():
            event = json.loads(line)
            if "connected" in event:
                self.connected.append((event["connected"], event["at_ms"]))
            elif "version" in event:
                self.versions[event["version"]] = event["arrivals_ms"]

    def wait(self, what: str, check, timeout: float):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise RuntimeError(f"sluice-fleet-sim exited; see {self.proc.err}")
            self.poll()
            found = check()
            if found is not None:
                return found
            time.sleep(0.02)
        raise RuntimeError(f"fleet: {what} not within {timeout}s")

    def arrivals(self, version: int, timeout: float) -> list[int]:
        return self.wait(f"version {version} on every node", lambda: self.versions.get(version), timeout)

    def all_connected(self, n: int, after_ms: float, timeout: float) -> int:
        def check():
            return next((at for count, at in self.connected if count == n and at >= after_ms), None)
        return self.wait(f"{n} streams", check, timeout)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def apis(n: int, upstream: str = "backend") -> list[dict]:
    return [{"name": f"api-{i:05d}", "path_prefix": f"/api/{i:05d}", "upstream": upstream} for i in range(n)]


def probe(rev: int) -> dict:
    return {"name": "probe", "path_prefix": "/probe", "upstream": "backend",
            "policies": [{"headers": {"response": {"set": {"x-bench-rev": str(rev)}}}}]}


def fleet(ctx, nodes: int | None = None) -> dict:
    nodes = nodes or (100 if ctx.quick else 1000)
    # One descriptor per stream on each side; procs.start raises the soft limit to the hard one.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < nodes + 512:
        raise RuntimeError(f"the file-descriptor limit ({hard}) is too low for {nodes} streams: raise `ulimit -Hn`")
    d = ctx.scenario_dir("fleet")
    upstream = {"name": "backend", "targets": [{"url": "http://127.0.0.1:9"}]}
    sluice = Sluice(ctx.bins, d, ctx.gateway_cpus, ctx.gateway_cores, cp_cpus=ctx.gateway_cpus)
    sim = None
    out: dict = {"nodes": nodes, "targets": TARGETS, "uptime_before": open("/proc/loadavg").read().split()[:3]}
    try:
        sluice.start_control_plane()
        cp = sluice.cp
        grpc = sluice.grpc

        # 1. RSS with 10,000 APIs and no node: the configuration alone.
        sluice.put_config({"upstreams": [upstream], "apis": [probe(0), *apis(10_000)]})
        time.sleep(2)
        out["rss_10k_no_nodes_mb"] = cp.rss_kb() / 1024
        version = sluice.put_config({"upstreams": [upstream], "apis": [probe(0), *apis(10)]})
        time.sleep(2)
        out["rss_small_no_nodes_mb"] = cp.rss_kb() / 1024

        # 2. The fleet connects and takes the small configuration.
        sim = procs.start("fleet-sim", [str(ctx.bins / "sluice-fleet-sim"), "--control-plane", f"http://{grpc}",
                                        "--cluster-token", CLUSTER_TOKEN, "--nodes", str(nodes),
                                        "--seconds", "3600"], d)
        output = SimOutput(sim)
        t0 = time.time() * 1000
        connected_at = output.all_connected(nodes, 0, timeout=300)
        output.arrivals(version, timeout=300)
        out["first_connect_s"] = (connected_at - t0) / 1000
        procs.log(f"  {nodes} nodes connected in {out['first_connect_s']:.1f}s")
        time.sleep(3)
        out["rss_small_nodes_mb"] = cp.rss_kb() / 1024

        # 3. Single-API writes: to every node, and the control plane's CPU.
        idle = 5.0
        c0 = cp.cpu_seconds()
        time.sleep(idle)
        idle_cpu_per_s = (cp.cpu_seconds() - c0) / idle
        writes = 5 if ctx.quick else 30
        all_ms, node_ms = [], []
        c0, w0 = cp.cpu_seconds(), time.monotonic()
        for rev in range(1, writes + 1):
            t = time.time() * 1000
            version = sluice.put_api(probe(rev))
            arrivals = output.arrivals(version, timeout=60)
            if len(arrivals) < nodes:
                raise RuntimeError(f"version {version} reached {len(arrivals)} of {nodes} nodes")
            node_ms.extend(a - t for a in arrivals)
            all_ms.append(max(arrivals) - t)
            time.sleep(0.2)
        spent = cp.cpu_seconds() - c0 - idle_cpu_per_s * (time.monotonic() - w0)
        out["write"] = {
            "writes": writes,
            "all_nodes_ms": {"p50": statistics.median(all_ms), "p99": percentile(all_ms, 99), "max": max(all_ms)},
            "per_node_ms": {"p50": statistics.median(node_ms), "p99": percentile(node_ms, 99)},
            "cp_cpu_ms_per_write": spent / writes * 1000,
            "cp_idle_cpu_ms_per_s": idle_cpu_per_s * 1000,
        }
        procs.log(f"  write to all {nodes}: p50 {out['write']['all_nodes_ms']['p50']:.0f} ms p99 "
                  f"{out['write']['all_nodes_ms']['p99']:.0f} ms; CP CPU per write "
                  f"{out['write']['cp_cpu_ms_per_write']:.1f} ms")

        # 4. Control-plane restart: the whole fleet reconnects at once.
        before = netstat("ListenOverflows", "ListenDrops")
        cp.stop()
        output.wait("every stream closed", lambda: True if output.connected[-1][0] == 0 else None, timeout=30)
        time.sleep(1)  # every node is now retrying every 100 ms
        started = time.time() * 1000
        sluice.start_control_plane(grpc_addr=grpc)
        cp = sluice.cp
        back = output.all_connected(nodes, started, timeout=120)
        after = netstat("ListenOverflows", "ListenDrops")
        out["reconnect"] = {"all_back_s": (back - started) / 1000,
                            **{k: after[k] - before[k] for k in before}}
        procs.log(f"  restart: all {nodes} back in {out['reconnect']['all_back_s']:.2f}s, "
                  f"ListenOverflows +{out['reconnect']['ListenOverflows']}")

        # 5. A 10,000-API snapshot pushed to every node.
        time.sleep(2)
        out["push_10k"] = {"rss_before_mb": cp.rss_kb() / 1024, "peak_reset": reset_peak(cp)}
        t = time.time() * 1000
        version = sluice.put_config({"upstreams": [upstream], "apis": [probe(0), *apis(10_000)]})
        arrivals = output.arrivals(version, timeout=600)
        out["push_10k"]["all_nodes_s"] = (max(arrivals) - t) / 1000
        out["push_10k"]["peak_mb"] = status_kb(cp, "VmHWM") / 1024
        time.sleep(5)
        out["push_10k"]["rss_after_mb"] = cp.rss_kb() / 1024
        procs.log(f"  10,000 APIs to {nodes} nodes in {out['push_10k']['all_nodes_s']:.1f}s; CP RSS peak "
                  f"{out['push_10k']['peak_mb']:.0f} MB, after {out['push_10k']['rss_after_mb']:.0f} MB")
        return out
    finally:
        if sim is not None:
            sim.stop()
        sluice.stop()
