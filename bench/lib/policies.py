"""One API per policy, each with the request that passes it: shared by bench/profile (instructions per
request under callgrind) and bench/run's `policies` scenario (req/s and CPU per request under wrk), so
both compare the same configurations. Also, per policy, how to tell it is really on."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

from .context import BASIC_HEADER, BASIC_PASSWORD, BASIC_USER, SMALL_BODY

API_KEY = "bench-api-key-0001"
JWT_SECRET = "bench-jwt-secret-with-enough-length"
ORIGIN = "https://app.example.com"
SIZE_LIMIT = 1_048_576
JSON = {"Content-Type": "application/json"}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_token(secret: str = JWT_SECRET) -> str:
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "bench"}).encode())
    claims = b64url(json.dumps({"sub": BASIC_USER, "exp": int(time.time()) + 3600}).encode())
    signature = hmac.new(secret.encode(), f"{header}.{claims}".encode(), hashlib.sha256).digest()
    return f"{header}.{claims}.{b64url(signature)}"


def cases() -> list[dict]:
    """One API per policy, each with the request that passes it; `plain` first: the ratios' base.
    Every request is the same 30-byte JSON POST (what the openapi API's spec accepts), so the APIs differ
    only in their policy."""
    post = {"method": "POST", "body": SMALL_BODY, "headers": JSON}

    def api(name: str, policies: list, request: dict | None = None, **extra) -> dict:
        return {"api": {"name": name, "path_prefix": f"/{name}", "strip_prefix": True, "upstream": "backend",
                        "policies": policies, **extra},
                "path": f"/{name}/shop/v2/products", "request": {**post, **(request or {})}}

    with_header = lambda k, v: {"headers": {**JSON, k: v}}  # noqa: E731
    openapi = api("openapi", [], openapi={"spec": "fruitshop", "validate_requests": True})
    openapi["api"].update(path_prefix="/shop/v2", strip_prefix=False)
    return [
        api("plain", []),
        api("basic_auth", [{"basic_auth": {}}], with_header("Authorization", BASIC_HEADER)),
        api("api_key", [{"api_key": {}}], with_header("apikey", API_KEY)),
        api("jwt", [{"jwt": {}}], with_header("Authorization", f"Bearer {hs256_token()}")),
        api("rate_limit", [{"rate_limit": {"requests": 1_000_000_000, "per": "1h", "key": "ip"}}]),
        api("cors", [{"cors": {"allow_origins": [ORIGIN]}}], with_header("Origin", ORIGIN)),
        api("headers", [{"headers": {"request": {"set": {"X-Env": "bench"}, "remove": ["X-Internal"]},
                                     "response": {"remove": ["Server"]}}}]),
        api("ip_restriction", [{"ip_restriction": {"allow": ["127.0.0.0/8"]}}]),
        api("request_size_limit", [{"request_size_limit": {"max_bytes": SIZE_LIMIT}}]),
        # The spec's paths sit under its server's base path, so this API is not prefixed.
        {**openapi, "path": "/shop/v2/products"},
    ]


def config(fixtures: Path, upstream_addr: str, selected: list[dict]) -> dict:
    """The whole configuration for `PUT /v1/config`: one upstream, the spec, one consumer holding every
    kind of credential the cases present, and the selected cases' APIs."""
    spec = (fixtures / "fruitshop-v2-2-0.oas.yml").read_text()
    return {
        "upstreams": [{"name": "backend", "targets": [{"url": f"http://{upstream_addr}"}]}],
        "specs": [{"name": "fruitshop", "content": spec}],
        "consumers": [{"username": BASIC_USER, "basic_auth": {"password": BASIC_PASSWORD},
                       "api_keys": [{"key": API_KEY}],
                       "jwt": [{"key": "bench", "algorithm": "HS256", "secret": JWT_SECRET}]}],
        "apis": [c["api"] for c in selected],
    }


def refusals() -> dict[str, tuple[str, dict, int]]:
    """Per API, a request its policy must refuse and the status it must get: proof the policy runs, so a
    misconfiguration (policy missing, wrong API matched) cannot pass for a cheap policy. Only where one
    request shows it: ip_restriction allows loopback, which is all a local client can be, and the rate
    limit never rejects (its headers on the passing response show it instead: see `marks`)."""
    post = {"method": "POST", "body": SMALL_BODY, "headers": JSON}
    return {
        "basic_auth": ("no credentials", post, 401),
        "api_key": ("a wrong key", {**post, "headers": {**JSON, "apikey": "not-" + API_KEY}}, 401),
        "jwt": ("a token signed with another secret",
                {**post, "headers": {**JSON, "Authorization": f"Bearer {hs256_token('x' + JWT_SECRET)}"}}, 401),
        "cors": ("a preflight from another origin",
                 {"method": "OPTIONS", "body": None,
                  "headers": {"Origin": "https://other.example.com", "Access-Control-Request-Method": "POST"}}, 403),
        # Declared length over the limit, no body sent: refused from the headers alone.
        "request_size_limit": (f"Content-Length {SIZE_LIMIT + 1:,}",
                               {**post, "body": None, "headers": {**JSON, "Content-Length": str(SIZE_LIMIT + 1)}},
                               413),
        "openapi": ("a negative price", {**post, "body": b'{"name":"Mangos","price":-1}'}, 400),
    }


def marks() -> dict[str, tuple[str, str, str | None]]:
    """Per API, what the passing response shows when its policy ran: (where, header, value or None for
    any), where is `response` (the data plane's answer) or `upstream` (a header the echo upstream saw)."""
    return {
        "rate_limit": ("response", "ratelimit-limit", None),
        "cors": ("response", "access-control-allow-origin", ORIGIN),
        "headers": ("upstream", "x-env", "bench"),
    }
