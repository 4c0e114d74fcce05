"""Numbers for people: a metric's value with its unit at a readable magnitude.

Pure (no prefect, no dask), so the report, its artifacts, the CLI and the catalogue format alike.
Rules: never scientific notation; thousands separators; 4 significant digits; the unit read from
the metric's name (``samples_per_s`` -> samples/s, ``*_bytes`` -> B/KB/MB/GB, ``*_ms`` -> ms/s,
``*_share`` -> %, ``*_vs_*`` -> x); a name with no known unit is formatted by magnitude alone. A value
smaller than ``NOISE`` of its column's largest magnitude (of 1 when all are smaller) is float
noise and shows as 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Iterable

NOISE = 1e-9
SIG = 4
ONE_SAMPLE = "one sample"  # the range cell of a ratio with no repeats (a smoke run)


@dataclass(frozen=True)
class Unit:
    """How a metric's values print: ``family`` scales them (time in s, bytes, bytes/s), else
    ``label`` is appended as is; ``factor`` converts a value to the family's base unit."""

    family: str = "plain"  # plain | time | bytes | bandwidth | percent | ratio | fixed
    label: str = ""
    factor: float = 1.0


PLAIN = Unit()
_SCALED = {  # family -> (threshold, divisor, label), largest first
    "time": [(1.0, 1.0, "s"), (1e-3, 1e-3, "ms"), (0.0, 1e-6, "\u00b5s")],
    "bytes": [(1e9, 1e9, "GB"), (1e6, 1e6, "MB"), (1e3, 1e3, "KB"), (0.0, 1.0, "B")],
    "bandwidth": [(1e9, 1e9, "GB/s"), (1e6, 1e6, "MB/s"), (1e3, 1e3, "KB/s"), (0.0, 1.0, "B/s")],
}
_PERCENT_WORDS = {"share", "fraction", "frac", "utilization", "rate", "attainment", "accuracy", "precision",
                  "recall", "success"}
_RATIO_WORDS = {"vs", "speedup", "dedup", "imbalance", "over"}


def unit_of(metric: str) -> Unit:
    """The unit a metric's name carries (see the module's rules); PLAIN when it names none."""
    words = metric.lower().split("_")
    if metric.lower().endswith(("_mb_s", "_gb_s")):
        return Unit("bandwidth", factor=1e6 if words[-2] == "mb" else 1e9)
    if words[-1] == "tflops":
        return Unit("fixed", "TFLOP/s")
    if words[-2:] == ["gflop", "s"]:
        return Unit("fixed", "GFLOP/s")
    if words[-2:-1] == ["per"] and words[-1] == "s":
        return Unit("fixed", f"{words[-3]}/s" if len(words) > 2 else "/s")
    for word, factor in (("us", 1e-6), ("ms", 1e-3), ("s", 1.0), ("seconds", 1.0)):
        if word in words:
            return Unit("time", factor=factor)
    for word, factor in (("bytes", 1.0), ("mb", 1e6), ("gb", 1e9)):
        if word in words:
            return Unit("bytes", factor=factor)
    for word, label in (("gib", "GiB"), ("mib", "MiB"), ("pts", "pts"), ("points", "pts"), ("mm2", "mm\u00b2"),
                        ("m", "m")):
        if word in words:
            return Unit("fixed", label)
    if _RATIO_WORDS & set(words):
        return Unit("ratio")
    if _PERCENT_WORDS & set(words) and "per" not in words:
        return Unit("percent")
    return PLAIN


def number(x: float, sig: int = SIG) -> str:
    """``x`` with ``sig`` significant digits (all the integer digits when more), thousands
    separators, trailing zeros dropped, never in scientific notation."""
    if x is None:
        return ""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "\u221e" if x > 0 else "-\u221e"
    if x == 0:
        return "0"
    decimals = max(0, sig - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def exact(x) -> str:
    """A parameter's value as given (every digit), but never in scientific notation: 1e-05 -> 0.00001."""
    if isinstance(x, float) and math.isfinite(x):
        text = format(Decimal(repr(x)), "f")
        return text[:-2] if text.endswith(".0") else text
    return str(x)


#: how a ratio that is undefined (NaN: both sides 0) prints in tables
UNDEFINED = "-"


def ratio(x: float | None) -> str:
    """An oriented ratio: 1.02x (n/a when there is none; "-" when it is undefined: NaN, 0 vs 0)."""
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isnan(x):
        return UNDEFINED
    return f"{x:.2f}x" if math.isfinite(x) and abs(x) >= 0.01 else f"{number(x)}x"


def ratio_range(rng, kind: str | None = None) -> str:
    """The min-max of a ratio over its repeats: 0.98-1.03x. Without one: "exact" for a counted
    metric (counts do not vary), else ``ONE_SAMPLE`` (a smoke run takes one sample per variant)."""
    if rng:
        if any(isinstance(v, float) and math.isnan(v) for v in rng):
            return UNDEFINED
        return f"{rng[0]:.2f}-{rng[1]:.2f}x"
    return "exact" if kind == "counted" else ONE_SAMPLE


def scale_of(values: Iterable[float | None]) -> float:
    """A column's largest finite magnitude (its noise floor is NOISE of this, or of 1 when smaller)."""
    finite = [abs(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return max(finite, default=0.0)


def metric(name: str, x: float | None, scale: float | None = None) -> str:
    """A value of metric ``name`` with its unit: 34,890 samples/s, 1.66 s, 201.4 MB, 8.54%, 1.05x.
    ``scale``: its column's largest magnitude (default: the value's own), for the noise floor."""
    if x is None:
        return ""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    unit = unit_of(name)
    floor = NOISE * max(abs(x) if scale is None else scale, 1.0)
    if math.isfinite(x) and abs(x) < floor:
        x = 0.0
    if unit.family in _SCALED:
        table = _SCALED[unit.family]
        base = x * unit.factor
        if base == 0 or not math.isfinite(base):  # in the family's base unit: "0 s", "0 B"
            return f"{number(base)} " + next(label for _, divisor, label in table if divisor == 1.0)
        _, divisor, label = next(t for t in table if abs(base) >= t[0])
        return f"{number(base / divisor)} {label}"
    if unit.family == "percent":
        return f"{number(x * 100)}%"
    if unit.family == "ratio":
        return f"{number(x)}x"
    if unit.family == "fixed":
        return f"{number(x)} {unit.label}"
    return number(x)


def column(name: str, values: list[float | None]) -> list[str]:
    """Every value of one metric's column (or row), with the column's noise floor."""
    scale = scale_of(values)
    return [metric(name, v, scale) for v in values]
