"""Sluice under test: a control plane (SQLite in the run's temp dir) and one or
more data planes, configured only through the admin API."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import procs

ADMIN_TOKEN = "bench-admin-token"
CLUSTER_TOKEN = "bench-cluster-token"


@dataclass
class DataPlane:
    proc: procs.Proc
    node_id: str
    http: str   # host:port
    https: str
    ops: str

    def metric(self, name: str) -> float | None:
        """A plain (unlabelled) sample from /metrics, e.g. `sluice_snapshot_compile_seconds_sum`."""
        with urllib.request.urlopen(f"http://{self.ops}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{}"):
                    return float(line.rsplit(" ", 1)[1])
        return None


@dataclass
class Sluice:
    bins: Path
    workdir: Path
    gateway_cpus: str | None
    gateway_cores: int
    cp_cpus: str | None = None
    cp: procs.Proc | None = None
    admin: str = ""
    grpc: str = ""
    dps: list[DataPlane] = field(default_factory=list)

    def start_control_plane(self, grpc_addr: str = "127.0.0.1:0") -> None:
        """`grpc_addr`: the previous one, to restart it where its data planes reconnect."""
        self.cp = procs.start("sluice-cp", [
            str(self.bins / "sluice-cp"),
            "--database-url", f"sqlite://{self.workdir / 'cp.db'}",
            "--admin-addr", "127.0.0.1:0", "--grpc-addr", grpc_addr,
            "--admin-token", ADMIN_TOKEN, "--cluster-token", CLUSTER_TOKEN,
            "--secret-key-file", str(self.workdir / "secret.key"),
        ], self.workdir, cpus=self.cp_cpus, env={"RUST_LOG": "warn"})
        bound = self.cp.first_json_line(timeout=60)
        self.admin, self.grpc = bound["admin_addr"], bound["grpc_addr"]

    def start_data_plane(self, node_id: str, snapshot_cache: bool = False,
                         wrapper: list[str] | None = None) -> DataPlane:
        """`wrapper` runs the data plane under another program (bench/profile: valgrind)."""
        argv = [*(wrapper or []), str(self.bins / "sluice-dp"), "--control-plane", f"http://{self.grpc}",
                "--cluster-token", CLUSTER_TOKEN, "--http-addr", "127.0.0.1:0", "--https-addr", "127.0.0.1:0",
                "--ops-addr", "127.0.0.1:0", "--node-id", node_id, "--access-log", "off"]
        if snapshot_cache:
            argv += ["--snapshot-cache", str(self.workdir / f"{node_id}.snapshot")]
        # Sluice sizes its proxy workers from the CPU affinity; the env var makes it explicit.
        proc = procs.start(node_id, argv, self.workdir, cpus=self.gateway_cpus,
                           env={"RUST_LOG": "warn", "SLUICE_WORKER_THREADS": str(self.gateway_cores)})
        bound = proc.first_json_line(timeout=120 if wrapper else 30)
        dp = DataPlane(proc, node_id, bound["http_addr"], bound["https_addr"], bound["ops_addr"])
        self.dps.append(dp)
        return dp

    def start(self, n_data_planes: int = 1, snapshot_cache: bool = False) -> None:
        self.start_control_plane()
        for i in range(n_data_planes):
            self.start_data_plane(f"bench-dp{i + 1}", snapshot_cache=snapshot_cache and i == n_data_planes - 1)

    # --- admin API -------------------------------------------------------

    def call(self, method: str, path: str, body=None, timeout: float = 300) -> tuple[int, dict, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{self.admin}{path}", data=data, method=method)
        req.add_header("Authorization", f"Bearer {ADMIN_TOKEN}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                text = r.read().decode()
                return r.status, dict(r.headers), (json.loads(text) if text else {})
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            raise RuntimeError(f"{method} {path} -> {e.code}: {text[:2000]}") from None

    def put_config(self, config: dict) -> int:
        """Replaces the whole configuration; returns the committed version."""
        _, _, result = self.call("PUT", "/v1/config", config)
        return int(result["version"])

    def put_api(self, api: dict) -> int:
        _, headers, _ = self.call("PUT", f"/v1/apis/{api['name']}", api)
        return int(headers.get("Sluice-Config-Version") or headers.get("sluice-config-version") or 0)

    def wait_applied(self, version: int, timeout: float = 120) -> None:
        """Until every data plane reports `version` (or newer) applied on /v1/data-planes."""
        want = {dp.node_id for dp in self.dps}
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            for dp in self.dps:
                if not dp.proc.alive():
                    raise RuntimeError(f"{dp.node_id} exited; see {dp.proc.err}")
            _, _, page = self.call("GET", "/v1/data-planes")
            last = page.get("items", [])
            done = {n["node_id"] for n in last if (n.get("applied_version") or 0) >= version}
            if want <= done:
                for dp in self.dps:
                    procs.wait_http(f"http://{dp.ops}/readyz", timeout=30, proc=dp.proc)
                return
            nacked = [n for n in last if n["node_id"] in want and (n.get("last_nack_version") or 0) >= version]
            if nacked:
                raise RuntimeError(f"snapshot {version} NACKed: {nacked[0].get('last_error')}")
            time.sleep(0.05)
        raise RuntimeError(f"data planes did not apply version {version} within {timeout}s: {last}")

    def configure(self, config: dict, timeout: float = 120) -> int:
        version = self.put_config(config)
        self.wait_applied(version, timeout)
        return version

    def stop(self) -> None:
        for dp in reversed(self.dps):
            dp.proc.stop()
        if self.cp:
            self.cp.stop()
