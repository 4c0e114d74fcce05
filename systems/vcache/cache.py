"""A reusable semantic prompt cache: embed a prompt, find its nearest cached prompt, and let a
decision policy choose between serving the cached response (exploit, a hit) and calling the model.

Two policies:

- :class:`StaticThreshold`: the usual semantic cache (GPTCache-style). Serve the neighbour's response
  when the cosine similarity is at least one global threshold; otherwise call the model and insert
  the prompt.
- :class:`VerifiedPolicy`: vCache (arXiv 2502.03771). Every cached entry keeps observations
  (similarity s, whether its response was correct for that prompt). With fewer than ``min_obs`` of
  them, or without both a correct and a wrong one, the policy explores. Otherwise it fits
  ``P(correct | s) = sigmoid(gamma (s - t))`` by maximum likelihood, takes Var(t) by the delta
  method, and for every eps on a grid computes ``t' = t + z(1-eps) sqrt(Var)``,
  ``alpha = (1-eps) sigmoid(gamma (s - t'))`` and ``tau = 1 - delta / (1 - alpha)``; tau* is the
  smallest. It explores with probability tau*, else serves the cached response. Exploring calls the
  model, a judge says whether the cached response would have been right, the observation is
  appended to the neighbour, and a wrong one adds the prompt as a new entry.

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


def fit_logistic(s: np.ndarray, y: np.ndarray, separable_var_scale: float = 0.2,
                 ridge: float = 1e-6, iters: int = 60) -> LogisticFit | None:
    """Maximum-likelihood fit of ``P(y=1|s) = sigmoid(gamma (s - t))`` and Var(t) by the delta method.

    Returns None when it cannot be fitted (a single label, or no increasing relation). With
    perfectly separated labels the maximum-likelihood slope diverges and the delta method is
    undefined; the authors' implementation then substitutes an empirically calibrated variance per
    observation count, which ``separable_var_scale / n`` approximates (within about 2x)."""
    s = np.asarray(s, float)
    y = np.asarray(y, float)
    if len(s) == 0 or y.min() == y.max():
        return None
    X = np.stack([np.ones_like(s), s], 1)
    b = np.zeros(2)
    lam = ridge * np.eye(2)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(X @ b, -500, 500)))
        w = p * (1 - p)
        H = X.T @ (w[:, None] * X) + lam
        g = X.T @ (y - p) - lam @ b
        try:
            step = np.linalg.solve(H, g)
        except np.linalg.LinAlgError:
            break
        b = b + step
        if abs(b[1]) > 1e5 or np.abs(step).max() < 1e-10:
            break
    intercept, gamma = float(b[0]), float(b[1])
    if not np.isfinite(gamma) or gamma <= 1e-6:
        return None
    t = float(np.clip(-intercept / gamma, 0.0, 1.0))
    separable = bool(s[y == 1].min() > s[y == 0].max())
    if separable:
        var_t = separable_var_scale / len(s)
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


EPS_GRID = np.linspace(1e-6, 1 - 1e-6, 50)
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
    delta: float
    min_obs: int = 6
    separable_var_scale: float = 0.2
    name: str = "vcache"
    fits: int = 0

    def __post_init__(self):
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1) (got {self.delta})")

    def current_fit(self, entry: Entry) -> LogisticFit | None:
        n = len(entry.obs_s)
        if entry.fit is None or entry.fit[0] != n:
            self.fits += 1
            entry.fit = (n, fit_logistic(np.array(entry.obs_s), np.array(entry.obs_y), self.separable_var_scale))
        return entry.fit[1]

    def decide(self, s: float, entry: Entry, rng: np.random.Generator) -> bool:
        if len(entry.obs_s) < self.min_obs:
            return False
        fit = self.current_fit(entry)
        if fit is None:
            return False
        return bool(rng.random() > tau_star(s, fit, self.delta))

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
    _fit: LogisticFit | None = None
    _fit_n: int = 0

    def current_fit(self, entry: Entry) -> LogisticFit | None:
        n = len(self.pool.obs_s)
        if n != self._fit_n and (self._fit_n == 0 or n >= self._fit_n * (1 + self.refit_growth)):
            self.fits += 1
            self._fit_n = n
            self._fit = fit_logistic(np.array(self.pool.obs_s), np.array(self.pool.obs_y), self.separable_var_scale)
        return self._fit

    def decide(self, s: float, entry: Entry, rng: np.random.Generator) -> bool:
        if len(self.pool.obs_s) < self.min_obs:
            return False
        fit = self.current_fit(entry)
        if fit is None:
            return False
        return bool(rng.random() > tau_star(s, fit, self.delta))

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
