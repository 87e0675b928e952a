"""Which saved figures one RESULTS.md is made from: the pinned run, the unpinned run and the callgrind figures,
each read from its file under bench/results/ (or one named instead), and a plain reason for any that is
missing."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import percore

# Each kind of saved figures: its file under bench/ and the command that writes it.
KINDS = {
    "pinned": ("results/pinned.json", "bench/run --pin"),
    "unpinned": ("results/unpinned.json", "bench/run"),
    "instructions": ("results/instructions.json", "bench/profile --gateways"),
}


@dataclass
class Sources:
    """What one report is made from, each None when absent, and `files`: the file each kind was read from, or
    None where the report is not meant to have it (a partial run's report shows that run alone)."""
    pinned: dict | None = None
    unpinned: dict | None = None
    instructions: dict | None = None
    files: dict[str, str | None] = field(default_factory=dict)

    def missing(self, kind: str) -> str | None:
        """Why `kind` is not in the report, in a sentence; None when it is, or is not meant to be."""
        if getattr(self, kind) is not None or self.files.get(kind) is None:
            return None
        return f"`{self.files[kind]}` is missing: `{KINDS[kind][1]}` makes it"


def kind_of(data: dict) -> str:
    if "meta" in data and "scenarios" in data:
        return "pinned" if data["meta"].get("pin") else "unpinned"
    if "gateways" in data and "cases" in data:
        return "instructions"
    raise ValueError("neither a bench/run result nor bench/profile --gateways figures")


def load(bench: Path, given: list[Path] | None = None) -> Sources:
    """The saved figures under bench/results/, with each of the `given` files in place of the saved one of its
    kind (told apart by content)."""
    chosen = {kind: bench / rel for kind, (rel, _) in KINDS.items()}
    replaced: set[str] = set()
    for path in given or []:
        kind = kind_of(json.loads(path.read_text()))
        if kind in replaced:
            raise ValueError(f"two {kind} files given: {chosen[kind]} and {path}")
        replaced.add(kind)
        chosen[kind] = path
    src = Sources()
    repo = bench.resolve().parent
    for kind, path in chosen.items():
        full = path.resolve()
        src.files[kind] = str(full.relative_to(repo)) if full.is_relative_to(repo) else str(path)
        if path.exists():
            data = json.loads(path.read_text())
            setattr(src, kind, data if kind == "instructions" else percore.add_per_core(data))
    return src


def one_run(results: dict) -> Sources:
    """The report of a single (quick or partial) run, which does not pretend to be RESULTS.md."""
    kind = kind_of(results)
    return Sources(**{kind: percore.add_per_core(results)}, files={kind: None})
