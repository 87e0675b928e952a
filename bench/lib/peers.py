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


def nginx_dirs(d: Path) -> None:
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (d / sub).mkdir(parents=True, exist_ok=True)


def nginx_conf(d: Path, cores: int, servers: list[str], upstreams: str, http_extra: str = "",
               single_process: bool = False) -> str:
    """The whole nginx.conf: keep-alive both ways, no access log, temp files in `d`. `single_process`: no
    master, one worker in the foreground process itself (what bench/profile runs under callgrind)."""
    processes = ("master_process off;\nworker_processes 1;" if single_process
                 else f"user root;\nmaster_process on;\nworker_processes {cores};")
    blocks = "\n".join(f"    server {{\n        {server}\n    }}" for server in servers)
    return f"""
daemon off;
{processes}
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
    # Unique per process and request, made once per request (see FORWARDED_FIELDS).
    map $connection_requests $gateway_request_id {{ default "$pid-$connection-$connection_requests"; }}
    {http_extra}
    {upstreams}
{blocks}
}}
"""


def start_nginx(workdir: Path, cores: int, cpus: str | None, server_block: str, upstreams: str,
                http_extra: str = "") -> tuple[procs.Proc, int]:
    """nginx with `worker_processes` = the gateway's cores, keep-alive both ways, no access log."""
    d = workdir / "nginx"
    nginx_dirs(d)
    port = procs.free_port()
    conf = nginx_conf(d, cores, [server_block.replace("LISTEN_PORT", str(port))], upstreams, http_extra)
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


# What Sluice adds to every proxied request and response unless told not to
# (docs/operations.md, "Forwarding fields"): the peers add the same, so every
# gateway sends the upstream the same fields (which the echo upstream returns
# in its body) and the client the same answer. Without them the peers'
# requests and answers were smaller (on GET the answer by a third), and the
# comparison was not of the same job. The request ID is unique per process
# and request, as Sluice's is (a counter), and made once per request
# (`$gateway_request_id`, see `nginx_conf`); nginx's `$request_id` would
# draw 16 random bytes from OpenSSL per request, which under callgrind costs
# it about 4,800 instructions per request more than this one.
FORWARDED_FIELDS = ("x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "via", "x-request-id")
ANSWERED_FIELDS = ("via", "x-request-id")

NGINX_FORWARDING = """
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Forwarded-Host $http_host;
            proxy_set_header Via "1.1 nginx";
            proxy_set_header X-Request-Id $gateway_request_id;
            add_header Via "1.1 nginx" always;
            add_header X-Request-Id $gateway_request_id always;"""


def proxy_to(scheme: str, upstream: str, same_job: bool = True) -> str:
    """An nginx `location`'s proxying: HTTP/1.1 keep-alive to `upstream`; `same_job`: adding what Sluice
    adds (`FORWARDED_FIELDS`), else only what nginx adds by itself (bench/profile's `nginx-bare`)."""
    return f"""
            proxy_pass {scheme}://{upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";{NGINX_FORWARDING if same_job else ""}"""


def nginx_plain(workdir: Path, cores: int, cpus: str | None, targets: list[str],
                locations: list[str] | None = None) -> tuple[procs.Proc, int]:
    """Plain reverse proxy (round robin over targets); `locations` adds one prefix location each (memory)."""
    proxy = proxy_to("http", "backend")
    blocks = [f"location / {{{proxy}\n        }}"]
    for prefix in locations or []:
        blocks.append(f"location {prefix}/ {{{proxy}\n        }}")
    server = "listen 127.0.0.1:LISTEN_PORT;\n        " + "\n        ".join(blocks)
    return start_nginx(workdir, cores, cpus, server, nginx_upstream("backend", targets))


def secured_server(tls: Tls, htpasswd: Path, upstream: str, same_job: bool = True) -> str:
    """HTTPS in, auth_basic, a limit_req that never rejects, HTTPS (verified) to `upstream`."""
    proxy = proxy_to("https", upstream, same_job)
    return f"""listen 127.0.0.1:LISTEN_PORT ssl;
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


PER_CONSUMER_ZONE = "limit_req_zone $remote_user zone=per_consumer:10m rate=1000000r/s;"


def nginx_secured(workdir: Path, cores: int, cpus: str | None, target: str, tls: Tls,
                  htpasswd: Path) -> tuple[procs.Proc, int]:
    """HTTPS in, auth_basic, a limit_req that never rejects, HTTPS (verified) to the upstream."""
    server = secured_server(tls, htpasswd, "backend_tls")
    return start_nginx(workdir, cores, cpus, server, nginx_upstream("backend_tls", [target]), PER_CONSUMER_ZONE)


HAPROXY_DEFAULTS = """
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
    http-reuse always
"""


def haproxy_forwarding(proto: str) -> str:
    """A frontend's rules for what Sluice adds (see `FORWARDED_FIELDS`); `proto`: http or https."""
    return f"""    option forwardfor
    http-request set-header X-Forwarded-Proto {proto}
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    http-request set-header Via "1.1 haproxy"
    unique-id-format %{{+X}}o%pid-%rt
    unique-id-header X-Request-Id
    http-response set-header Via "1.1 haproxy"
    http-response set-header X-Request-Id %[unique-id]
"""


def haproxy_global(d: Path, threads: int) -> str:
    return f"""
global
    nbthread {threads}
    maxconn 8000
    pidfile {d}/haproxy.pid
"""


def haproxy_servers(targets: list[str], prefix: str = "s", options: str = "") -> str:
    return "\n".join(f"    server {prefix}{i} {t}{options}" for i, t in enumerate(targets))


def start_haproxy(workdir: Path, cores: int, cpus: str | None, targets: list[str]) -> tuple[procs.Proc, int]:
    """HAProxy in HTTP mode, `nbthread` = the gateway's cores, round robin, connection reuse, no logging."""
    d = workdir / "haproxy"
    d.mkdir(parents=True, exist_ok=True)
    port = procs.free_port()
    conf = f"""{haproxy_global(d, cores)}{HAPROXY_DEFAULTS}
frontend fe
    bind 127.0.0.1:{port}
{haproxy_forwarding("http")}    default_backend be

backend be
    balance roundrobin
{haproxy_servers(targets)}
"""
    path = d / "haproxy.cfg"
    path.write_text(conf)
    proc = procs.start("haproxy", ["haproxy", "-db", "-f", str(path)], workdir, cpus=cpus)
    procs.wait_tcp(port, proc=proc)
    return proc, port
