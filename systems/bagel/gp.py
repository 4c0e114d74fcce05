"""BAGEL's search: a query-specific Gaussian process over passage embeddings, fitted to the scorer's
relevance scores, seeded with the dense retriever's top hits, then GP-UCB until the budget is spent.
Also the baselines (dense retriever alone; rerank the retriever's top-B with the same budget) and
recall@k. Pure numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

Scorer = Callable[[int], float]


def sqdist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return np.maximum(d2, 0.0)


def rbf(a: np.ndarray, b: np.ndarray, lengthscale: float, signal_var: float = 1.0) -> np.ndarray:
    """Squared-exponential kernel k(x, x') = s^2 exp(-|x - x'|^2 / (2 l^2))."""
    return signal_var * np.exp(-sqdist(a, b) / (2.0 * lengthscale ** 2))


@dataclass(frozen=True)
class GPHyper:
    lengthscale: float
    signal_var: float = 1.0
    noise_var: float = 0.01
    mean: float = 0.0          # constant prior mean (0: a passage is irrelevant until shown otherwise)


def _k(d2: np.ndarray, h: GPHyper) -> np.ndarray:
    return h.signal_var * np.exp(-d2 / (2.0 * h.lengthscale ** 2))


def gp_posterior(X: np.ndarray, Xo: np.ndarray, y: np.ndarray, h: GPHyper, d2: np.ndarray | None = None,
                 d2oo: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and standard deviation of f at every row of X given noisy observations y at Xo.
    ``d2``/``d2oo``: the squared distances X-Xo and Xo-Xo when the caller keeps them (BAGEL's loop adds one
    column per score instead of recomputing every distance at every step)."""
    K = (_k(d2oo, h) if d2oo is not None else rbf(Xo, Xo, h.lengthscale, h.signal_var)) + h.noise_var * np.eye(len(Xo))
    L = np.linalg.cholesky(K)
    Ks = _k(d2, h) if d2 is not None else rbf(X, Xo, h.lengthscale, h.signal_var)
    alpha = np.linalg.solve(L.T, np.linalg.solve(L, y - h.mean))
    mu = h.mean + Ks @ alpha
    v = np.linalg.solve(L, Ks.T)
    var = np.maximum(h.signal_var - (v * v).sum(0), 1e-12)
    return mu, np.sqrt(var)


def log_marginal_likelihood(Xo: np.ndarray, y: np.ndarray, h: GPHyper, d2oo: np.ndarray | None = None) -> float:
    K = (_k(d2oo, h) if d2oo is not None else rbf(Xo, Xo, h.lengthscale, h.signal_var)) + h.noise_var * np.eye(len(Xo))
    try:
        L = np.linalg.cholesky(K)
    except np.linalg.LinAlgError:
        return -np.inf
    r = y - h.mean
    a = np.linalg.solve(L, r)
    return float(-0.5 * a @ a - np.log(np.diag(L)).sum() - 0.5 * len(y) * np.log(2 * np.pi))


def lengthscale_grid(X: np.ndarray, n: int = 9, sample: int = 400, seed: int = 0) -> np.ndarray:
    """Candidate length scales set from the embedding distances: log-spaced between the median
    nearest-neighbour distance and the median pairwise distance of (a sample of) the corpus."""
    rng = np.random.default_rng(seed)
    S = X[rng.choice(len(X), min(sample, len(X)), replace=False)]
    d = np.sqrt(sqdist(S, S))
    np.fill_diagonal(d, np.inf)
    lo = float(np.median(d.min(1)))
    np.fill_diagonal(d, np.nan)
    hi = float(np.nanmedian(d))
    return np.geomspace(max(lo, 1e-6), max(hi, lo * 1.01, 1e-5), n)


def fit_hyper(Xo: np.ndarray, y: np.ndarray, grid: Sequence[float], noise_grid: Sequence[float],
              signal_var: float, mean: float, d2oo: np.ndarray | None = None) -> GPHyper:
    """Type-II maximum likelihood over the length-scale x noise grid (signal variance and prior mean fixed)."""
    best, best_ll = None, -np.inf
    if d2oo is None:
        d2oo = sqdist(Xo, Xo)
    for ls in grid:
        for nv in noise_grid:
            h = GPHyper(float(ls), signal_var, float(nv), mean)
            ll = log_marginal_likelihood(Xo, y, h, d2oo)
            if ll > best_ll:
                best, best_ll = h, ll
    return best if best is not None else GPHyper(float(grid[len(grid) // 2]), signal_var, float(noise_grid[-1]), mean)


def ucb_beta(t: int, n: int, delta: float = 0.1, scale: float = 1.0) -> float:
    """GP-UCB exploration weight sqrt(beta_t) (Srinivas et al. 2010, finite domain of n points):
    beta_t = 2 log(n t^2 pi^2 / (6 delta)), times ``scale`` (the usual practical shrinkage)."""
    b = 2.0 * np.log(n * max(t, 1) ** 2 * np.pi ** 2 / (6.0 * delta))
    return float(scale * np.sqrt(b))


def ucb_pick(mu: np.ndarray, sd: np.ndarray, beta: float, scored: np.ndarray) -> int:
    """The unscored passage with the largest upper confidence bound mu + beta * sd."""
    u = np.where(scored, -np.inf, mu + beta * sd)
    return int(np.argmax(u))


def dense_rank(X: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The dense retriever: passages by distance to the query embedding (nearest first)."""
    return np.argsort(sqdist(q[None, :], X)[0], kind="stable")


def final_ranking(idx: Sequence[int], y: Sequence[float], mu: np.ndarray) -> np.ndarray:
    """Scored passages by their score, then every other passage by the GP posterior mean."""
    idx = np.asarray(idx, dtype=np.int64)
    first = idx[np.argsort(-np.asarray(y, float), kind="stable")]
    rest = np.setdiff1d(np.arange(len(mu)), idx)
    return np.concatenate([first, rest[np.argsort(-mu[rest], kind="stable")]])


def rerank_top_b(order: np.ndarray, scorer: Scorer, budget: int) -> np.ndarray:
    """Baseline: score the retriever's top-``budget`` passages, sort them by score, keep the rest in
    retriever order."""
    top = order[:budget]
    scores = np.array([scorer(int(i)) for i in top])
    return np.concatenate([top[np.argsort(-scores, kind="stable")], order[budget:]])


@dataclass
class BagelConfig:
    seeds: int = 5                  # retriever top hits scored first
    beta_scale: float = 0.5         # multiplies the GP-UCB sqrt(beta_t)
    beta_delta: float = 0.1
    signal_var: float = 0.25        # prior variance of relevance (scores in [0, 1])
    prior_mean: float = 0.0
    noise_grid: tuple[float, ...] = (1e-3, 1e-2, 4e-2)
    lengthscales: np.ndarray | None = None   # None: lengthscale_grid(X)
    refit_every: int = 1


@dataclass
class BagelTrace:
    scored: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    lengthscales: list[float] = field(default_factory=list)
    rankings: dict[int, np.ndarray] = field(default_factory=dict)   # budget -> final ranking


def bagel(X: np.ndarray, order: np.ndarray, scorer: Scorer, budgets: Sequence[int], cfg: BagelConfig) -> BagelTrace:
    """Run BAGEL to max(budgets) scorer calls; the ranking at each budget b uses only the first b
    scores (the selection never looks ahead, so one run yields the whole budget curve)."""
    budgets = sorted(set(int(b) for b in budgets))
    B = budgets[-1]
    if B < 1:
        raise ValueError("budget must be >= 1")
    grid = cfg.lengthscales if cfg.lengthscales is not None else lengthscale_grid(X)
    tr = BagelTrace()
    scored = np.zeros(len(X), bool)
    B_cols = min(B, len(X))
    D = np.empty((len(X), B_cols))    # squared distances of every passage to the scored ones (one column per score)

    def score(i: int) -> None:
        if scored[i]:
            raise RuntimeError(f"passage {i} scored twice")
        D[:, len(tr.scored)] = sqdist(X, X[i:i + 1])[:, 0]
        tr.scored.append(i)
        tr.scores.append(float(scorer(i)))
        scored[i] = True

    n_seeds = min(cfg.seeds, B)
    h = None
    for j in range(n_seeds):
        score(int(order[j]))
        if j + 1 in budgets and j + 1 < n_seeds:   # a budget smaller than the seed set
            hj = fit_hyper(X[tr.scored], np.asarray(tr.scores), grid, cfg.noise_grid, cfg.signal_var, cfg.prior_mean)
            mu, _ = gp_posterior(X, X[tr.scored], np.asarray(tr.scores), hj)
            tr.rankings[j + 1] = final_ranking(tr.scored, tr.scores, mu)
    while True:
        n = len(tr.scored)
        Xo, y = X[tr.scored], np.asarray(tr.scores)
        d2, d2oo = D[:, :n], D[tr.scored, :n]
        if h is None or (n - n_seeds) % cfg.refit_every == 0 or n in budgets:
            h = fit_hyper(Xo, y, grid, cfg.noise_grid, cfg.signal_var, cfg.prior_mean, d2oo)
        mu, sd = gp_posterior(X, Xo, y, h, d2, d2oo)
        tr.lengthscales.append(h.lengthscale)
        if n in budgets:
            tr.rankings[n] = final_ranking(tr.scored, tr.scores, mu)
        if n >= B or n >= len(X):
            return tr
        t = n - n_seeds + 1
        score(ucb_pick(mu, sd, ucb_beta(t, len(X), cfg.beta_delta, cfg.beta_scale), scored))


def recall_at_k(ranking: np.ndarray, relevant: np.ndarray, k: int) -> float:
    rel = set(np.asarray(relevant).tolist())
    return len(set(np.asarray(ranking[:k]).tolist()) & rel) / max(1, len(rel))
