"""RESULTS.md as a reader sees it, from made-up saved runs: the pinned comparison first, the callgrind table,
the unpinned run, and a plain statement wherever a saved file is missing. No process is started.

python3 -m unittest discover -s bench -p 'test_*.py'"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import percore, report, saved  # noqa: E402
from lib.load import summarize  # noqa: E402


def gateway(requests: int, cpu_s: float, p99_ms: float, rounds: int = 3) -> dict:
    """A gateway's summary as lib/load.py writes it, from `rounds` identical 10 s runs."""
    run = {"requests": requests, "duration_us": 10_000_000, "rps": requests / 10, "p50_us": 1000,
           "p99_us": int(p99_ms * 1000), "p999_us": int(p99_ms * 1500), "errors": 0, "connections": 174,
           "gateway_cpu_s": cpu_s, "wall_s": 10.0, "cpu_us_per_req": cpu_s / requests * 1e6,
           "user_us_per_req": cpu_s / requests * 4e5, "kernel_us_per_req": cpu_s / requests * 6e5,
           "sleeps_per_req": 0.25, "rss_load_kb": 20_000}
    return summarize([dict(run) for _ in range(rounds)], 10_000)


def run(pin: bool, scenarios: dict) -> dict:
    placement = "`--pin`: gateway on core 0." if pin else "not pinned: every process may use all 2 cores."
    return {"meta": {"date": "2026-12-02 12:00 UTC", "cores": 2, "cpu_model": "Test CPU", "memory": "1 GiB RAM",
                     "kernel": "6.0", "loadavg_start": ["1", "1", "1"], "loadavg_end": ["1", "1", "1"],
                     "rustc": "rustc 1.95.0", "nginx": "1.22.1", "haproxy": "2.6", "wrk": "wrk 4.1.0",
                     "commit": "abc1234", "binaries_built": "2026-12-02 11:00 UTC", "pin": pin, "quick": False,
                     "rounds": 3, "duration": 10.0, "warmup": 3.0, "placement": placement,
                     "same_job": True},
            "scenarios": {name: {"uptime_before": ["1", "1", "1"], "connections": 175, "body_bytes": 1066,
                                 "upstreams": 3, **s} for name, s in scenarios.items()}}


def pinned_run() -> dict:
    # proxy: Sluice 30,000 requests per CPU-second, nginx 24,000 (1.25x); p99 5 ms against 4 ms (1.25x).
    # secured: 12,000 against 10,000 (1.20x, short of 1.5x); round-robin 26,000 against 20,000 (1.30x).
    return run(True, {
        "proxy": {"gateways": {"sluice": gateway(300_000, 10.0, 5.0), "nginx": gateway(240_000, 10.0, 4.0),
                               "haproxy": gateway(200_000, 10.0, 4.5)}},
        "secured": {"gateways": {"sluice": gateway(120_000, 10.0, 8.0), "sluice-proxy": gateway(280_000, 10.0, 5.0),
                                 "nginx": gateway(100_000, 10.0, 9.0)}},
        "round-robin": {"gateways": {"sluice": gateway(260_000, 10.0, 3.0), "nginx": gateway(200_000, 10.0, 3.0)}},
    })


def unpinned_run() -> dict:
    return run(False, {"proxy": {"gateways": {"sluice": gateway(400_000, 9.0, 9.0),
                                              "nginx": gateway(380_000, 9.0, 10.0)}}})


def instructions(with_sluice: bool = True) -> dict:
    gateways = {"nginx": {"proxy": {"instructions": 25_000.0, "allocations": 9.0},
                          "get": {"instructions": 20_000.0, "allocations": 6.0},
                          "secured": {"instructions": 80_000.0, "allocations": 21.0}},
                "haproxy": {"proxy": {"instructions": 31_000.0, "allocations": 0.0},
                            "get": {"instructions": 27_000.0, "allocations": 0.0},
                            "secured": {"instructions": 95_000.0, "allocations": 17.0}}}
    if with_sluice:  # no `secured` figure: that target cannot be judged
        gateways["sluice"] = {"proxy": {"instructions": 20_000.0, "allocations": 4.0},
                              "get": {"instructions": 30_000.0, "allocations": 5.0}}
    return {"date": "2026-12-02 10:00 UTC", "connections": 16, "warmup": 300, "requests": 2000,
            "cases": {"proxy": "POST", "get": "GET", "secured": "TLS"}, "gateways": gateways}


class BenchDir:
    """A temporary bench/ with the given files in results/."""

    def __init__(self, **files: dict) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.bench = Path(self.tmp.name) / "bench"
        (self.bench / "results").mkdir(parents=True)
        for name, data in files.items():
            (self.bench / "results" / f"{name}.json").write_text(json.dumps(data))

    def markdown(self, given: list[Path] | None = None) -> str:
        return report.markdown(saved.load(self.bench, given), "results.svg")

    def __enter__(self) -> "BenchDir":
        return self

    def __exit__(self, *exc) -> None:
        self.tmp.cleanup()


class ReportTest(unittest.TestCase):
    def test_pinned_comparison_comes_first_with_its_headline_and_targets(self):
        with BenchDir(pinned=pinned_run(), unpinned=unpinned_run(), instructions=instructions()) as d:
            md = d.markdown()
        order = [md.index(h) for h in ("## Targets at a glance", "## Per core: gateway pinned to one core",
                                       "## Instructions per request (callgrind)",
                                       "## Unpinned: every process on both cores", "## Notes")]
        self.assertEqual(order, sorted(order))
        self.assertIn("* Pinned run, the primary comparison: `bench/results/pinned.json`, `bench/run --pin` on "
                      "2026-12-02 12:00 UTC, Sluice at git abc1234", md)
        # The headline line per scenario, and Sluice's ratio in bold in its table.
        self.assertIn("| proxy | 30,000 | 24,000 | 20,000 | **1.25x** | 1.25x |", md)
        self.assertIn("| sluice | 30,000 | **1.25x** | 30,000 | 5.00 | 1.25x | 1.00 | 0.25 | 33.3 (13.3 + 20.0) |", md)
        for line in ("| pinned | proxy | requests per gateway CPU-second ≥ 1.2x nginx | 1.25x | **met** |",
                     "| pinned | proxy | p99 ≤ nginx's | 1.25x | **missed** |",
                     "| pinned | secured | requests per gateway CPU-second ≥ 1.5x nginx | 1.20x | **missed** |",
                     "| pinned | round-robin | requests per gateway CPU-second ≥ 1.2x nginx | 1.30x | **met** |",
                     "| pinned | round-robin | p99 ≤ nginx's | 1.00x | **met** |",
                     "| callgrind | proxy | instructions per request ≤ 0.8x nginx | 0.80x | **met** |",
                     "| callgrind | get | instructions per request ≤ 0.8x nginx | 1.50x | **missed** |",
                     "| callgrind | secured | instructions per request ≤ 1.0x nginx | - | not measured: no sluice "
                     "figures for `secured` |",
                     "* Target secured: instructions per request ≤ 1.0x nginx: not measured: no sluice figures for "
                     "`secured`",
                     "| unpinned | proxy | req/s ≥ 1.2x nginx | 1.05x | **missed** |"):
            self.assertIn(line, md)
        self.assertIn("* Target requests per gateway CPU-second ≥ 1.5x nginx: **missed** (1.20x against 1.50x: "
                      "20% short)", md)
        # The unpinned sections sit one level down, under their run.
        self.assertIn("\n### proxy — Membrane test 1\n", md)
        self.assertNotIn("\n## proxy", md)
        self.assertIn("| case | nginx instr/req | haproxy instr/req | sluice instr/req |", md)

    def test_the_bare_nginx_baseline_is_shown_beside_the_same_job(self):
        figures = instructions()
        figures["gateways"]["nginx-bare"] = {"proxy": {"instructions": 22_000.0, "allocations": 9.0},
                                             "get": {"instructions": 18_000.0, "allocations": 6.0}}
        with BenchDir(pinned=pinned_run(), unpinned=unpinned_run(), instructions=figures) as d:
            md = d.markdown()
        # The targets are judged against nginx doing the same job; the bare figures are said beside them.
        self.assertIn("| callgrind | proxy | instructions per request ≤ 0.8x nginx | 0.80x | **met** |", md)
        self.assertIn("| sluice instr vs nginx | sluice instr vs nginx-bare |", md)
        self.assertIn("| proxy | 25,000 | 31,000 | 20,000 | 22,000 | 9.0 | 0.0 | 4.0 | 9.0 | 0.80x | 0.91x |", md)
        self.assertIn("Against `nginx-bare`, which does less (see above), the same targets would read: proxy "
                      "**missed** (0.91x against at most 0.80x: 14% over); get **missed** (1.67x against at most "
                      "0.80x: 108% over).", md)

    def test_a_missing_file_is_said_not_faked(self):
        with BenchDir(unpinned=unpinned_run(), instructions=instructions(with_sluice=False)) as d:
            md = d.markdown()
            report.write(d.bench, saved.load(d.bench))
            svg = (d.bench / "results.svg").read_text()
        self.assertIn("* Pinned run, the primary comparison: **none** — `bench/results/pinned.json` is missing: "
                      "`bench/run --pin` makes it.", md)
        self.assertIn("No pinned run: `bench/results/pinned.json` is missing: `bench/run --pin` makes it.", md)
        self.assertIn("| pinned | - | issue 26's per-core targets | - | **not measured**: "
                      "`bench/results/pinned.json` is missing: `bench/run --pin` makes it |", md)
        self.assertNotIn("| pinned | proxy", md)
        self.assertIn("Sluice is not in this table yet", md)
        # Without a pinned run the chart is the unpinned one, and says so.
        self.assertIn("![req/s and p99, unpinned run, per scenario and gateway](results.svg)", md)
        self.assertIn("requests/s (higher is better)", svg)

        with BenchDir() as d:
            report.write(d.bench, saved.load(d.bench))
            md = (d.bench / "RESULTS.md").read_text()
            self.assertFalse((d.bench / "results.svg").exists())
        for kind, command in (("unpinned", "bench/run"), ("instructions", "bench/profile --gateways")):
            self.assertIn(f"`bench/results/{kind}.json` is missing: `{command}` makes it", md)
        self.assertNotIn("](results.svg)", md)

    def test_pinned_chart_draws_requests_per_cpu_second(self):
        svg = report.chart(pinned_run())
        self.assertIn("requests per gateway CPU-second (higher is better)", svg)
        self.assertIn("proxy sluice: 30,000", svg)

    def test_report_from_names_files_that_replace_the_saved_ones(self):
        with BenchDir(pinned=pinned_run(), unpinned=unpinned_run(), instructions=instructions()) as d:
            other = Path(d.tmp.name) / "older-pinned.json"
            older = pinned_run()
            older["meta"]["commit"] = "0ld0ld0"
            other.write_text(json.dumps(older))
            md = d.markdown([other])
            # Shown relative to the repository (here the temp dir holding bench/).
            self.assertIn("* Pinned run, the primary comparison: `older-pinned.json`, `bench/run --pin` on 2026-12-02 "
                          "12:00 UTC, Sluice at git 0ld0ld0", md)
            self.assertIn("* Unpinned run: `bench/results/unpinned.json`", md)
            with self.assertRaisesRegex(ValueError, "two pinned files given"):
                saved.load(d.bench, [other, d.bench / "results" / "pinned.json"])

    def test_a_run_from_before_the_same_job_says_its_peers_did_less(self):
        older = pinned_run()
        del older["meta"]["same_job"]
        older["meta"]["date"] = "2026-12-06 16:37 UTC"
        newer = unpinned_run()
        del newer["meta"]["same_job"]
        newer["meta"]["date"] = "2026-12-07 00:09 UTC"
        with BenchDir(pinned=older, unpinned=newer, instructions=instructions()) as d:
            md = d.markdown()
        self.assertIn("Sluice at git abc1234 (release binaries built 2026-12-02 11:00 UTC) — nginx and HAProxy then "
                      "added none of the fields Sluice adds (runs before 2026-12-06 20:50 UTC), so they did less work "
                      "than Sluice.\n* Unpinned run", md)
        self.assertIn("* Unpinned run: `bench/results/unpinned.json`, `bench/run` on 2026-12-07 00:09 UTC, Sluice at "
                      "git abc1234 (release binaries built 2026-12-02 11:00 UTC).\n", md)

    def test_runs_saved_before_the_per_core_figures_get_them_from_their_runs(self):
        old = pinned_run()
        for s in old["scenarios"].values():
            for g in s["gateways"].values():
                del g["req_per_cpu_s"], g["core_busy"]
                for r in g["runs"]:
                    del r["wall_s"]
        with BenchDir(pinned=old) as d:
            md = d.markdown()
        self.assertIn("| pinned | proxy | requests per gateway CPU-second ≥ 1.2x nginx | 1.25x | **met** |", md)
        self.assertIn("| sluice | 30,000 | **1.25x** | 30,000 | 5.00 | 1.25x | - |", md)

    def test_a_failed_pinned_scenario_is_reported_as_failed(self):
        failed = pinned_run()
        failed["scenarios"]["secured"] = {"error": "RuntimeError: nginx did not start", "seconds": 1.0}
        with BenchDir(pinned=failed) as d:
            md = d.markdown()
        self.assertIn("| pinned | secured | every target | - | **not measured**: the scenario failed |", md)
        self.assertIn("### secured\n\nFailed: `RuntimeError: nginx did not start`", md)
        self.assertNotIn("| secured |", md.split("## Targets at a glance")[1].split("### proxy (pinned)")[0]
                         .split("| scenario | Sluice req per gateway CPU-s")[1])

    def test_a_pinned_run_whose_rounds_disagree_is_named_noisy(self):
        self.assertEqual(percore.noisy(pinned_run()), [], "identical rounds agree")

        def with_cpu_of_last_round(factor: float) -> dict:
            result = pinned_run()
            runs = [dict(r) for r in result["scenarios"]["proxy"]["gateways"]["nginx"]["runs"]]
            runs[-1]["gateway_cpu_s"] *= factor
            result["scenarios"]["proxy"]["gateways"]["nginx"] = summarize(runs, 10_000)
            return result

        # A round that took 1.25x the CPU for the same requests is within what a quiet machine does.
        self.assertEqual(percore.noisy(with_cpu_of_last_round(1.25)), [])
        self.assertEqual(percore.noisy(with_cpu_of_last_round(1.6)), ["proxy/nginx 1.60x"])
        failed = pinned_run()
        failed["scenarios"]["secured"] = {"error": "RuntimeError: nginx did not start", "seconds": 1.0}
        self.assertEqual(percore.noisy(failed), [], "a failed scenario has no rounds to compare")

    def test_where_the_instructions_go_names_each_gateways_own_top_functions_per_case(self):
        figures = instructions()
        figures["gateways"]["sluice"]["proxy"]["top"] = [["memcpy", 1500.0], ["serve::{{closure}}", 900.4]]
        figures["gateways"]["nginx"]["proxy"]["top"] = [["ngx_http_parse_header_line", 2100.0]]
        with BenchDir(instructions=figures) as d:
            md = d.markdown()
        self.assertIn("### Where the instructions go", md)
        self.assertIn("`proxy`:\n\n| # | sluice | instr/req | nginx | instr/req |", md)
        self.assertIn("| 1 | `memcpy` | 1,500 | `ngx_http_parse_header_line` | 2,100 |", md)
        self.assertIn("| 2 | `serve::{{closure}}` | 900 |  |  |", md)
        self.assertNotIn("`get`:\n\n| #", md, "no functions were kept for get")
        # Figures saved before the functions were kept: no such section.
        with BenchDir(instructions=instructions()) as d:
            self.assertNotIn("### Where the instructions go", d.markdown())

    def test_one_run_report_shows_that_run_alone(self):
        quick = copy.deepcopy(pinned_run())
        quick["meta"]["quick"] = True
        md = report.markdown(saved.one_run(quick), "x.svg")
        self.assertIn("`bench/run --pin` on 2026-12-02 12:00 UTC, Sluice at git abc1234 (release binaries built "
                      "2026-12-02 11:00 UTC) — a `--quick` smoke run, rough figures.", md)
        self.assertNotIn("missing", md)
        self.assertNotIn("## Unpinned", md)
        self.assertNotIn("## Instructions per request", md)


if __name__ == "__main__":
    unittest.main()
