"""Reading callgrind dumps: the per-function figures RESULTS.md shows must add up to the dump's total and
leave each callee's cost to the callee. No process is started.

python3 -m unittest discover -s bench -p 'test_*.py'"""

from __future__ import annotations

import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib.callgrind import dump_costs, self_costs  # noqa: E402
from lib.gateways import core_cache  # noqa: E402

# `main` executes 10 + 5 itself and calls `parse` twice (140 in all: `parse` executes 80 itself, and its
# calls of `memcpy` 60); names are written once, then by number; a second object's `memcpy` adds up.
DUMP = """# callgrind format
version: 1
positions: line
events: Ir
summary: 155

ob=(1) /bin/gateway
fl=(1) main.rs
fn=(1) main
10 10
+2 5
cfn=(2) parse
calls=2 40
+1 140
fn=(2)
40 80
cfn=(3) memcpy
calls=2 0
* 60
ob=(2) /lib/libc.so
fl=(2) memcpy.S
fn=(3)
0 40
fn=(4) memcpy
0 20
"""


class SelfCostsTest(unittest.TestCase):
    def test_each_function_gets_what_it_executed_itself_and_the_total_adds_up(self):
        with tempfile.TemporaryDirectory() as tmp:
            dump = Path(tmp) / "callgrind.out"
            dump.write_text(DUMP)
            costs = self_costs(dump)
            events, _ = dump_costs(dump)
        self.assertEqual(costs, {"main": 15, "parse": 80, "memcpy": 60})
        self.assertEqual(sum(costs.values()), events["Ir"], "every instruction is some function's own")


class CoreCacheTest(unittest.TestCase):
    def write_cache(self, root: Path, levels: list[tuple[str, str, str, str]]) -> Path:
        for i, (level, kind, size, ways) in enumerate(levels):
            index = root / f"index{i}"
            index.mkdir()
            for name, value in [("level", level), ("type", kind), ("size", size),
                                ("ways_of_associativity", ways), ("coherency_line_size", "64")]:
                (index / name).write_text(value + "\n")
        return root

    def test_the_last_level_callgrind_simulates_is_the_cores_own_l2(self):
        with tempfile.TemporaryDirectory() as tmp:
            cache = self.write_cache(Path(tmp), [("1", "Data", "48K", "12"), ("1", "Instruction", "64K", "16"),
                                                 ("2", "Unified", "2048K", "16"), ("3", "Unified", "491520K", "16")])
            self.assertEqual(core_cache(cache), ["--LL=2097152,16,64"])

    def test_without_a_readable_l2_callgrind_keeps_its_own_choice(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(core_cache(Path(tmp) / "absent"), [])
            cache = self.write_cache(Path(tmp), [("1", "Data", "48K", "12"), ("2", "Unified", "lots", "16")])
            self.assertEqual(core_cache(cache), [])


if __name__ == "__main__":
    unittest.main()
