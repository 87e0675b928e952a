"""The peers Sluice is compared with, configured for the same job: nginx and
(when installed) HAProxy. Both run in the foreground under our pid, with their
configuration and temp files in the run's own directory."""

from __future__ import annotations

import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from . import procs


@dataclass
class Tls:
    cert: Path
    key: Path
    ca: Path


def have_haproxy() -> bool:
    return shutil.which("haproxy") is not None


def start_nginx(workdir: Path, cores: int, cpus: str | None, server_block: str, upstreams: str,
                http_extra: str = "") -> tuple[procs.Proc, int]:
    """nginx with `worker_processes` = the gateway's cores, keep-alive both ways, no access log."""
    d = workdir / "nginx"
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    port = procs.free_port()
    conf = f"""
user root;
daemon off;
master_process on;
worker_processes {cores};
worker_rlimit_nofile 20000;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    {http_extra}
    {upstreams}
    server {{
        {server_block.replace("LISTEN_PORT", str(port))}
    }}
}}
"""
    path = d / "nginx.conf"
    path.write_text(conf)
    proc = procs.start("nginx", ["nginx", "-c", str(path), "-p", str(d)], workdir, cpus=cpus,
                       stop_signal=signal.SIGQUIT)
    procs.wait_tcp(port, proc=proc)
    return proc, port


def nginx_upstream(name: str, targets: list[str], scheme_tls: bool = False) -> str:
    servers = "\n".join(f"        server {t};" for t in targets)
    return f"""
    upstream {name} {{
{servers}
        keepalive 512;
        keepalive_requests 1000000;
    }}"""


PROXY_TO = """
            proxy_pass {scheme}://{upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";"""


def nginx_plain(workdir: Path, cores: int, cpus: str | None, targets: list[str],
                locations: list[str] | None = None) -> tuple[procs.Proc, int]:
    """Plain reverse proxy (round robin over targets); `locations` adds one prefix location each (memory)."""
    proxy = PROXY_TO.format(scheme="http", upstream="backend")
    blocks = [f"location / {{{proxy}\n        }}"]
    for prefix in locations or []:
        blocks.append(f"location {prefix}/ {{{proxy}\n        }}")
    server = "listen 127.0.0.1:LISTEN_PORT;\n        " + "\n        ".join(blocks)
    return start_nginx(workdir, cores, cpus, server, nginx_upstream("backend", targets))


def nginx_secured(workdir: Path, cores: int, cpus: str | None, target: str, tls: Tls,
                  htpasswd: Path) -> tuple[procs.Proc, int]:
    """HTTPS in, auth_basic, a limit_req that never rejects, HTTPS (verified) to the upstream."""
    proxy = PROXY_TO.format(scheme="https", upstream="backend_tls")
    server = f"""listen 127.0.0.1:LISTEN_PORT ssl;
        ssl_certificate {tls.cert};
        ssl_certificate_key {tls.key};
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:SSL:10m;
        location / {{
            auth_basic "bench";
            auth_basic_user_file {htpasswd};
            limit_req zone=per_consumer burst=1000000 nodelay;
            proxy_set_header Authorization "";
            proxy_set_header X-Consumer-Username $remote_user;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {tls.ca};
            proxy_ssl_name localhost;
            proxy_ssl_server_name on;
            proxy_ssl_session_reuse on;{proxy}
        }}"""
    extra = "limit_req_zone $remote_user zone=per_consumer:10m rate=1000000r/s;"
    return start_nginx(workdir, cores, cpus, server, nginx_upstream("backend_tls", [target]), extra)


def start_haproxy(workdir: Path, cores: int, cpus: str | None, targets: list[str]) -> tuple[procs.Proc, int]:
    """HAProxy in HTTP mode, `nbthread` = the gateway's cores, round robin, connection reuse, no logging."""
    d = workdir / "haproxy"
    d.mkdir(parents=True, exist_ok=True)
    port = procs.free_port()
    servers = "\n".join(f"    server s{i} {t}" for i, t in enumerate(targets))
    conf = f"""
global
    nbthread {cores}
    maxconn 8000
    pidfile {d}/haproxy.pid

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
    http-reuse always

frontend fe
    bind 127.0.0.1:{port}
    default_backend be

backend be
    balance roundrobin
{servers}
"""
    path = d / "haproxy.cfg"
    path.write_text(conf)
    proc = procs.start("haproxy", ["haproxy", "-db", "-f", str(path)], workdir, cpus=cpus)
    procs.wait_tcp(port, proc=proc)
    return proc, port
