"""A reusable semantic prompt cache: embed a prompt, find its nearest cached prompt, and let a
decision policy choose between serving the cached response (exploit, a hit) and calling the model.

Two policies:

- :class:`StaticThreshold`: the usual semantic cache (GPTCache-style). Serve the neighbour's response
  when the cosine similarity is at least one global threshold; otherwise call the model and insert
  the prompt.
- :class:`VerifiedPolicy`: vCache (arXiv 2502.03771). Every cached entry keeps observations
  (similarity s, whether its response was correct for that prompt). With fewer than ``min_obs`` of
  them (counting the two pseudo-observations every entry starts with, as in the authors'
  implementation: wrong at similarity 0, right at 1), the policy explores. Otherwise it fits
  ``P(correct | s) = sigmoid(gamma (s - t))`` by maximum likelihood, takes Var(t) by the delta
  method, and for every eps on a grid computes ``t' = t + z(1-eps) sqrt(Var)``,
  ``alpha = (1-eps) sigmoid(gamma (s - t'))`` and ``tau = 1 - delta / (1 - alpha)``; tau* is the
  smallest (over a dense grid, see EPS_GRID). Perfectly separated observations get Var(t) from our
  own simulation (see simulate_separable_error). It explores with probability tau*, else serves
  the cached response. Exploring calls the model, a judge says whether the cached response would
  have been right, the observation is appended to the neighbour, and a wrong one adds the prompt as
  a new entry.

Nearest-neighbour search is exact (numpy matrix-vector product over a contiguous float32 buffer);
at the cache sizes here (at most tens of thousands of entries of <= 384 dims) that is a few tens of
microseconds per query, so no ANN index is used (see docs/vcache.md). Pure: no prefect/dask imports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np
from scipy.stats import norm


class VectorIndex:
    """Exact cosine nearest neighbour over unit vectors, amortized O(1) append."""

    def __init__(self, dim: int, capacity: int = 1024):
        self.dim = dim
        self._buf = np.zeros((max(1, capacity), dim), np.float32)
        self.size = 0

    def add(self, vec: np.ndarray) -> int:
        if self.size == len(self._buf):
            grown = np.zeros((2 * len(self._buf), self.dim), np.float32)
            grown[:self.size] = self._buf[:self.size]
            self._buf = grown
        self._buf[self.size] = vec
        self.size += 1
        return self.size - 1

    def nearest(self, vec: np.ndarray) -> tuple[int, float]:
        """(index, cosine similarity) of the nearest entry; (-1, -inf) when empty."""
        if self.size == 0:
            return -1, -math.inf
        sims = self._buf[:self.size] @ vec
        i = int(np.argmax(sims))
        return i, float(sims[i])


@dataclass
class Entry:
    response: Any
    obs_s: list[float] = field(default_factory=list)
    obs_y: list[int] = field(default_factory=list)
    fit: tuple | None = None          # (n_obs at fit time, t_hat, gamma, var_t) or None
    label: Any = None                 # the workload's equivalence class (bookkeeping for evaluation only)


@dataclass(frozen=True)
class LogisticFit:
    t: float
    gamma: float
    var_t: float
    separable: bool


def fit_logistic(s: np.ndarray, y: np.ndarray, separable_var_scale: float = 1.0,
                 ridge: float = 1e-6, iters: int = 60) -> LogisticFit | None:
    """Maximum-likelihood fit of ``P(y=1|s) = sigmoid(gamma (s - t))`` and Var(t) by the delta method.

    Returns None when it cannot be fitted (a single label, or no increasing relation). With
    perfectly separated labels the maximum-likelihood slope diverges and the delta method is
    undefined; Var(t) is then ``separable_var_scale x separable_variance(n)``, our own calibration
    (see :func:`simulate_separable_error`)."""
    s = np.asarray(s, float)
    y = np.asarray(y, float)
    if len(s) == 0 or y.min() == y.max():
        return None
    X = np.stack([np.ones_like(s), s], 1)
    b0 = b1 = 0.0
    for _ in range(iters):
        # Newton step on the 2x2 system, solved in closed form (np.linalg.solve's overhead dominated)
        p = 1.0 / (1.0 + np.exp(-np.clip(b0 + b1 * s, -500, 500)))
        w = p * (1 - p)
        ws, r = w * s, y - p
        h00, h01, h11 = w.sum() + ridge, ws.sum(), (ws * s).sum() + ridge
        g0, g1 = r.sum() - ridge * b0, (r * s).sum() - ridge * b1
        det = h00 * h11 - h01 * h01
        if not det > 0:
            break
        d0, d1 = (h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det
        b0, b1 = b0 + d0, b1 + d1
        if abs(b1) > 1e5 or max(abs(d0), abs(d1)) < 1e-10:
            break
    b = np.array([b0, b1])
    intercept, gamma = float(b0), float(b1)
    if not np.isfinite(gamma) or gamma <= 1e-6:
        return None
    t = float(np.clip(-intercept / gamma, 0.0, 1.0))
    separable = bool(s[y == 1].min() > s[y == 0].max())
    if separable:
        var_t = separable_var_scale * separable_variance(len(s))
    else:
        p = 1.0 / (1.0 + np.exp(-np.clip(X @ b, -500, 500)))
        H = X.T @ ((p * (1 - p))[:, None] * X)
        grad = np.array([-1.0 / gamma, intercept / gamma ** 2])
        try:
            var_t = max(0.0, float(grad @ np.linalg.inv(H) @ grad))
        except np.linalg.LinAlgError:
            return None
        if not np.isfinite(var_t):
            return None
    return LogisticFit(t, gamma, var_t, separable)


# The two pseudo-observations every entry starts with in the authors' implementation: a wrong answer at
# similarity 0 and a right one at 1. They give every entry both labels, so an entry whose real
# observations all agree is still fitted (a separated sample) instead of exploring forever.
ANCHORS = ((0.0, 0), (1.0, 1))

# Mean squared error of the threshold fitted to n perfectly separated observations (n counts the
# anchors), pinned from simulate_separable_error(n) (reps=1000, seed=0);
# tests/unit/test_vcache_sepvar.py recomputes entries of it.
SEPARABLE_MSE = {6: 0.01918, 8: 0.01292, 12: 0.008095, 16: 0.006504, 24: 0.005067, 32: 0.003440,
                 48: 0.002650, 64: 0.001820}


def fit_power_law(table: dict[int, float]) -> tuple[float, float]:
    """(A, B) of the least-squares fit of log MSE = log A - B log n: a smooth curve through the noisy
    simulated points that also extends past the largest simulated n."""
    ns = np.array(sorted(table), float)
    slope, intercept = np.polyfit(np.log(ns), np.log([table[int(n)] for n in ns]), 1)
    return float(math.exp(intercept)), float(-slope)


SEPARABLE_VAR_A, SEPARABLE_VAR_B = fit_power_law(SEPARABLE_MSE)


def separable_variance(n: int) -> float:
    """Var(t) of a threshold fitted to ``n`` perfectly separated observations (anchors included)."""
    return SEPARABLE_VAR_A * max(n, 2) ** -SEPARABLE_VAR_B


def simulate_separable_error(n: int, reps: int = 1000, seed: int = 0) -> float:
    """Mean squared error of the fitted threshold over ``reps`` simulated entries whose ``n``
    observations (the two anchors + n - 2 real ones) come out perfectly separated.

    Each entry draws a true threshold t ~ U(0.5, 0.95) and slope gamma log-uniform in [20, 200]
    (non-separated entries of the quick sphere stream fit slopes of about 20 to 540, median ~140,
    so this leans to the shallower, more uncertain side), similarities
    s ~ U(0.5, 1) (where cached neighbours lie) and labels y ~ Bernoulli(sigmoid(gamma (s - t)));
    samples that are not separated are redrawn. The error is t_hat - t for the same fit the cache
    uses, so the variance covers the fit's bias as well as its spread."""
    if n < 3:
        raise ValueError(f"n must be at least 3 (two anchors and one observation), got {n}")
    rng = np.random.default_rng(seed + n)
    sq = []
    while len(sq) < reps:
        t, gamma = rng.uniform(0.5, 0.95), math.exp(rng.uniform(math.log(20), math.log(200)))
        s = rng.uniform(0.5, 1.0, n - 2)
        y = (rng.random(n - 2) < 1.0 / (1.0 + np.exp(-gamma * (s - t)))).astype(int)
        s, y = np.r_[0.0, 1.0, s], np.r_[0, 1, y]
        if not s[y == 1].min() > s[y == 0].max():
            continue
        fit = fit_logistic(s, y)
        if fit is not None:
            sq.append((fit.t - t) ** 2)
    return float(np.mean(sq))


def derive_separable_variance(ns=tuple(SEPARABLE_MSE), reps: int = 1000, seed: int = 0) -> dict[int, float]:
    """The table :data:`SEPARABLE_MSE` pins (about 8 s)."""
    return {n: simulate_separable_error(n, reps, seed) for n in ns}


# The paper takes tau* as the minimum of tau over eps in (0, 1). The authors' 50 evenly spaced points
# leave no eps between 1e-6 and 0.02, so for delta <= 2% tau* could reach 0 only at eps = 1e-6
# (s above t + 4.75 sd) and stays >= 1 - delta / 0.0204 elsewhere: exploration is capped by the grid,
# not by the bound. 400 log-spaced points (steps of 3%) below 0.5 approximate the minimum closely.
EPS_GRID_REFERENCE = np.linspace(1e-6, 1 - 1e-6, 50)
EPS_GRID = np.unique(np.concatenate([EPS_GRID_REFERENCE, np.geomspace(1e-6, 0.5, 400)]))
Z_GRID = norm.ppf(1 - EPS_GRID)


def tau_star(s: float, fit: LogisticFit, delta: float, eps_grid: np.ndarray = EPS_GRID,
             z_grid: np.ndarray | None = None) -> float:
    """The smallest exploration probability over the eps grid that keeps the error below delta."""
    z = Z_GRID if z_grid is None else z_grid
    t_prime = np.clip(fit.t + z * math.sqrt(fit.var_t), 0.0, 1.0)
    alpha = (1 - eps_grid) * (1.0 / (1.0 + np.exp(-np.clip(fit.gamma * (s - t_prime), -500, 500))))
    taus = 1.0 - delta / np.maximum(1.0 - alpha, 1e-300)
    return float(np.clip(taus.min(), 0.0, 1.0))


class Policy(Protocol):
    name: str

    def decide(self, s: float, entry: Entry, rng: np.random.Generator) -> bool:
        """True: serve the cached response (exploit); False: call the model (explore/miss)."""

    def learns(self) -> bool:
        """Whether the cache records judge feedback on explorations."""

    def observe(self, entry: Entry, s: float, correct: bool) -> None:
        """Record the judge's verdict (called only when ``learns()``)."""


@dataclass
class StaticThreshold:
    threshold: float
    name: str = "static_threshold"

    def decide(self, s: float, entry: Entry, rng: np.random.Generator) -> bool:
        return s >= self.threshold

    def learns(self) -> bool:
        return False


@dataclass
class VerifiedPolicy:
    """``min_obs`` counts the anchors (as the authors' implementation does) when ``anchors`` is on;
    ``eps_grid`` None: the dense grid :data:`EPS_GRID`."""
    delta: float
    min_obs: int = 6
    separable_var_scale: float = 1.0
    anchors: bool = True
    eps_grid: np.ndarray | None = None
    name: str = "vcache"
    fits: int = 0

    def __post_init__(self):
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1) (got {self.delta})")
        self._z = None if self.eps_grid is None else norm.ppf(1 - self.eps_grid)

    def n_obs(self, entry: Entry) -> int:
        return len(entry.obs_s) + (len(ANCHORS) if self.anchors else 0)

    def _fit(self, entry: Entry) -> LogisticFit | None:
        s, y = entry.obs_s, entry.obs_y
        if self.anchors:
            s, y = [a for a, _ in ANCHORS] + s, [b for _, b in ANCHORS] + y
        return fit_logistic(np.array(s), np.array(y), self.separable_var_scale)

    def current_fit(self, entry: Entry) -> LogisticFit | None:
        n = len(entry.obs_s)
        if entry.fit is None or entry.fit[0] != n:
            self.fits += 1
            entry.fit = (n, self._fit(entry))
        return entry.fit[1]

    def tau(self, s: float, fit: LogisticFit) -> float:
        if self.eps_grid is None:
            return tau_star(s, fit, self.delta)
        return tau_star(s, fit, self.delta, self.eps_grid, self._z)

    def decide(self, s: float, entry: Entry, rng: np.random.Generator) -> bool:
        if self.n_obs(entry) < self.min_obs:
            return False
        fit = self.current_fit(entry)
        if fit is None:
            return False
        return bool(rng.random() > self.tau(s, fit))

    def learns(self) -> bool:
        return True

    def observe(self, entry: Entry, s: float, correct: bool) -> None:
        """Record the judge's verdict on an exploration of ``entry`` at similarity ``s``."""
        entry.obs_s.append(s)
        entry.obs_y.append(int(correct))


@dataclass
class GlobalVerifiedPolicy(VerifiedPolicy):
    """The mechanism ablation: vCache's error-bound machinery (the same warm-up, logistic fit, delta
    method, eps grid and exploration probability tau*) over ONE pool of observations shared by every
    entry, i.e. one learned global threshold instead of one per embedding. The pooled fit is refreshed
    when the pool has grown by ``refit_growth`` (5%) since the last fit, so refits stay logarithmic."""

    name: str = "vcache_global"
    refit_growth: float = 0.05
    pool: Entry = field(default_factory=lambda: Entry(response=None))
    _fit_pool: LogisticFit | None = None
    _fit_n: int = 0

    def current_fit(self, entry: Entry) -> LogisticFit | None:
        n = len(self.pool.obs_s)
        if n != self._fit_n and (self._fit_n == 0 or n >= self._fit_n * (1 + self.refit_growth)):
            self.fits += 1
            self._fit_n = n
            self._fit_pool = self._fit(self.pool)
        return self._fit_pool

    def decide(self, s: float, entry: Entry, rng: np.random.Generator) -> bool:
        if self.n_obs(self.pool) < self.min_obs:
            return False
        fit = self.current_fit(entry)
        if fit is None:
            return False
        return bool(rng.random() > self.tau(s, fit))

    def observe(self, entry: Entry, s: float, correct: bool) -> None:
        self.pool.obs_s.append(s)
        self.pool.obs_y.append(int(correct))


class SemanticCache:
    """Embeddings in a :class:`VectorIndex`, one :class:`Entry` per cached prompt, one policy.

    ``lookup`` is the whole protocol for one prompt: it returns (response, hit). ``model(prompt)``
    produces a fresh response; ``judge(cached, fresh)`` says whether the cached one was right."""

    def __init__(self, dim: int, policy: Policy, model: Callable[[Any], Any],
                 judge: Callable[[Any, Any], bool], seed: int = 0):
        self.index = VectorIndex(dim)
        self.entries: list[Entry] = []
        self.policy = policy
        self.model = model
        self.judge = judge
        self.rng = np.random.default_rng(seed)
        self.model_calls = 0

    def insert(self, vec: np.ndarray, response: Any, label: Any = None) -> None:
        self.index.add(vec)
        self.entries.append(Entry(response=response, label=label))

    def lookup(self, prompt: Any, vec: np.ndarray, label: Any = None) -> tuple[Any, bool, int]:
        """(response, hit, neighbour index or -1)."""
        i, s = self.index.nearest(vec)
        return self.resolve(prompt, vec, i, s, label)

    def resolve(self, prompt: Any, vec: np.ndarray, i: int, s: float, label: Any = None) -> tuple[Any, bool, int]:
        """The policy's step for a prompt whose nearest entry ``i`` (similarity ``s``) is known."""
        if i < 0:
            fresh = self._call(prompt)
            self.insert(vec, fresh, label)
            return fresh, False, -1
        entry = self.entries[i]
        if self.policy.decide(s, entry, self.rng):
            return entry.response, True, i
        fresh = self._call(prompt)
        if self.policy.learns():
            correct = bool(self.judge(entry.response, fresh))
            self.policy.observe(entry, s, correct)
            if not correct:
                self.insert(vec, fresh, label)
        else:
            self.insert(vec, fresh, label)
        return fresh, False, i

    def _call(self, prompt: Any) -> Any:
        self.model_calls += 1
        return self.model(prompt)
