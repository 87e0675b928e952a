"""RESULTS.md's primary comparison: the pinned run (`bench/run --pin`, each gateway alone on one core), judged by
requests per gateway CPU-second, and the targets of issue 26 on it and on the callgrind figures."""

from __future__ import annotations

from .fmt import med, num, ratio, rx, sentence, spread, verdict
from .load import core_busy, per_cpu_second, spread as spread_of

# What `bench/run --pin` runs unless told otherwise: the comparisons of gateways side by side. Memory, push,
# fleet and soak do not compare gateways per core; they stay in the unpinned run.
PINNED_SCENARIOS = ["proxy", "secured", "openapi", "round-robin"]

# The gateway each pinned scenario's ratios are taken to: nginx where it does the same work; in `openapi`
# nginx cannot validate, so Sluice's own plain proxy of the same request.
REFERENCE = {"proxy": "nginx", "secured": "nginx", "openapi": "sluice-proxy", "round-robin": "nginx"}

WHAT = {
    "proxy": "POST of the 1,066-byte JSON body to one upstream, keep-alive (the unpinned `proxy`'s request)",
    "secured": "HTTPS in, basic auth, a per-consumer rate limit that never rejects, HTTPS to the upstream; "
               "the same POST (as the unpinned `secured`; `sluice-proxy` is Sluice's plain proxy of it)",
    "openapi": "the 30-byte POST validated against the Fruit Shop spec; `sluice-proxy` the same request without "
               "validation, `nginx-proxy` nginx proxying it (for scale)",
    "round-robin": "GET spread round robin over 3 upstreams",
}


def add_per_core(results: dict) -> dict:
    """Runs saved before requests per gateway CPU-second was summarized get it (and core busy) from their
    runs, by the same functions a new run uses, so old and new files read alike."""
    for s in results.get("scenarios", {}).values():
        gateways = s.get("gateways") if isinstance(s, dict) else None
        for g in (gateways or {}).values():
            if isinstance(g, dict) and "runs" in g and "req_per_cpu_s" not in g:
                g["req_per_cpu_s"] = spread_of([per_cpu_second(r) for r in g["runs"]])
                g["core_busy"] = spread_of([core_busy(r) for r in g["runs"]])
    return results


# The most one gateway's rounds in a pinned scenario may differ in requests per CPU-second (highest over lowest)
# for the run to compare gateways. Other tenants' load on a shared machine moves a pinned core by up to 2x from
# one 10 s round to the next; a quiet machine keeps each gateway's rounds within about 1.1x to 1.3x, and
# a ratio between gateways is not to be trusted beyond what their own rounds agree on.
NOISY_SPREAD = 1.3


def noisy(results: dict) -> list[str]:
    """Each scenario/gateway of a run whose rounds differ by more than NOISY_SPREAD in requests per CPU-second,
    as "proxy/nginx 1.56x"; empty when every gateway's rounds agree."""
    found = []
    for name, s in results.get("scenarios", {}).items():
        gateways = s.get("gateways") if isinstance(s, dict) else None
        for gateway, g in (gateways or {}).items():
            per_cpu = g.get("req_per_cpu_s") if isinstance(g, dict) else None
            low, high = (per_cpu or {}).get("min"), (per_cpu or {}).get("max")
            if low and high and high / low > NOISY_SPREAD:
                found.append(f"{name}/{gateway} {high / low:.2f}x")
    return found


def vs(gateways: dict, key: str, ref: str) -> float | None:
    """Sluice's median `key` as a multiple of gateway `ref`'s."""
    return ratio(med(gateways.get("sluice"), key), med(gateways.get(ref), key))


# Issue 26's pinned targets: (what, measured, goal, higher is better). The one list behind the targets table
# and the section, so the two cannot state different goals.
PINNED_TARGETS = {
    "proxy": lambda g: [
        ("requests per gateway CPU-second ≥ 1.2x nginx", vs(g, "req_per_cpu_s", "nginx"), 1.2, True),
        ("p99 ≤ nginx's", vs(g, "p99_ms", "nginx"), 1.0, False)],
    "secured": lambda g: [
        ("requests per gateway CPU-second ≥ 1.5x nginx", vs(g, "req_per_cpu_s", "nginx"), 1.5, True),
        ("p99 ≤ nginx's", vs(g, "p99_ms", "nginx"), 1.0, False)],
    "round-robin": lambda g: [
        ("requests per gateway CPU-second ≥ 1.2x nginx", vs(g, "req_per_cpu_s", "nginx"), 1.2, True),
        ("p99 ≤ nginx's", vs(g, "p99_ms", "nginx"), 1.0, False)],
}


def instructions_vs_nginx(figures: dict, case: str, peer: str = "nginx") -> float | None:
    got = figures.get("gateways", {})
    s, n = (got.get("sluice") or {}).get(case), (got.get(peer) or {}).get(case)
    return ratio(s["instructions"], n["instructions"]) if s and n else None


# Issue 26's callgrind targets: user-space instructions per request as a multiple of nginx's, at most.
INSTRUCTION_TARGETS = [("proxy", 0.8), ("get", 0.8), ("secured", 1.0)]


def instruction_targets(figures: dict) -> list[tuple[str, str, float | None, float]]:
    """(case, what, measured, goal) for each callgrind target; lower is better."""
    return [(case, f"instructions per request ≤ {goal:.1f}x nginx", instructions_vs_nginx(figures, case), goal)
            for case, goal in INSTRUCTION_TARGETS]


def instruction_verdict(figures: dict, case: str, value: float | None, goal: float) -> str:
    if value is not None:
        return verdict(value, goal, False)
    absent = [g for g in ("sluice", "nginx") if case not in figures.get("gateways", {}).get(g, {})]
    return f"not measured: no {' or '.join(absent) or 'usable'} figures for `{case}`"


# --- the section ------------------------------------------------------------------

def summary(scenarios: dict) -> list[str]:
    """One line per scenario compared with nginx: the headline figures side by side."""
    rows = ["| scenario | Sluice req per gateway CPU-s | nginx | HAProxy | Sluice vs nginx | Sluice p99 vs nginx |",
            "|---|---|---|---|---|---|"]
    for name in PINNED_SCENARIOS:
        s = scenarios.get(name)
        if not s or "error" in s or REFERENCE[name] != "nginx":
            continue
        g = s["gateways"]
        rows.append(f"| {name} | {num(med(g.get('sluice'), 'req_per_cpu_s'))} | "
                    f"{num(med(g.get('nginx'), 'req_per_cpu_s'))} | {num(med(g.get('haproxy'), 'req_per_cpu_s'))} | "
                    f"{rx(vs(g, 'req_per_cpu_s', 'nginx'), bold=True)} | {rx(vs(g, 'p99_ms', 'nginx'))} |")
    return rows if len(rows) > 2 else []


def table(gateways: dict, ref: str) -> list[str]:
    head = (f"| gateway | req per gateway CPU-s | vs {ref} | req/s | p99 ms | p99 vs {ref} | gateway core busy | "
            "gateway sleeps/req | CPU µs/req (user + kernel) | errors / requests |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    r = gateways.get(ref)
    for label, g in gateways.items():
        split = (f"{num(med(g, 'cpu_us_per_req'), 1)} ({num(med(g, 'user_us_per_req'), 1)} + "
                 f"{num(med(g, 'kernel_us_per_req'), 1)})")
        lines.append(
            f"| {label} | {spread(g.get('req_per_cpu_s'))} | "
            f"{rx(ratio(med(g, 'req_per_cpu_s'), med(r, 'req_per_cpu_s')), bold=label == 'sluice')} | "
            f"{spread(g['rps'])} | {spread(g['p99_ms'], 2)} | {rx(ratio(med(g, 'p99_ms'), med(r, 'p99_ms')))} | "
            f"{spread(g.get('core_busy'), 2)} | {spread(g.get('sleeps_per_req'), 2)} | {split} | "
            f"{g['errors']:,} / {g['requests']:,} |")
    return lines


def verdict_lines(name: str, gateways: dict) -> list[str]:
    if name not in PINNED_TARGETS:
        return []
    return [f"* Target {what}: {verdict(value, goal, higher, 'x')}"
            for what, value, goal, higher in PINNED_TARGETS[name](gateways)]


HEADING = "## Per core: gateway pinned to one core (primary comparison)"


def intro(results: dict) -> list[str]:
    """The pinned part's heading, what it measures, and the headline figures of every scenario."""
    m = results["meta"]
    return [
        HEADING,
        "",
        f"`bench/run --pin` on {m['date']}. {sentence(m['placement'])} The headline figure is **requests per gateway "
        "CPU-second**: the requests wrk completed in a run divided by the gateway's utime+stime over it, "
        "median over the rounds (min–max in brackets). It says what one core of each gateway serves, and "
        "unlike req/s it does not depend on how much load core 1 (client and upstreams) can offer. *Gateway "
        "core busy* is that CPU time over the run's wall time (1.00: the gateway used its whole core). *Gateway "
        "sleeps/req* is how often per request the gateway's threads went to sleep for want of work (voluntary "
        "context switches, from /proc): each sleep ends in a wake-up paid in kernel time, and the less busy a "
        "gateway's core, the more often it sleeps (bench/README.md, \"What bounds the pinned ratio\").",
        "",
        *summary(results["scenarios"]),
        "",
    ]


def scenario(name: str, s: dict) -> list[str]:
    """A pinned comparison's table and its targets."""
    g = s["gateways"]
    return [f"### {name} (pinned)", "", f"{WHAT[name]}; {s['connections']} connections.", "",
            *table(g, REFERENCE[name]), "", *verdict_lines(name, g), ""]
