"""How RESULTS.md writes figures, ratios and verdicts: shared by every part of the report."""

from __future__ import annotations


def num(v, digits=0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def spread(s: dict | None, digits=0, scale=1.0) -> str:
    """A summary's median, with min–max in brackets when the rounds differed."""
    if not s or s.get("median") is None:
        return "-"
    m, lo, hi = (s[k] * scale for k in ("median", "min", "max"))
    if lo == hi:
        return num(m, digits)
    return f"{num(m, digits)} ({num(lo, digits)}–{num(hi, digits)})"


def mb(kb) -> str:
    return "-" if kb is None else f"{kb / 1024:.1f} MB"


def ratio(a, b) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def rx(v, bold: bool = False) -> str:
    if v is None:
        return "-"
    return f"**{v:.2f}x**" if bold else f"{v:.2f}x"


def med(g: dict | None, key: str):
    return ((g or {}).get(key) or {}).get("median")


def verdict(value, target, higher_is_better=True, unit="x") -> str:
    """'met' or 'missed by N%' against a target."""
    if value is None:
        return "not measured"
    fmt = (lambda v: f"{v:.2f}x") if unit == "x" else (lambda v: f"{v:,.1f} {unit}")
    ok = value >= target if higher_is_better else value <= target
    if ok:
        return f"**met** ({fmt(value)} against {fmt(target)})"
    gap = (target - value) / target * 100 if higher_is_better else (value - target) / target * 100
    return f"**missed** ({fmt(value)} against {fmt(target)}: {gap:.0f}% short)" if higher_is_better else \
        f"**missed** ({fmt(value)} against at most {fmt(target)}: {gap:.0f}% over)"


def sentence(text: str) -> str:
    """`text` with a capital first letter, to start a sentence with a saved phrase."""
    return text[:1].upper() + text[1:]
