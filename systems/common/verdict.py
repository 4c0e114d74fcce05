"""A verdict a reviewer cannot knock down (contract v4, issue 43 item 1): wins, loses or ties, with
the interval it rests on (pure).

A sampled comparison pairs the technique and its baseline by repeat or seed, takes the median of the
paired ratios and a seeded 95% bootstrap interval of that median (``scipy.stats.bootstrap``). It is a
win or a loss only when the interval excludes 1 and there are at least ``MIN_PAIRS`` independent
pairs; anything else is a tie, whatever the median says. A deterministic result (counted, or
modelled/simulated from one deterministic computation) has no sampling error: its verdict is the
comparison itself, marked exact.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal, Sequence

from .runreport import oriented_ratio
from .spec import Better

MIN_PAIRS = 6          # fewer independent pairs decide nothing, however they fall
CONFIDENCE = 0.95
RESAMPLES = 9999

Outcome = Literal["wins", "loses", "ties"]


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    ratio: float                             # median of the paired ratios (> 1: the technique is better)
    interval: tuple[float, float] | None     # bootstrap interval of that median; None when exact or undecided
    pairs: int                               # independent pairs it rests on
    exact: bool                              # a deterministic result: no interval needed
    why: str

    def label(self) -> str:
        """``wins 1.12x (1.05-1.20, 8 pairs)``, ``ties 1.04x (3 pairs: fewer than 6)``, ``wins 1.30x (exact)``."""
        if self.exact:
            return f"{self.outcome} {self.ratio:.2f}x (exact)"
        if self.interval is None:
            return f"{self.outcome} {self.ratio:.2f}x ({self.why})"
        lo, hi = self.interval
        return f"{self.outcome} {self.ratio:.2f}x ({lo:.2f}-{hi:.2f}, {self.pairs} pairs)"


def exact(baseline: float, technique: float, better: Better) -> Verdict:
    """The verdict of a deterministic comparison: the comparison itself."""
    r = oriented_ratio(baseline, technique, better)
    if math.isnan(r):
        raise ValueError(f"no ratio of technique {technique!r} to baseline {baseline!r}")
    outcome: Outcome = "wins" if r > 1 else "loses" if r < 1 else "ties"
    return Verdict(outcome, r, None, 1, True, "deterministic")


def paired(baseline: Sequence[float], technique: Sequence[float], better: Better, *, independent: bool = True,
           seed: int = 0) -> Verdict:
    """The verdict of sampled results paired by repeat or seed (``baseline[i]`` ran beside
    ``technique[i]``). ``independent=False`` (e.g. consecutive turns of one training run) counts the
    samples as one pair: a tie."""
    if len(baseline) != len(technique) or not baseline:
        raise ValueError(f"paired samples need the same, non-zero length (got {len(baseline)} and {len(technique)})")
    ratios = [oriented_ratio(b, t, better) for b, t in zip(baseline, technique)]
    if any(math.isnan(r) or math.isinf(r) for r in ratios):
        raise ValueError(f"a pair has no finite ratio: {ratios}")
    median = statistics.median(ratios)
    pairs = len(ratios) if independent else 1
    if pairs < MIN_PAIRS:
        why = "pairs not independent" if not independent else f"{pairs} pairs: fewer than {MIN_PAIRS}"
        return Verdict("ties", median, None, pairs, False, why)
    lo, hi = _bootstrap_median(ratios, seed)
    outcome: Outcome = "wins" if lo > 1 else "loses" if hi < 1 else "ties"
    why = "the interval excludes 1" if outcome != "ties" else "the interval contains 1"
    return Verdict(outcome, median, (lo, hi), pairs, False, why)


def _bootstrap_median(ratios: Sequence[float], seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (BCa is undefined when every resample agrees)."""
    import numpy as np
    from scipy.stats import bootstrap

    if min(ratios) == max(ratios):
        return ratios[0], ratios[0]
    res = bootstrap((np.asarray(ratios, dtype=float),), np.median, confidence_level=CONFIDENCE,
                    n_resamples=RESAMPLES, method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
