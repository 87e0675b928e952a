"""RESULTS.md and the SVG chart, from the saved runs: the pinned run (bench/run --pin, the primary comparison),
the unpinned run (bench/run) and the callgrind figures (bench/profile --gateways). Plain text, no dependencies."""

from __future__ import annotations

from html import escape
from pathlib import Path

from . import percore
from .fmt import mb, med, num, ratio, rx, sentence, spread, verdict
from .percore import vs
from .saved import KINDS, Sources

COLORS = {"sluice": "#1f77b4", "sluice-proxy": "#7fb3e0", "nginx": "#2ca02c", "nginx-proxy": "#98df8a",
          "haproxy": "#ff7f0e"}
CHART_SCENARIOS = ["proxy", "secured", "openapi", "round-robin"]


def gateway_table(gateways: dict, ref: str | None) -> list[str]:
    head = ("| gateway | req/s | p50 ms | p99 ms | p99.9 ms | errors / requests | CPU µs/req | RSS idle | "
            "RSS load |" + (f" req/s vs {ref} | p99 vs {ref} | CPU vs {ref} |" if ref else ""))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    r = gateways.get(ref) if ref else None
    for label, g in gateways.items():
        row = (f"| {label} | {spread(g['rps'])} | {spread(g['p50_ms'], 2)} | {spread(g['p99_ms'], 2)} | "
               f"{spread(g['p999_ms'], 2)} | {g['errors']:,} / {g['requests']:,} | {spread(g['cpu_us_per_req'], 1)} | "
               f"{mb(g['rss_idle_kb'])} | {mb(med(g, 'rss_load_kb'))} |")
        if ref:
            row += (f" {rx(ratio(med(g, 'rps'), med(r, 'rps')))} | {rx(ratio(med(g, 'p99_ms'), med(r, 'p99_ms')))} |"
                    f" {rx(ratio(med(g, 'cpu_us_per_req'), med(r, 'cpu_us_per_req')))} |")
        lines.append(row)
    return lines


def cpu_split(gateways: dict) -> list[str]:
    """Each gateway's CPU per request as user + kernel time: kernel time (loopback TCP for the same
    syscalls) is much the same for every gateway, so the user part is where they differ."""
    parts = [f"{label} {num(med(g, 'user_us_per_req'), 1)} + {num(med(g, 'kernel_us_per_req'), 1)}"
             for label, g in gateways.items() if med(g, "user_us_per_req") is not None]
    return [f"* CPU µs/request as user + kernel time (medians): {'; '.join(parts)}"] if parts else []


# --- targets -----------------------------------------------------------------

def mb_of(kb) -> float | None:
    return None if kb is None else kb / 1024


# Issue 5's targets per scenario: (what, measured, goal, higher is better, unit). The one list behind both a
# scenario's section and the summary table, so the two cannot state different goals.
TARGETS = {
    "proxy": lambda s: [
        ("req/s ≥ 1.2x nginx", vs(s["gateways"], "rps", "nginx"), 1.2, True, "x"),
        ("p99 ≤ 1.0x nginx", vs(s["gateways"], "p99_ms", "nginx"), 1.0, False, "x"),
        ("CPU/req ≤ 0.8x nginx", vs(s["gateways"], "cpu_us_per_req", "nginx"), 0.8, False, "x")],
    "secured": lambda s: [("≥ 0.9x Sluice's own proxy", vs(s["gateways"], "rps", "sluice-proxy"), 0.9, True, "x")],
    "openapi": lambda s: [
        ("≥ 0.95x Sluice's own plain proxy", vs(s["gateways"], "rps", "sluice-proxy"), 0.95, True, "x")],
    "round-robin": lambda s: [("req/s ≥ 1.2x nginx", vs(s["gateways"], "rps", "nginx"), 1.2, True, "x")],
    "memory": lambda s: [
        ("idle data plane ≤ 8 MB (taken with 1,000 APIs loaded)",
         mb_of(s["gateways"]["sluice"].get("rss_idle_1000_apis_kb")), 8, False, "MB"),
        (f"≤ 40 MB under {s['connections']} connections",
         mb_of(s["gateways"]["sluice"].get("rss_500_conns_kb")), 40, False, "MB")],
    "push": lambda s: [
        ("write→served p99 ≤ 50 ms", s["visible"]["p99_ms"], 50, False, "ms"),
        ("10,000 APIs compile+swap ≤ 200 ms", s["sizes"].get("10000", {}).get("compile_ms_median"), 200, False,
         "ms"),
        ("live p99 during swaps ≤ 1.5x without", s["live"]["p99_ratio"], 1.5, False, "x")],
    "fleet": lambda s: [
        (f"write on all {s['nodes']:,} nodes p99 ≤ 250 ms", s["write"]["all_nodes_ms"]["p99"], 250, False, "ms"),
        ("control-plane CPU per write ≤ 50 ms", s["write"]["cp_cpu_ms_per_write"], 50, False, "ms"),
        ("control-plane RSS with 10,000 APIs ≤ 200 MB", s["rss_10k_no_nodes_mb"], 200, False, "MB"),
        ("control-plane RSS after pushing them ≤ 250 MB", s["push_10k"]["rss_after_mb"], 250, False, "MB"),
        ("every node back after a restart ≤ 5 s", s["reconnect"]["all_back_s"], 5, False, "s")],
}


def target_lines(name: str, s: dict) -> list[str]:
    return [f"* Target {what}: {verdict(value, goal, higher, unit)}"
            for what, value, goal, higher, unit in TARGETS[name](s)]


# --- sections -----------------------------------------------------------------

def comparison(name: str, title: str, ref: str, intro, split: bool = True):
    """The section of a scenario that measures gateways side by side: `intro(s)`, the table against `ref`,
    the targets and (with `split`) the user/kernel split of CPU time."""
    def section(s: dict) -> list[str]:
        g = s["gateways"]
        return [f"## {title}", "", intro(s), "", *gateway_table(g, ref), "", *target_lines(name, s),
                *(cpu_split(g) if split else []), ""]
    return section


section_proxy = comparison(
    "proxy", "proxy — Membrane test 1", "nginx",
    lambda s: f"POST /shop/v2/products, {s['body_bytes']:,}-byte JSON body, keep-alive, {s['connections']} "
              f"connections (wrk opens {s['gateways']['sluice']['connections']}: it splits them evenly over its "
              "threads).")

section_secured = comparison(
    "secured", "secured — Membrane test 2", "nginx",
    lambda s: "HTTPS in (self-signed ECDSA P-256 leaf made with openssl at run time), basic auth, a per-consumer "
              "rate limit that never rejects, HTTPS (verified against the run's CA, HTTP/1.1) to the upstream; same "
              f"{s['body_bytes']:,}-byte POST, {s['connections']} connections. `sluice-proxy` is Sluice's own "
              "plain-HTTP proxy of the same request on the same data plane, run in the same rotation. nginx: "
              "`auth_basic` (salted SHA-1 `{SSHA}` htpasswd: see the notes), `limit_req` (1,000,000 r/s per "
              "`$remote_user`, burst 1,000,000), `proxy_ssl_verify on` with session reuse and upstream keep-alive.")

section_openapi = comparison(
    "openapi", "openapi — Membrane test 3", "sluice-proxy",
    lambda s: "POST /shop/v2/products `{\"name\":\"Mangos\",\"price\":2.79}` (30 bytes) validated against "
              "`fruitshop-v2-2-0.oas.yml` (request validation on); `sluice-proxy` is the same request through a "
              "plain API on the same data plane, `nginx-proxy` nginx proxying it without validation (for scale; "
              "nginx cannot validate). A negative price was checked to get 400 before measuring.",
    split=False)

section_rr = comparison(
    "round-robin", "round-robin — BunGate's test", "nginx",
    lambda s: f"GET /api/products spread round robin over {s['upstreams']} upstreams, {s['connections']} "
              "connections (checked before measuring: 6 requests reach all 3).")


def section_policies(s: dict) -> list[str]:
    g = s["gateways"]
    base = g.get("plain")
    lines = [
        "## policies — cost per request",
        "",
        "One API per policy on one Sluice data plane (the APIs of `bench/lib/policies.py`, the same as "
        "`bench/profile`'s), each sent the request that passes its policy: POST `{\"name\":\"Mangos\","
        f"\"price\":2.79}}` ({s['body_bytes']} bytes), keep-alive, {s['connections']} connections. `plain` is the "
        "same API without a policy, and the ratios are to it: req/s below 1.00x and CPU/request above 1.00x "
        "is what the policy costs (CPU/request is the more direct measure: req/s also depends on how the "
        "shared cores are split with wrk and the upstream). The APIs took turns run by run.",
        "",
        "| policy | req/s | p99 ms | errors / requests | CPU µs/req | req/s vs plain | CPU/req vs plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, x in g.items():
        lines.append(f"| {label} | {spread(x['rps'])} | {spread(x['p99_ms'], 2)} | "
                     f"{x['errors']:,} / {x['requests']:,} | {spread(x['cpu_us_per_req'], 1)} | "
                     f"{rx(ratio(med(x, 'rps'), med(base, 'rps')))} | "
                     f"{rx(ratio(med(x, 'cpu_us_per_req'), med(base, 'cpu_us_per_req')))} |")
    lines += ["", "Checked once per API before measuring, so a policy left off cannot pass for a free one:", ""]
    lines += [f"* {label}: {'; '.join(shown)}" for label, shown in s.get("checks", {}).items()]
    return lines + [""]


def section_memory(s: dict) -> list[str]:
    g = s["gateways"]
    sl, ng = g["sluice"], g["nginx"]
    rows = [("just started, no snapshot", "rss_started_kb"), ("idle, 1 API", "rss_idle_1_api_kb"),
            ("idle, 1,000 APIs", "rss_idle_1000_apis_kb"), (f"peak under {s['connections']} connections "
                                                            "(1,000 APIs)", "rss_500_conns_kb"),
            ("idle again after the load", "rss_after_load_kb")]
    lines = ["## memory", "",
             "Resident memory (sum of VmRSS of the gateway's processes: Sluice's data plane; nginx master + "
             f"workers). nginx has one `location` per API. Load: GET on one of the 1,000 APIs, "
             f"{s['connections']} connections.", "",
             "| state | Sluice data plane | nginx |", "|---|---|---|"]
    for title, key in rows:
        lines.append(f"| {title} | {mb(sl.get(key))} | {mb(ng.get(key))} |")
    lines += ["", "Under that load: " + ", ".join(
        f"{label} {spread(g[label]['load']['rps'])} req/s, p99 {spread(g[label]['load']['p99_ms'], 2)} ms"
        for label in ("sluice", "nginx")), ""]
    idle, under_load = target_lines("memory", s)
    return lines + [f"{idle} (with 1 API: {mb(sl.get('rss_idle_1_api_kb'))})", under_load, ""]


def section_push(s: dict) -> list[str]:
    v, sizes, live = s["visible"], s["sizes"], s["live"]
    served, compiled, swapping = target_lines("push", s)
    lines = ["## push — configuration changes reaching the data planes", "",
             f"**Write to served.** {v['writes']} admin writes (`PUT /v1/apis/probe` changing a response header); "
             "for each, the time from the admin call returning until each of the 2 data planes serves the new "
             "header (polled over keep-alive). The admin call itself took "
             f"{v['admin_write_ms_p50']:.1f} ms (median). Missed (not seen within 15 s): {v['missed']}.", "",
             "| | p50 ms | p99 ms |", "|---|---|---|",
             f"| both data planes | {v['p50_ms']:.1f} | {v['p99_ms']:.1f} |"]
    for node, x in v["per_data_plane"].items():
        lines.append(f"| {node} | {x['p50_ms']:.1f} | {x['p99_ms']:.1f} |")
    lines += ["", served, "",
              "**Compile + swap and snapshot size.** The whole configuration replaced with N APIs (`PUT "
              "/v1/config`), then single-API writes on top; compile time from the data plane's "
              "`sluice_snapshot_compile_seconds` (sum/count deltas per swap); size is the protobuf snapshot, sealed (32 bytes more), as "
              "the data plane caches it (`--snapshot-cache`).", "",
              "CPU per single-API write is the processes' user+system time over those writes, divided by "
              "their number.", "",
              "| APIs | compile+swap ms (median of single-API writes) | first compile ms | snapshot size | "
              "PUT /v1/config s | PUT → applied on both s | single-API write s | CPU ms per write: CP / each DP "
              "| DP RSS | CP RSS |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for n, x in sizes.items():
        cpu = x.get("write_cpu_ms")  # absent in runs before it was measured
        cpu_text = f"{cpu['cp']:.0f} / {' / '.join(f'{d:.0f}' for d in cpu['dps'])}" if cpu else "-"
        lines.append(f"| {int(n):,} | {num(x['compile_ms_median'], 1)} | {num(x['first_compile_ms'], 1)} | "
                     f"{num((x['snapshot_bytes'] or 0) / 1024, 0)} KiB | {x['put_config_s']:.2f} | "
                     f"{x['put_to_applied_s']:.2f} | {x['single_api_write_s_median']:.2f} | {cpu_text} | "
                     f"{mb(x['dp_rss_kb'])} | {mb(x['cp_rss_kb'])} |")
    lines += ["", compiled, "",
              "**Live traffic during swaps.** GET through data plane 1 (175 connections) with the 10,000-API "
              "configuration loaded, alternating runs without writes and runs with one single-API write a "
              "second (each write makes a full 10,000-API snapshot that both data planes compile and swap). "
              f"Swaps seen per run: {', '.join(f'{c:.0f}' for c in live['swaps_per_run'])}.", "",
              *gateway_table({"no swaps": live["quiet"], "swapping every 1 s": live["swapping"]}, "no swaps"), "",
              swapping, ""]
    return lines


def section_fleet(s: dict) -> list[str]:
    n, w, r, p = s["nodes"], s["write"], s["reconnect"], s["push_10k"]
    return [f"## fleet — {n:,} simulated data planes on one control plane", "",
            f"`sluice-fleet-sim` holds {n:,} sync streams (testkit's SimNode: the protocol without compiling) "
            "against a release `sluice-cp` on SQLite. A write is `PUT /v1/apis/probe` with a 12-API "
            "configuration; its time to a node is from before the admin call to the node's receipt of the "
            "snapshot. CPU is the control plane's utime+stime over the writes minus the idle fleet's cost "
            f"({w['cp_idle_cpu_ms_per_s']:.1f} ms/s: heartbeats every 5 s), per write.", "",
            "| figure | measured | target |", "|---|---|---|",
            f"| write on all nodes, p50 / p99 / max of {w['writes']} | {w['all_nodes_ms']['p50']:.0f} / "
            f"{w['all_nodes_ms']['p99']:.0f} / {w['all_nodes_ms']['max']:.0f} ms | p99 ≤ 250 ms: "
            f"{verdict(w['all_nodes_ms']['p99'], 250, False, 'ms')} |",
            f"| every node's arrival, p50 / p99 | {w['per_node_ms']['p50']:.0f} / {w['per_node_ms']['p99']:.0f} ms | |",
            f"| control-plane CPU per write | {w['cp_cpu_ms_per_write']:.1f} ms | ≤ 50 ms: "
            f"{verdict(w['cp_cpu_ms_per_write'], 50, False, 'ms')} |",
            f"| CP RSS, 10,000 APIs, no node | {s['rss_10k_no_nodes_mb']:.0f} MB | ≤ 200 MB: "
            f"{verdict(s['rss_10k_no_nodes_mb'], 200, False, 'MB')} |",
            f"| CP RSS, 12 APIs: no node / {n:,} nodes | {s['rss_small_no_nodes_mb']:.0f} / "
            f"{s['rss_small_nodes_mb']:.0f} MB | |",
            f"| 10,000-API snapshot to every node | {p['all_nodes_s']:.1f} s; CP RSS before {p['rss_before_mb']:.0f} "
            f"MB, peak {p['peak_mb']:.0f} MB, after {p['rss_after_mb']:.0f} MB | after ≤ 250 MB: "
            f"{verdict(p['rss_after_mb'], 250, False, 'MB')} |",
            f"| all nodes back after a CP restart | {r['all_back_s']:.2f} s | ≤ 5 s: "
            f"{verdict(r['all_back_s'], 5, False, 's')} |",
            f"| ListenOverflows / ListenDrops meanwhile | {r['ListenOverflows']} / {r['ListenDrops']} | 0 |", ""]


def section_soak(s: dict) -> list[str]:
    r = s["result"]
    return ["## soak", "",
            f"{s['target_requests']:,} requests through the `proxy` scenario's Sluice setup (1,066-byte POST, "
            "175 connections), one wrk run stopped by request count (its req/s includes the 1–2 s it takes to notice "
            "the end and stop wrk, so it reads slightly low).", "",
            "| requests | errors (socket + non-2xx) | req/s | p50 ms | p99 ms | p99.9 ms | max ms | RSS before | RSS after |",
            "|---|---|---|---|---|---|---|---|---|",
            f"| {r['requests']:,} | {r['errors']:,} | {r['rps']:,.0f} | {r['p50_us'] / 1000:.2f} | "
            f"{r['p99_us'] / 1000:.2f} | {r['p999_us'] / 1000:.2f} | {r['max_us'] / 1000:.2f} | "
            f"{mb(s['rss_before_kb'])} | {mb(s['rss_after_kb'])} |", "",
            f"* Target zero errors: {soak_verdict(r, s['target_requests'])}",
            ""]


def soak_verdict(r: dict, total: int) -> str:
    if r["errors"] == 0 and r["requests"] >= total:
        return "**met**"
    return f"**missed** ({r['errors']:,} errors, {r['requests']:,} of {total:,} requests completed)"


SECTIONS = {"proxy": section_proxy, "secured": section_secured, "openapi": section_openapi,
            "policies": section_policies, "round-robin": section_rr, "memory": section_memory, "push": section_push,
            "fleet": section_fleet, "soak": section_soak}


# --- chart --------------------------------------------------------------------

def chart(results: dict) -> str:
    """Two panels of grouped bars, one group per scenario, one bar per gateway: for a pinned run requests per
    gateway CPU-second (its headline), else req/s; and p99 ms."""
    pinned = results["meta"]["pin"]
    panels = ((("req_per_cpu_s", "requests per gateway CPU-second (higher is better)") if pinned else
               ("rps", "requests/s (higher is better)")), ("p99_ms", "p99 latency, ms (lower is better)"))
    groups = [(name, results["scenarios"][name]["gateways"]) for name in CHART_SCENARIOS
              if name in results["scenarios"] and "error" not in results["scenarios"][name]]
    width, panel_h, top, left = 900, 260, 60, 70
    height = top + 2 * (panel_h + 70)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="16">Sluice vs peers, '
           f'{escape(results["meta"]["date"])} (median of {results["meta"]["rounds"]} runs; '
           f'{"gateway pinned to one core" if pinned else "not pinned"})</text>']
    labels = sorted({l for _, g in groups for l in g}, key=lambda l: list(COLORS).index(l) if l in COLORS else 99)
    for i, label in enumerate(labels):
        x = left + i * 130
        out.append(f'<rect x="{x}" y="36" width="12" height="12" fill="{COLORS.get(label, "#888")}"/>'
                   f'<text x="{x + 16}" y="46">{escape(label)}</text>')
    for p, (metric, title) in enumerate(panels):
        y0 = top + p * (panel_h + 70) + 20
        values = [med(g, metric) or 0 for _, gs in groups for g in gs.values()]
        vmax = max(values or [1]) * 1.1 or 1
        out.append(f'<text x="{left}" y="{y0 - 6}" font-size="13" font-weight="bold">{title}</text>')
        for k in range(5):
            v = vmax * k / 4
            y = y0 + panel_h - panel_h * k / 4
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 20}" y2="{y:.1f}" stroke="#ddd"/>'
                       f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                       f'{v:,.0f}</text>' if metric != "p99_ms" else
                       f'<line x1="{left}" y1="{y:.1f}" x2="{width - 20}" y2="{y:.1f}" stroke="#ddd"/>'
                       f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{v:.1f}</text>')
        gw = (width - 20 - left) / max(1, len(groups))
        for gi, (name, gs) in enumerate(groups):
            bw = min(40, (gw - 30) / max(1, len(gs)))
            x = left + gi * gw + (gw - bw * len(gs)) / 2
            for label, g in gs.items():
                v = med(g, metric) or 0
                h = panel_h * v / vmax
                text = f"{v:,.0f}" if metric != "p99_ms" else f"{v:.2f}"
                out.append(f'<rect x="{x:.1f}" y="{y0 + panel_h - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
                           f'fill="{COLORS.get(label, "#888")}"><title>{escape(name)} {escape(label)}: {text}'
                           f'</title></rect>'
                           f'<text x="{x + bw / 2 - 1:.1f}" y="{y0 + panel_h - h - 3:.1f}" text-anchor="middle" '
                           f'font-size="9">{text}</text>')
                x += bw
            out.append(f'<text x="{left + gi * gw + gw / 2:.1f}" y="{y0 + panel_h + 16}" text-anchor="middle">'
                       f'{escape(name)}</text>')
        out.append(f'<line x1="{left}" y1="{y0 + panel_h}" x2="{width - 20}" y2="{y0 + panel_h}" stroke="#333"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# --- the document ---------------------------------------------------------------

def write(bench: Path, src: Sources) -> None:
    """RESULTS.md and results.svg (the pinned run's chart, or the unpinned one's while there is no pinned run)."""
    drawn = src.pinned or src.unpinned
    if drawn is not None:
        (bench / "results.svg").write_text(chart(drawn))
    (bench / "RESULTS.md").write_text(markdown(src, "results.svg" if drawn is not None else None))


def markdown(src: Sources, chart_name: str | None) -> str:
    lines = ["# Sluice benchmark results", "", *made_from(src), "", "## Machine and method", "", *method(src), ""]
    if chart_name:
        drawn = "requests per gateway CPU-second and p99, pinned run" if src.pinned else "req/s and p99, unpinned run"
        lines += [f"![{drawn}, per scenario and gateway]({chart_name})", ""]
    lines += ["## Targets at a glance", "", *targets_summary(src), ""]
    lines += pinned_part(src) + instructions_part(src) + unpinned_part(src) + notes()
    return "\n".join(lines) + "\n"


# When nginx and HAProxy began to add what Sluice adds to requests and answers (bench/README.md, "The same job").
# Runs from then on record `same_job` in their meta; an older run is told by its date.
SAME_JOB_SINCE = "2026-12-06 20:50 UTC"


def run_line(kind: str, results: dict) -> str:
    m = results["meta"]
    quick = " — a `--quick` smoke run, rough figures" if m.get("quick") else ""
    bare = "" if m.get("same_job", m["date"] >= SAME_JOB_SINCE) else (
        " — nginx and HAProxy then added none of the fields Sluice adds (runs before "
        f"{SAME_JOB_SINCE}), so they did less work than Sluice")
    return (f"`{KINDS[kind][1]}` on {m['date']}, Sluice at git {m['commit']} (release binaries built "
            f"{m.get('binaries_built', '?')}){quick}{bare}")


def made_from(src: Sources) -> list[str]:
    said = {
        "pinned": ("Pinned run, the primary comparison", lambda d: run_line("pinned", d)),
        "unpinned": ("Unpinned run", lambda d: run_line("unpinned", d)),
        "instructions": ("Instructions per request", lambda d: f"`{KINDS['instructions'][1]}` on {d['date']}"),
    }
    lines = ["Generated from the saved figures below — do not edit by hand.", ""]
    for kind, (title, detail) in said.items():
        data, why_not = getattr(src, kind), src.missing(kind)
        if data is not None:
            where = f": `{src.files[kind]}`" if src.files.get(kind) else ""
            lines.append(f"* {title}{where}, {detail(data)}.")
        elif why_not:
            lines.append(f"* {title}: **none** — {why_not}.")
    if any(src.files.values()):
        lines += ["", "A full `bench/run --pin` or `bench/run` (every scenario of its kind, no `--quick`) rewrites "
                  "its own file and then this page from all three; `bench/profile --gateways` rewrites the "
                  "instruction figures and this page; `bench/run --report-from` only re-renders this page from the "
                  "saved files (`bench/run --help`)."]
    return lines


def method(src: Sources) -> list[str]:
    runs = [(kind, r) for kind, r in (("pinned", src.pinned), ("unpinned", src.unpinned)) if r is not None]
    if not runs:
        return ["No run of `bench/run` is saved yet."]
    m = runs[0][1]["meta"]
    lines = [f"* Machine: {m['cores']} cores ({m['cpu_model']}), {m['memory']}; Linux {m['kernel']}. Versions: "
             f"{m['rustc']}; nginx {m['nginx']}; HAProxy {m['haproxy']}; {m['wrk']}."]
    for kind, r in runs:
        m = r["meta"]
        lines.append(
            f"* {kind.capitalize()} run: {sentence(m['placement'])} A {m['warmup']:.0f} s warm-up per gateway, then "
            f"{m['rounds']} rounds of {m['duration']:.0f} s. Load average (1/5/15 min) at start: "
            f"{' / '.join(m['loadavg_start'])}; at end: {' / '.join(m.get('loadavg_end', ['-']))}. Per scenario "
            "at its start: " + "; ".join(f"{n} {' / '.join(s.get('uptime_before', ['-']))}"
                                         for n, s in r["scenarios"].items()) + ".")
    return lines + [
        "* Other work (builds, tests) may have shared the machine: the gateways of a scenario ran in turn "
        "(A B A B ...) so such noise hits each alike; trust ratios more than absolute figures. Figures are the "
        "median over the rounds with min–max in brackets. Latency percentiles are wrk's (`--latency`; p99.9 "
        "from a `done()` Lua hook). Errors are wrk's socket errors plus responses with status ≥ 400. CPU per "
        "request is utime+stime of the gateway's processes (from /proc/PID/stat; Sluice: the data plane, nginx: "
        "master + workers, HAProxy: its process) over the run, divided by the requests wrk completed; requests "
        "per gateway CPU-second is its inverse, taken run by run. RSS is the sum of VmRSS of those processes, "
        "idle (before any load) and peak under load (sampled every 0.5 s).",
        "* Every gateway logs nothing per request (Sluice `--access-log off`, nginx `access_log off`, HAProxy "
        "without `log`), keeps connections to the upstream alive, and runs as many workers/threads as it has "
        "cores (one when pinned). Upstreams are `sluice-test-upstream` (an echo server, hyper). All traffic is "
        "on 127.0.0.1.",
    ]


def targets_summary(src: Sources) -> list[str]:
    """Every target in one table: issue 26's on the pinned run and on the callgrind figures first, then issue
    5's (and 24's) on the unpinned run. A run that is missing gets a row saying so."""
    rows = ["| run | scenario | target | measured | verdict |", "|---|---|---|---|---|"]

    def row(run: str, name: str, what: str, value, goal, higher: bool, unit: str, judged: str = "") -> None:
        shown = "-" if value is None else (f"{value:.2f}x" if unit == "x" else f"{value:,.1f} {unit}")
        judged = judged or verdict(value, goal, higher, unit)
        rows.append(f"| {run} | {name} | {what} | {shown} | {judged.split(' (')[0]} |")

    def failed(run: str, name: str, s: dict) -> bool:
        if "error" in s:
            rows.append(f"| {run} | {name} | every target | - | **not measured**: the scenario failed |")
        return "error" in s

    def absent(kind: str, run: str, what: str) -> None:
        why_not = src.missing(kind)
        if why_not:
            rows.append(f"| {run} | - | {what} | - | **not measured**: {why_not} |")

    absent("pinned", "pinned", "issue 26's per-core targets")
    if src.pinned is not None:
        sc = src.pinned["scenarios"]
        for name, targets in percore.PINNED_TARGETS.items():
            if name in sc and not failed("pinned", name, sc[name]):
                for what, value, goal, higher in targets(sc[name]["gateways"]):
                    row("pinned", name, what, value, goal, higher, "x")
    absent("instructions", "callgrind", "issue 26's instruction targets")
    if src.instructions is not None:
        figures = src.instructions
        for case, what, value, goal in percore.instruction_targets(figures):
            judged = percore.instruction_verdict(figures, case, value, goal)
            row("callgrind", case, what, value, goal, False, "x", judged)
    absent("unpinned", "unpinned", "issue 5's and 24's targets")
    if src.unpinned is not None:
        sc = src.unpinned["scenarios"]
        for name, targets in TARGETS.items():
            if name in sc and not failed("unpinned", name, sc[name]):
                for what, value, goal, higher, unit in targets(sc[name]):
                    row("unpinned", name, what, value, goal, higher, unit)
        if "soak" in sc and not failed("unpinned", "soak", sc["soak"]):
            r, total = sc["soak"]["result"], sc["soak"]["target_requests"]
            rows.append(f"| unpinned | soak | 0 errors in {total:,} | {r['errors']:,} errors in {r['requests']:,} | "
                        f"{soak_verdict(r, total).split(' (')[0]} |")
    return rows


def demote(lines: list[str]) -> list[str]:
    """A scenario's section one heading level down, to sit under its run's heading."""
    return ["#" + line if line.startswith("## ") else line for line in lines]


def scenario_section(name: str, s: dict, source: str) -> list[str]:
    if "error" in s:
        return [f"### {name}", "", f"Failed: `{s['error']}`", ""]
    if name not in SECTIONS:
        return []
    try:
        return demote(SECTIONS[name](s))
    except Exception as e:  # noqa: BLE001 - a report problem must not lose the other sections
        return [f"### {name}", "", f"(could not render: {e!r}; see {source})", ""]


def pinned_part(src: Sources) -> list[str]:
    why_not = src.missing("pinned")
    if src.pinned is None:
        return [percore.HEADING, "", f"No pinned run: {why_not}.", ""] if why_not else []
    lines = percore.intro(src.pinned)
    for name, s in src.pinned["scenarios"].items():
        if name in percore.REFERENCE and "error" not in s:
            lines += percore.scenario(name, s)
        else:  # not a comparison per core (e.g. `--pin --scenario memory`): shown as in the unpinned run
            lines += scenario_section(name, s, src.files.get("pinned") or "the run's JSON")
    return lines


def unpinned_part(src: Sources) -> list[str]:
    heading = "## Unpinned: every process on both cores"
    why_not = src.missing("unpinned")
    if src.unpinned is None:
        return [heading, "", f"No unpinned run: {why_not}.", ""] if why_not else []
    m = src.unpinned["meta"]
    lines = [heading, "",
             f"`bench/run` on {m['date']}. {sentence(m['placement'])} Every process competes for both cores, so "
             "a gateway's req/s here also depends on how the scheduler shares them with wrk and the upstreams; "
             "the memory, push, fleet and soak figures come from this run.", ""]
    for name, s in src.unpinned["scenarios"].items():
        lines += scenario_section(name, s, src.files.get("unpinned") or "the run's JSON")
    return lines


def instructions_part(src: Sources) -> list[str]:
    why_not = src.missing("instructions")
    if src.instructions is None:
        return [INSTRUCTIONS_HEADING, "", f"No figures: {why_not}.", ""] if why_not else []
    return section_instructions(src.instructions)


INSTRUCTIONS_HEADING = "## Instructions per request (callgrind)"


def section_instructions(figures: dict) -> list[str]:
    """bench/profile --gateways: instructions and allocations per request under callgrind."""
    from .gateways import table
    cases = "; ".join(f"`{name}`: {what}" for name, what in figures["cases"].items())
    lines = [
        INSTRUCTIONS_HEADING,
        "",
        f"Measured by `bench/profile --gateways` on {figures['date']}, separately from the runs. Each gateway "
        "alone under `valgrind --tool=callgrind`, on one thread (nginx `master_process off`, one worker; HAProxy "
        "`nbthread 1`; Sluice one worker), upstream keep-alive, no per-request logging; "
        f"{figures['connections']} keep-alive client connections at once, {figures['warmup']:,} requests of "
        f"warm-up, then {figures['requests']:,} counted. User-space instructions (the kernel's share, socket "
        "reads and writes, is much the same for each) and calls of malloc/calloc/realloc/posix_memalign per "
        "request; these do not move with the machine's load. Cases: " + cases + ". In `secured` the counted "
        "requests also pay for any TLS connection to the upstream a gateway opens meanwhile (valgrind also hides "
        "the CPU's SHA extensions from all of them). Every gateway adds what Sluice adds by default: "
        "`X-Forwarded-For`, `-Proto` and `-Host`, `Via` and a request ID unique per process and request to the "
        "request, `Via` and the request ID to the answer (bench/lib/peers.py); `nginx-bare` is nginx adding none "
        "of them, the baseline of the runs before 2026-12-06 20:50 UTC, kept for comparison.",
        "",
        *table(figures),
        "",
    ]
    if "sluice" not in figures["gateways"]:
        lines += ["Sluice is not in this table yet: its figures need a release build of `sluice-dp` "
                  "(`bench/profile --gateways`, which builds one).", ""]
    lines += [f"* Target {case}: {what}: {percore.instruction_verdict(figures, case, value, goal)}"
              for case, what, value, goal in percore.instruction_targets(figures)]
    bare = [(case, percore.instructions_vs_nginx(figures, case, "nginx-bare"), goal)
            for case, goal in percore.INSTRUCTION_TARGETS]
    if any(value is not None for _, value, _ in bare):
        lines += ["", "Against `nginx-bare`, which does less (see above), the same targets would read: " + "; ".join(
            f"{case} {verdict(value, goal, False)}" for case, value, goal in bare if value is not None) + "."]
    return lines + [""] + where_instructions_go(figures)


def where_instructions_go(figures: dict) -> list[str]:
    """Per case, the functions of Sluice and of nginx that executed the most instructions themselves, side by
    side (from the same dumps); nothing for figures saved before they were kept."""
    shown = [g for g in ("sluice", "nginx") if g in figures["gateways"]]
    cases = [c for c in figures["cases"] if any(figures["gateways"][g].get(c, {}).get("top") for g in shown)]
    if not cases:
        return []
    lines = ["### Where the instructions go", "",
             "Per case, the functions that executed the most instructions themselves (what they call not "
             "counted), per request, from the same dumps. An async function's `{{closure}}` is its body, with "
             "what the compiler inlined into it; the TLS cipher (`aesni_*`, `aes_hw_*`, `gcm_*`) and SHA-256 "
             "(`compress256`, `sha256_block_data_order`) are the same work for every gateway. Debian's nginx and its "
             "libraries carry no names for their local functions: those show as addresses.", ""]
    for case in cases:
        tops = {g: figures["gateways"][g].get(case, {}).get("top", []) for g in shown}
        head = ["#", *(part for g in shown for part in (g, "instr/req"))]
        lines += [f"`{case}`:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for rank in range(max(len(top) for top in tops.values())):
            row = [str(rank + 1)]
            for g in shown:
                name, count = tops[g][rank] if rank < len(tops[g]) else ("", None)
                row += [f"`{name}`" if name else "", f"{count:,.0f}" if count is not None else ""]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return lines

def notes() -> list[str]:
    return [
        "## Notes",
        "",
        "* nginx's `auth_basic` runs the htpasswd hash on every request. With an `apr1` (MD5-crypt, 1,000 "
        "rounds) or SHA-crypt entry that hash, not the proxying, would set nginx's throughput; the run gives "
        "nginx a salted SHA-1 (`{SSHA}`) entry, a single cheap hash, which is closer to what Sluice does on "
        "the hot path (a keyed digest of the presented credential, the slow password hash once per credential).",
        "* On a 2-core machine the client (wrk), the upstream(s) and the gateway share the cores (or, with "
        "`--pin`, the gateway has core 0 and client + upstream core 1), so absolute figures are far below "
        "Membrane's published ones on three 16-vCPU machines; only the ratios between gateways measured side "
        "by side carry over.",
        "* Write→served and coalescing: a write made within 20 ms of the control plane's last push counts as "
        "part of a burst and waits until 20 ms pass without another write (at most 250 ms), so a tight loop "
        "of writes becomes a few pushes. The run pauses 20 ms after each write is served, so its writes are "
        "pushed at once; writes closer together than that would each wait up to 20 ms more.",
        "",
    ]
