"""callgrind from the benchmark's side: controlling a process that runs under `valgrind --tool=callgrind`
(zero, dump) and reading what a dump holds (instructions, and heap allocation calls). Shared by bench/profile's
per-policy figures and its side-by-side comparison of gateways."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ALLOC_FUNCTIONS = {"malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign",  # glibc
                   "mi_malloc_aligned", "mi_zalloc_aligned", "mi_realloc_aligned"}  # mimalloc


def callgrind_control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=120)


FUNCTION_REF = re.compile(r"^(c?fn)=\((\d+)\)(?: (.*))?$")


def read_dump(path: Path):
    """One callgrind dump as (kind, text) per line: kind "fn" (the function whose costs follow) or "cfn" (a
    callee) with the function's name (a dump writes a name once, then only its number), else None with the
    line as written."""
    names: dict[str, str] = {}
    with path.open(errors="replace") as f:
        for line in f:
            m = FUNCTION_REF.match(line.rstrip("\n")) if line.startswith(("fn=", "cfn=")) else None
            if m is None:
                yield None, line
                continue
            kind, ident, name = m.groups()
            if name is not None:
                names[ident] = name
            yield kind, names.get(ident)


def self_costs(path: Path) -> dict[str, int]:
    """Instructions (`Ir`, the first event) of one callgrind dump by the function that executed them, not
    counting what its callees executed: each `fn=` block's cost lines, less the line after each `calls=`,
    which holds the call's inclusive cost. Functions of the same name in different objects are added up."""
    costs: dict[str, int] = {}
    function = None
    positions = 1
    call_cost_next = False
    for kind, text in read_dump(path):
        if kind == "fn":
            function = text
            continue
        if kind is not None:  # cfn=: the callee of the `calls=` line that follows
            continue
        if text.startswith("positions:"):
            positions = len(text.split()) - 1
        elif text.startswith("calls="):
            call_cost_next = True
        elif text[:1].isdigit() or text[:1] in "+-*":
            if call_cost_next:
                call_cost_next = False
            elif function is not None:
                fields = text.split()
                if len(fields) > positions:
                    costs[function] = costs.get(function, 0) + int(fields[positions])
    return costs


def dump_costs(path: Path) -> tuple[dict[str, int], int]:
    """(events, allocation calls) of one callgrind dump: every event it totals, by its name (`Ir`, the
    instructions; with `--cache-sim=yes` and `--branch-sim=yes` also the simulated cache misses and
    mispredicted branches: `I1mr`, `D1mr`, `D1mw`, `Bcm`, ...), and the calls of the allocation functions."""
    names: list[str] = []
    events: dict[str, int] = {}
    allocations = 0
    callee = None
    for kind, text in read_dump(path):
        if kind == "cfn":
            callee = text
        elif kind is None and text.startswith("calls="):
            if callee in ALLOC_FUNCTIONS:
                allocations += int(text.split()[0].split("=")[1])
        elif kind is None and text.startswith("events:"):
            names = text.split()[1:]
        elif kind is None and text.startswith(("summary:", "totals:")):
            events = dict(zip(names, map(int, text.split()[1:])))
    return events, allocations
