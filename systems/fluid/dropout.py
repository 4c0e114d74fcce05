"""Sub-models of the MLP: Invariant Dropout (FLuID), random and ordered dropout, re-expansion of a
sub-model's update into the full model, update validation and masked FedAvg aggregation (pure).

A sub-model keeps ``keep[0]`` neurons of hidden layer 1 and ``keep[1]`` of hidden layer 2 (sorted
index arrays). Neuron ``j`` of a hidden layer owns its incoming column (and bias) and its outgoing row.
"""
from __future__ import annotations

import math

import numpy as np

from mlsys_flows.errors import MlsysError

from .model import Weights

EPS = 1e-12


class UpdateError(MlsysError, ValueError):
    """A client's update cannot be aggregated (wrong structure or shapes, NaN or inf)."""


# ---------------------------------------------------------------- Invariant Dropout: neuron selection
def neuron_change(global_w: Weights, client_w: Weights) -> tuple[np.ndarray, np.ndarray]:
    """Relative update magnitude of every hidden neuron for one client: the L1 norm of the change of
    the neuron's incoming weights, bias and outgoing weights over the L1 norm of those global weights."""
    d = [np.abs(c.astype(np.float64) - g) for c, g in zip(client_w, global_w)]
    a = [np.abs(g.astype(np.float64)) for g in global_w]
    ch1 = d[0].sum(0) + d[1] + d[2].sum(1)
    ch2 = d[2].sum(0) + d[3] + d[4].sum(1)
    base1 = a[0].sum(0) + a[1] + a[2].sum(1)
    base2 = a[2].sum(0) + a[3] + a[4].sum(1)
    return ch1 / (base1 + EPS), ch2 / (base2 + EPS)


def neuron_scores(global_w: Weights, non_straggler_updates: list[Weights]) -> tuple[np.ndarray, np.ndarray]:
    """Per-neuron update magnitude tracked from the non-stragglers: the median over those clients
    of each neuron's relative change ("stable for most non-stragglers")."""
    if not non_straggler_updates:
        raise ValueError("invariant dropout needs at least one non-straggler update")
    per = [neuron_change(global_w, u) for u in non_straggler_updates]
    return (np.median(np.stack([p[0] for p in per]), axis=0),
            np.median(np.stack([p[1] for p in per]), axis=0))


def invariant_neurons(scores: np.ndarray, theta: float) -> np.ndarray:
    """Indices (ascending) of the neurons whose update magnitude is below ``theta``."""
    return np.flatnonzero(np.asarray(scores) < theta)


def threshold_for_drop(scores: np.ndarray, n_drop: int, theta_init: float, growth: float,
                       max_steps: int = 10_000) -> tuple[float, np.ndarray]:
    """FLuID's threshold search: raise theta from ``theta_init`` by ``growth`` until at least
    ``n_drop`` neurons are invariant; drop the ``n_drop`` most invariant of them (ties: lower index).
    Returns (theta, dropped indices ascending)."""
    scores = np.asarray(scores, np.float64)
    if not 0 <= n_drop <= len(scores):
        raise ValueError(f"n_drop={n_drop} outside 0..{len(scores)}")
    if n_drop == 0:
        return float(theta_init), np.empty(0, np.int64)
    theta = float(theta_init)
    for _ in range(max_steps):
        inv = invariant_neurons(scores, theta)
        if len(inv) >= n_drop:
            break
        theta *= growth
    else:
        raise ValueError("threshold search did not reach the drop target (scores not finite?)")
    order = inv[np.argsort(scores[inv], kind="stable")]
    return theta, np.sort(order[:n_drop])


def keep_count(hidden: int, r: float) -> int:
    return max(1, min(hidden, int(round(r * hidden))))


def invariant_keep(scores: tuple[np.ndarray, np.ndarray], r: float, theta_init: float,
                   growth: float) -> tuple[tuple[np.ndarray, np.ndarray], tuple[float, float]]:
    """Neurons a straggler keeps in each hidden layer under Invariant Dropout at sub-model size r,
    and the two thresholds that selected the dropped ones."""
    keeps, thetas = [], []
    for s in scores:
        n_drop = len(s) - keep_count(len(s), r)
        theta, dropped = threshold_for_drop(s, n_drop, theta_init, growth)
        keeps.append(np.setdiff1d(np.arange(len(s)), dropped))
        thetas.append(theta)
    return (keeps[0], keeps[1]), (thetas[0], thetas[1])


def random_keep(hidden: tuple[int, int], r: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Federated Dropout: a fresh random subset of each hidden layer."""
    return tuple(np.sort(rng.choice(h, keep_count(h, r), replace=False)) for h in hidden)  # type: ignore[return-value]


def ordered_keep(hidden: tuple[int, int], r: float) -> tuple[np.ndarray, np.ndarray]:
    """Ordered dropout (FjORD): the first r fraction of each hidden layer."""
    return tuple(np.arange(keep_count(h, r)) for h in hidden)  # type: ignore[return-value]


def full_keep(hidden: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(hidden[0]), np.arange(hidden[1])


# ---------------------------------------------------------------- sub-model size
def flop_fraction(n_in: int, hidden: int, n_out: int, r: float) -> float:
    """Training FLOPs of the sub-model at size r over the full model's (both hidden layers cut)."""
    h = keep_count(hidden, r)
    return (n_in * h + h * h + h * n_out) / (n_in * hidden + hidden * hidden + hidden * n_out)


def submodel_size(speedup_needed: float, n_in: int, hidden: int, n_out: int, min_r: float,
                  step: float = 0.05) -> float:
    """The largest r on a grid of ``step`` (1.0 down to ``min_r``) whose FLOPs fit 1/speedup_needed of
    the full model's, so the straggler finishes near the target time; ``min_r`` if none does."""
    if speedup_needed <= 1.0:
        return 1.0
    n = int(math.floor((1.0 - min_r) / step + 1e-9))
    for i in range(n + 1):
        r = round(1.0 - i * step, 10)
        if flop_fraction(n_in, hidden, n_out, r) <= 1.0 / speedup_needed + 1e-12:
            return r
    return min_r


# ---------------------------------------------------------------- extraction, re-expansion, aggregation
def is_full(w: Weights, keep: tuple[np.ndarray, np.ndarray]) -> bool:
    return len(keep[0]) == w[0].shape[1] and len(keep[1]) == w[2].shape[1]


def extract(w: Weights, keep: tuple[np.ndarray, np.ndarray]) -> Weights:
    k1, k2 = keep
    if is_full(w, keep):
        return [a.copy() for a in w]
    return [w[0][:, k1].copy(), w[1][k1].copy(), w[2][np.ix_(k1, k2)].copy(), w[3][k2].copy(),
            w[4][k2, :].copy(), w[5].copy()]


def submodel_shapes(full_shapes: list[tuple[int, ...]], keep: tuple[np.ndarray, np.ndarray]) -> list[tuple[int, ...]]:
    (n_in, _), (_, n_out) = full_shapes[0], full_shapes[4]
    a, b = len(keep[0]), len(keep[1])
    return [(n_in, a), (a,), (a, b), (b,), (b, n_out), (n_out,)]


def expand(sub: Weights, keep: tuple[np.ndarray, np.ndarray], base: Weights) -> tuple[Weights, list[np.ndarray]]:
    """Re-expand a sub-model into the full model: trained entries go back to their original indices,
    dropped neurons keep ``base`` (the server's weights). Returns (full weights, masks of trained entries)."""
    k1, k2 = keep
    if is_full(base, keep) and [a.shape for a in sub] == [b.shape for b in base]:
        return list(sub), [np.ones(b.shape, bool) for b in base]
    full = [b.copy() for b in base]
    masks = [np.zeros(b.shape, bool) for b in base]
    for i, idx in ((0, (slice(None), k1)), (1, k1), (2, np.ix_(k1, k2)), (3, k2), (4, (k2, slice(None))),
                   (5, slice(None))):
        full[i][idx] = sub[i]
        masks[i][idx] = True
    return full, masks


def check_update(update: object, shapes: list[tuple[int, ...]]) -> None:
    """Raise UpdateError unless ``update`` is a list of finite arrays of exactly ``shapes``."""
    if not isinstance(update, (list, tuple)) or len(update) != len(shapes):
        raise UpdateError(f"expected {len(shapes)} arrays, got {type(update).__name__}"
                          f"{'' if not isinstance(update, (list, tuple)) else f' of {len(update)}'}")
    for i, (a, s) in enumerate(zip(update, shapes)):
        if not isinstance(a, np.ndarray):
            raise UpdateError(f"array {i} is a {type(a).__name__}, not a numpy array")
        if a.shape != tuple(s):
            raise UpdateError(f"array {i} has shape {a.shape}, expected {tuple(s)}")
        if not np.all(np.isfinite(a)):
            raise UpdateError(f"array {i} holds {int(np.sum(~np.isfinite(a)))} NaN/inf value(s)")


def aggregate(base: Weights, entries: list[tuple[Weights, list[np.ndarray], float]]) -> Weights:
    """FedAvg over re-expanded client models: each entry is (full weights, trained mask, samples);
    every coordinate is the sample-weighted mean over the clients that trained it, the server's
    weight where none did."""
    out = []
    for i, b in enumerate(base):
        num = np.zeros(b.shape, np.float64)
        den = np.zeros(b.shape, np.float64)
        for w, m, n in entries:
            if m[i].all():
                num += n * w[i]
                den += n
            else:
                num += n * m[i] * w[i]
                den += n * m[i]
        out.append(np.where(den > 0, num / np.maximum(den, EPS), b).astype(b.dtype))
    return out
