"""Processes the benchmark starts: started with their pid recorded, stopped by
that pid (never by name), and measured from /proc (CPU ticks and RSS)."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")

# Every process started by this run, so the exit handler can stop what a
# scenario left behind after a crash.
_STARTED: list["Proc"] = []


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port() -> int:
    """A port free right now on 127.0.0.1 (for peers that cannot bind port 0 and report it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    out: Path
    err: Path
    stop_signal: int = signal.SIGTERM
    extra: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def pids(self) -> list[int]:
        """This process and its descendants (nginx master + workers)."""
        found, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            try:
                for task in os.listdir(f"/proc/{pid}/task"):
                    children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                    todo.extend(int(c) for c in children)
            except OSError:
                pass
        return found

    def cpu_seconds(self) -> float:
        """utime + stime of the process and its descendants, all threads."""
        return sum(self.cpu_split())

    def cpu_split(self) -> tuple[float, float]:
        """(user, kernel) CPU seconds of the process and its descendants, all threads."""
        user = kernel = 0
        for pid in self.pids():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            user += int(fields[11])  # utime (field 14)
            kernel += int(fields[12])  # stime (field 15)
        return user / CLK_TCK, kernel / CLK_TCK

    def sleeps(self) -> int:
        """Times the process and its descendants went to sleep (voluntary context switches, all threads):
        a gateway that runs out of work waits in epoll_wait, and each wait ends in a wake-up that costs
        kernel time."""
        total = 0
        for pid in self.pids():
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            total += sum(_status_number(f"/proc/{pid}/task/{task}/status", "voluntary_ctxt_switches:")
                         for task in tasks)
        return total

    def rss_kb(self) -> int:
        """Sum of VmRSS of the process and its descendants."""
        return sum(_status_number(f"/proc/{pid}/status", "VmRSS:") for pid in self.pids())

    def first_json_line(self, timeout: float = 30.0) -> dict:
        """The JSON line a Sluice binary prints on stdout once bound."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}); see {self.err}")
            for line in self.out.read_text(errors="replace").splitlines():
                line = line.strip()
                if line.startswith("{"):
                    try:
                        return json.loads(line)
                    except json.JSONDecodeError:
                        pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} printed no address line within {timeout}s; see {self.err}")

    def stop(self, grace: float = 5.0) -> None:
        if self.alive():
            try:
                os.kill(self.pid, self.stop_signal)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                # Its own descendants first (nginx workers), each by pid.
                for pid in reversed(self.pids()):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                self.popen.wait(timeout=grace)
        if self in _STARTED:
            _STARTED.remove(self)


def _status_number(path: str, key: str) -> int:
    """The number after `key` in a /proc status file; 0 once the process or thread has gone."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def start(name: str, argv: list[str], workdir: Path, cpus: str | None = None,
          env: dict | None = None, stop_signal: int = signal.SIGTERM) -> Proc:
    """Starts argv (pinned to `cpus` with taskset when given); stdout and stderr go to files in workdir."""
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    out, err = workdir / f"{name}.out", workdir / f"{name}.err"
    full_env = dict(os.environ)
    full_env.update(env or {})
    popen = subprocess.Popen(argv, stdout=out.open("wb"), stderr=err.open("wb"), stdin=subprocess.DEVNULL,
                             cwd=workdir, env=full_env, preexec_fn=_raise_nofile)
    proc = Proc(name, popen, out, err, stop_signal)
    _STARTED.append(proc)
    return proc


def stop_all() -> None:
    for proc in list(reversed(_STARTED)):
        try:
            proc.stop()
        except Exception as e:  # noqa: BLE001 - best effort at exit
            log(f"could not stop {proc.name} (pid {proc.pid}): {e}")


def still_running() -> list[str]:
    return [f"{p.name} (pid {p.pid})" for p in _STARTED if p.alive()]


def wait_http(url: str, timeout: float = 30.0, expect: int = 200, proc: Proc | None = None) -> None:
    import urllib.error
    import urllib.request
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited; see {proc.err}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == expect:
                    return
                last = r.status
        except urllib.error.HTTPError as e:
            last = e.code
            if e.code == expect:
                return
        except OSError as e:
            last = e
        time.sleep(0.05)
    raise RuntimeError(f"{url} not answering {expect} within {timeout}s (last: {last})")


def wait_tcp(port: int, timeout: float = 15.0, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited; see {proc.err}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"127.0.0.1:{port} not accepting within {timeout}s")
