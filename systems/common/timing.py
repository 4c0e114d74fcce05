"""Wall-clock measurement helpers shared by all systems (pure)."""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Callable, Iterator


class Stopwatch:
    """Accumulates elapsed seconds over several ``with sw:`` blocks."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> "Stopwatch":
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds += time.perf_counter() - self._t0


@contextmanager
def timed() -> Iterator[Stopwatch]:
    sw = Stopwatch()
    with sw:
        yield sw


def interleaved(variants: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run each variant's measurement ``repeats`` times, alternating between variants so that
    machine noise (other processes, thermal state) hits every variant alike. Each callable
    returns its own measurement (seconds, or a rate)."""
    out: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            out[name].append(float(fn()))
    return out


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))
