"""Hot rows, hot inputs and stale rows (pure numpy).

- :func:`profile_hot_rows`: FAE's profiler: count row accesses over a sample of the training inputs
  and keep the most accessed rows that fit a memory budget.
- :func:`hot_slots` / :func:`hot_inputs`: a row's slot in the fast tier (-1: cold); an input is hot
  when every row it touches is hot.
- :class:`StalenessRule`: Slipstream's rule: per-row drift between snapshots of the hot rows (in
  units of the optimizer's update scale), a threshold re-picked at every snapshot by the loss change
  skipping would cause on a sample of the popular inputs (capped at ``max_skip`` of them), and the
  inputs that touch only stale rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

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


def row_drift(now: np.ndarray, snapshot: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Per-row drift since the snapshot in units of the update scale: ||now - snapshot|| / ``scale``
    (rows: axis 0). With ``scale`` the largest movement the optimizer can give a row between two
    snapshots, the drift no longer depends on the rows' own norms (their init), as a relative drift
    does."""
    return np.linalg.norm(now - snapshot, axis=1) / scale


def update_scale(lr: float, dim: int, steps: int) -> float:
    """The largest movement of a row in ``steps`` steps of row-wise Adagrad at learning rate ``lr``:
    each step moves a row by lr * g / sqrt(mean of g^2 so far), at most lr * sqrt(dim) in norm."""
    return lr * np.sqrt(dim) * steps


@dataclass(frozen=True)
class Pick:
    """One threshold pick: the drift quantile picked (0: none), its threshold, the sampled share of popular
    inputs it skips, their mean loss over the sample's (nan: nothing skipped), and what stopped a larger
    threshold: ``loss`` (its skipped inputs' loss was too high), ``cap`` (it skipped more than
    ``max_skip``), ``both``, or ``none`` (the grid's top quantile passed)."""

    quantile: float
    threshold: float
    skip_share: float
    loss_ratio: float
    bound: str


LossProbe = Callable[[np.ndarray], np.ndarray]  # indices into the inputs -> the current model's loss per input


@dataclass
class StalenessRule:
    """Slipstream's staleness rule over the fast tier's hot rows.

    ``observe(hot_w, inputs, rng, loss)`` is called every ``snapshot_every`` steps after a warm-up (the
    caller's): it measures each hot row's drift since the previous snapshot in units of the update
    scale, re-picks the threshold and marks the rows whose drift is below it as stale, then takes a new
    snapshot. The threshold is picked at every observation by the loss change skipping would cause, on
    ``sample`` popular inputs (inputs whose every row is hot: the only ones that can be skipped): a
    skipped input goes untrained, which costs little only when the model has learned it already, so
    among the ``quantiles`` of the per-input drift (the largest drift of an input's rows) the pick is the
    largest whose skipped inputs' mean loss (``loss``: the current model's, no gradient) is at most
    ``1 + max_loss_increase`` times the sample's mean loss, and whose skipped share of the sample stays
    within ``max_skip`` (a safety cap)."""

    slots: np.ndarray                 # global row -> hot slot or -1
    max_skip: float
    max_loss_increase: float = 0.0
    scale: float = 1.0                # update scale (see update_scale)
    sample: int = 2048
    quantiles: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    threshold: float | None = None
    stale: np.ndarray | None = None   # bool [n_hot]
    snapshot: np.ndarray | None = None
    history: list = field(default_factory=list)  # (stale share of hot rows) per observation
    picks: list[Pick] = field(default_factory=list)
    probed: int = 0                   # inputs whose loss was evaluated (Slipstream's cost, timed by the caller)
    _popular: tuple | None = field(default=None, repr=False)

    def observe(self, hot_w: np.ndarray, inputs: np.ndarray, rng: np.random.Generator, loss: LossProbe) -> None:
        if self.snapshot is None:
            self.snapshot = hot_w.copy()
            self.stale = np.zeros(len(hot_w), bool)
            return
        drift = row_drift(hot_w, self.snapshot, self.scale)
        self.threshold = self.choose_threshold(drift, inputs, rng, loss)
        self.stale = drift < self.threshold
        self.snapshot = hot_w.copy()
        self.history.append(float(self.stale.mean()) if len(self.stale) else 0.0)

    def choose_threshold(self, drift: np.ndarray, inputs: np.ndarray, rng: np.random.Generator,
                         loss: LossProbe) -> float:
        """An input is skipped when its most drifting row is below the threshold, so the candidates
        are the quantiles of that per-input drift over a sample of the popular inputs (a quantile of
        the rows alone is dominated by the many rarely touched hot rows, which never decide a skip).
        ``loss(idx)``: the current model's loss on ``inputs[idx]``, one value per input."""
        if self._popular is None or self._popular[0] is not inputs:  # the popular inputs, found once
            self._popular = (inputs, np.flatnonzero((self.slots[inputs] >= 0).all(axis=1)))
        popular = self._popular[1]
        if not len(popular) or not len(drift):
            self.picks.append(Pick(0.0, 0.0, 0.0, float("nan"), "none"))
            return 0.0
        idx = popular[rng.choice(len(popular), size=min(self.sample, len(popular)), replace=False)]
        worst = drift[self.slots[inputs[idx]]].max(axis=1)
        losses = np.asarray(loss(idx), np.float64)
        if losses.shape != idx.shape:
            raise ValueError(f"the loss probe returned {losses.shape} losses for {len(idx)} inputs")
        self.probed += len(idx)
        mean = float(losses.mean())
        best = Pick(0.0, 0.0, 0.0, float("nan"), "none")
        rejected: list[tuple[float, str]] = []  # (threshold, why) of every candidate that failed
        for q in self.quantiles:
            t = float(np.quantile(worst, q))
            skipped = worst < t  # every row of a popular input is hot: skipped iff its worst row is stale
            share = float(skipped.mean())
            ratio = float(losses[skipped].mean() / mean) if skipped.any() and mean > 0 else float("nan")
            over_cap = share > self.max_skip
            over_loss = skipped.any() and not ratio <= 1.0 + self.max_loss_increase
            if over_cap or over_loss:
                rejected.append((t, "both" if over_cap and over_loss else "cap" if over_cap else "loss"))
            elif t > best.threshold:
                best = Pick(q, t, share, ratio, "none")
        # what stopped a larger threshold: the first candidate above the pick that failed
        above = [why for t, why in rejected if t > best.threshold]
        best = Pick(best.quantile, best.threshold, best.skip_share, best.loss_ratio, above[0] if above else "none")
        self.picks.append(best)
        return best.threshold

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
