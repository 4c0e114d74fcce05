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
from typing import Sequence

from .runreport import Outcome, Verdict, oriented_ratio
from .spec import Better

MIN_PAIRS = 6          # fewer independent pairs decide nothing, however they fall
CONFIDENCE = 0.95
RESAMPLES = 9999


def exact(baseline: float, technique: float, better: Better) -> Verdict:
    """The verdict of a deterministic comparison: the comparison itself."""
    r = oriented_ratio(baseline, technique, better)
    if math.isnan(r):
        raise ValueError(f"no ratio of technique {technique!r} to baseline {baseline!r}")
    outcome: Outcome = "wins" if r > 1 else "loses" if r < 1 else "ties"
    return Verdict(outcome=outcome, ratio=r, interval=None, pairs=1, exact=True, why="deterministic")


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
        why = "pairs not independent" if not independent else \
            f"{pairs} pair{'s' if pairs != 1 else ''}: fewer than {MIN_PAIRS}"
        return Verdict(outcome="ties", ratio=median, pairs=pairs, why=why)
    lo, hi = _bootstrap_median(ratios, seed)
    outcome: Outcome = "wins" if lo > 1 else "loses" if hi < 1 else "ties"
    why = "the interval excludes 1" if outcome != "ties" else "the interval contains 1"
    return Verdict(outcome=outcome, ratio=median, interval=(lo, hi), pairs=pairs, why=why)


def _bootstrap_median(ratios: Sequence[float], seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (BCa is undefined when every resample agrees)."""
    import numpy as np
    from scipy.stats import bootstrap

    if min(ratios) == max(ratios):
        return ratios[0], ratios[0]
    res = bootstrap((np.asarray(ratios, dtype=float),), np.median, confidence_level=CONFIDENCE,
                    n_resamples=RESAMPLES, method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def judge(baseline: Sequence[float], technique: Sequence[float], better: Better, *, deterministic: bool,
          independent: bool = True) -> Verdict:
    """The verdict of one comparison from each side's samples (a single value when not repeated).
    Samples paired by repeat or seed (equal lengths, at least 2) give a paired verdict, unless the
    metric is deterministic and every sample of each side agrees: then, like a deterministic single
    value, the verdict is exact. Anything else (one sample of a sampled metric, unpaired lists) is a tie."""
    bs, ts = list(baseline), list(technique)
    if not bs or not ts:
        raise ValueError("a comparison needs a value on each side")
    finite = [oriented_ratio(b, t, better) for b, t in zip(bs, ts)]
    if not all(math.isfinite(r) for r in finite):  # a zero on one side: the ratio says nothing either way
        return Verdict(outcome="ties", ratio=None, pairs=0, why="a pair has no finite ratio")
    if deterministic and len(set(bs)) == 1 and len(set(ts)) == 1:
        return exact(bs[0], ts[0], better)
    if len(bs) == len(ts) and len(bs) >= 2:
        return paired(bs, ts, better, independent=independent)
    ratio = oriented_ratio(statistics.median(bs), statistics.median(ts), better)
    why = "one sample" if len(bs) == len(ts) == 1 else f"samples not paired ({len(ts)} against {len(bs)})"
    return Verdict(outcome="ties", ratio=ratio, pairs=min(len(bs), len(ts)) if len(bs) == len(ts) else 0, why=why)


def of_report(report: dict, *, independent: bool = True) -> Verdict:
    """The verdict shown first (a report as JSON): the headline's technique against the strongest
    deployable baseline. As the report records it; a report made before contract v4 is judged here by
    the same rules from the samples it keeps (``independent``: the system's pairing is not turns)."""
    h = report["headline"]
    vs = h.get("vs_strongest") or h
    if vs.get("verdict"):
        return Verdict.model_validate(vs["verdict"])
    metric, samples = vs["metric"], report.get("samples") or {}
    bs = samples.get(vs["baseline"], {}).get(metric) or [vs["baseline_value"]]
    ts = samples.get(vs["technique"], {}).get(metric) or [vs["technique_value"]]
    return judge(bs, ts, vs["better"], deterministic=metric in report.get("deterministic_metrics", []),
                 independent=independent)
