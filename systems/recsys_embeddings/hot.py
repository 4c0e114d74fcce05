"""Hot rows, hot inputs and stale rows (pure numpy).

- :func:`profile_hot_rows`: FAE's profiler: count row accesses over a sample of the training inputs
  and keep the most accessed rows that fit a memory budget.
- :func:`hot_slots` / :func:`hot_inputs`: a row's slot in the fast tier (-1: cold); an input is hot
  when every row it touches is hot.
- :class:`StalenessRule`: Slipstream's rule: per-row drift between snapshots of the hot rows, a
  threshold chosen on a sample, and the inputs that touch only stale rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def budget_rows(budget_mb: float, dim: int) -> int:
    """Rows of ``dim`` float32 values that fit ``budget_mb`` megabytes."""
    return int(budget_mb * 1e6 // (4 * dim))


def profile_hot_rows(ids: np.ndarray, total_rows: int, sample_fraction: float, budget: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """The hottest rows (sorted global ids) among those accessed by a ``sample_fraction`` sample of
    the inputs ``ids`` [N, T], at most ``budget`` of them; and the number of inputs profiled."""
    n = len(ids)
    k = max(1, int(round(sample_fraction * n)))
    sample = ids[rng.choice(n, size=k, replace=False)]
    counts = np.bincount(sample.ravel(), minlength=total_rows)
    seen = np.flatnonzero(counts)
    if len(seen) > budget:
        # stable: among equal counts, the lower row id wins (deterministic)
        order = np.argsort(-counts[seen], kind="stable")[:budget]
        seen = seen[order]
    return np.sort(seen).astype(np.int64), k


def hot_slots(hot_rows: np.ndarray, total_rows: int) -> np.ndarray:
    """int64 [total_rows]: the fast-tier slot of every hot row, -1 for cold rows."""
    slots = np.full(total_rows, -1, np.int64)
    slots[hot_rows] = np.arange(len(hot_rows))
    return slots


def hot_inputs(ids: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """bool [N]: inputs whose every row is hot."""
    return (slots[ids] >= 0).all(axis=1)


def row_drift(now: np.ndarray, snapshot: np.ndarray) -> np.ndarray:
    """Per-row relative drift ||now - snapshot|| / ||snapshot|| (rows: axis 0)."""
    num = np.linalg.norm(now - snapshot, axis=1)
    return num / np.maximum(np.linalg.norm(snapshot, axis=1), 1e-12)


@dataclass
class StalenessRule:
    """Slipstream's staleness rule over the fast tier's hot rows.

    ``observe(hot_w)`` is called every ``snapshot_every`` steps: it measures each hot row's drift
    since the previous snapshot, marks the rows whose drift is below the threshold as stale and takes
    a new snapshot. The threshold is chosen once, at the first drift measured, on samples: among the
    ``quantiles`` of the drift of ``sample`` random hot rows, the largest whose share of skipped inputs
    (inputs touching only stale rows) on a sample of training inputs stays within ``max_skip``."""

    slots: np.ndarray                 # global row -> hot slot or -1
    max_skip: float
    sample: int = 2048
    quantiles: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    threshold: float | None = None
    stale: np.ndarray | None = None   # bool [n_hot]
    snapshot: np.ndarray | None = None
    history: list = field(default_factory=list)  # (stale share of hot rows) per observation

    def observe(self, hot_w: np.ndarray, inputs: np.ndarray, rng: np.random.Generator) -> None:
        if self.snapshot is None:
            self.snapshot = hot_w.copy()
            self.stale = np.zeros(len(hot_w), bool)
            return
        drift = row_drift(hot_w, self.snapshot)
        if self.threshold is None:
            self.threshold = self.choose_threshold(drift, inputs, rng)
        self.stale = drift < self.threshold
        self.snapshot = hot_w.copy()
        self.history.append(float(self.stale.mean()) if len(self.stale) else 0.0)

    def choose_threshold(self, drift: np.ndarray, inputs: np.ndarray, rng: np.random.Generator) -> float:
        rows = drift[rng.choice(len(drift), size=min(self.sample, len(drift)), replace=False)]
        probe = inputs[rng.choice(len(inputs), size=min(self.sample, len(inputs)), replace=False)]
        best = 0.0
        for q in self.quantiles:
            t = float(np.quantile(rows, q))
            if skip_mask(probe, self.slots, drift < t).mean() <= self.max_skip:
                best = max(best, t)
        return best

    def skippable(self, ids: np.ndarray) -> np.ndarray:
        """bool [n]: inputs whose every row is hot and stale (none before the first drift)."""
        if self.stale is None or self.threshold is None:
            return np.zeros(len(ids), bool)
        return skip_mask(ids, self.slots, self.stale)


def skip_mask(ids: np.ndarray, slots: np.ndarray, stale: np.ndarray) -> np.ndarray:
    """bool [n]: inputs ``ids`` [n, T] whose every row is hot (``slots`` >= 0) and stale."""
    s = slots[ids]
    hot = (s >= 0).all(axis=1)
    out = np.zeros(len(ids), bool)
    out[hot] = stale[s[hot]].all(axis=1)
    return out
