"""Synthetic embedding-access workload shared by the recommendation-embedding systems (RecShard,
FlexShard, FAE, Hotline, Slipstream): Criteo-like sparse features, each an embedding table whose
row popularity is Zipf, calibrated so that a small share of the rows takes most of the accesses
(the papers measure about 7% of rows taking about 76% of accesses). Hashing leaves part of each
table untouched (its coverage), and each sample looks up a variable number of rows per table (its
pooling factor). Pure numpy: no prefect/dask imports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Probabilities of ranks 1..n proportional to 1/rank**s (sorted, hottest first)."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -s
    return w / w.sum()


def top_share(probs: np.ndarray, fraction: float) -> float:
    """Share of the accesses taken by the hottest ``fraction`` of the rows."""
    k = max(1, math.ceil(fraction * len(probs)))
    return float(np.sort(probs)[::-1][:k].sum())


def calibrated_exponent(n: int, hot_fraction: float = 0.07, hot_share: float = 0.76) -> float:
    """The Zipf exponent at which the hottest ``hot_fraction`` of ``n`` rows take ``hot_share`` of
    the accesses (bisection: the share grows monotonically with the exponent)."""
    if not 0 < hot_fraction < 1 or not 0 < hot_share < 1:
        raise ValueError("hot_fraction and hot_share must lie in (0, 1)")
    ranks = np.arange(1, n + 1, dtype=np.float64)
    k = max(1, math.ceil(hot_fraction * n))

    def share(exponent: float) -> float:  # weights are sorted already: the hottest k come first
        w = ranks ** -exponent
        return float(w[:k].sum() / w.sum())

    lo, hi = 0.0, 8.0
    if share(hi) < hot_share:
        return hi  # too few rows for the skew asked: the steepest exponent tried
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if share(mid) < hot_share else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Table:
    """One sparse feature: ``rows`` embedding rows of width ``dim``; ``probs`` gives each row's
    access probability (zero for rows that hashing never reaches); ``pooling`` is the mean
    number of ids a sample looks up."""

    name: str
    rows: int
    dim: int
    pooling: float
    probs: np.ndarray

    @property
    def coverage(self) -> float:
        return float(np.count_nonzero(self.probs)) / self.rows


def make_table(name: str, rows: int, dim: int, pooling: float, coverage: float, rng: np.random.Generator,
               hot_fraction: float = 0.07, hot_share: float = 0.76) -> Table:
    """A table whose ``coverage`` share of rows is reachable, at random positions (hashing), with
    calibrated Zipf popularity among them."""
    reachable = max(1, round(coverage * rows))
    probs = np.zeros(rows)
    where = rng.choice(rows, size=reachable, replace=False)
    probs[where] = zipf_weights(reachable, calibrated_exponent(reachable, hot_fraction, hot_share))
    return Table(name, rows, dim, pooling, probs)


def sample_ids(table: Table, batch: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One batch's lookups into ``table`` as a jagged pair (ids, lengths): each sample looks up a
    Poisson(pooling) number of rows (at least one), drawn by popularity."""
    lengths = np.maximum(1, rng.poisson(table.pooling, size=batch)).astype(np.int64)
    cdf = np.cumsum(table.probs)
    ids = np.searchsorted(cdf, rng.random(int(lengths.sum())) * cdf[-1], side="right")
    return np.minimum(ids, table.rows - 1).astype(np.int64), lengths
