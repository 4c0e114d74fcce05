"""Replay a prompt stream through a semantic cache and count hits and errors (pure numpy).

The model is the offline oracle: its answer to a prompt is the prompt's equivalence class, and the
judge compares classes, so a served cached response is an error exactly when its class differs.
Every query is one of: a hit (cached response served), or a model call (explore or miss). The error
rate counts wrong served responses over all queries (model calls are always right), which is the
quantity vCache bounds by delta.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cache import Policy, SemanticCache, StaticThreshold, VerifiedPolicy
from .workload import Stream


@dataclass
class Outcome:
    hits: int
    errors: int
    queries: int
    entries: int
    fits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries

    @property
    def error_rate(self) -> float:
        return self.errors / self.queries

    @property
    def precision(self) -> float:
        return 1.0 - self.errors / self.hits if self.hits else 1.0

    def metrics(self) -> dict[str, float]:
        return {"hit_rate": self.hit_rate, "error_rate": self.error_rate, "hit_precision": self.precision,
                "model_calls": float(self.queries - self.hits), "cache_entries": float(self.entries),
                "queries": float(self.queries)}


def replay(stream: Stream, policy: Policy, seed: int = 0, block: int = 256) -> Outcome:
    """Exactly the sequential protocol (``SemanticCache.lookup`` per query), with the neighbour
    search batched: a block of queries is compared with the entries cached before the block in one
    matrix product, and each query of the block also with the entries the block itself inserted."""
    labels = stream.labels
    vecs = stream.vectors
    cache = SemanticCache(vecs.shape[1], policy, model=lambda i: int(labels[i]),
                          judge=lambda cached, fresh: cached == fresh, seed=seed)
    hits = errors = 0
    for b0 in range(0, len(labels), block):
        qs = vecs[b0:b0 + block]
        n0 = cache.index.size
        if n0:
            sims = qs @ cache.index._buf[:n0].T
            best = sims.argmax(1)
            best_s = sims[np.arange(len(qs)), best]
        for j in range(len(qs)):
            i, s = (int(best[j]), float(best_s[j])) if n0 else (-1, -np.inf)
            n1 = cache.index.size
            if n1 > n0:
                extra = cache.index._buf[n0:n1] @ qs[j]
                k = int(extra.argmax())
                if extra[k] > s:
                    i, s = n0 + k, float(extra[k])
            response, hit, _ = cache.resolve(b0 + j, qs[j], i, s)
            if hit:
                hits += 1
                errors += int(response != labels[b0 + j])
    return Outcome(hits, errors, len(labels), len(cache.entries), getattr(policy, "fits", 0))


def static_sweep(stream: Stream, thresholds: np.ndarray) -> list[tuple[float, Outcome]]:
    return [(float(t), replay(stream, StaticThreshold(float(t)))) for t in thresholds]


def best_static(sweep: list[tuple[float, Outcome]], delta: float) -> tuple[float, Outcome]:
    """The threshold chosen in hindsight: the highest hit rate whose error rate is at most delta
    (ties: the lower error). The sweep must include a threshold strict enough to meet delta."""
    ok = [(t, o) for t, o in sweep if o.error_rate <= delta]
    if not ok:
        raise ValueError(f"no threshold in the sweep meets delta={delta}; extend it towards 1")
    return max(ok, key=lambda to: (to[1].hit_rate, -to[1].error_rate))


def static_at_hit_rate(sweep: list[tuple[float, Outcome]], hit_rate: float) -> tuple[float, Outcome]:
    """The strictest threshold whose hit rate still reaches ``hit_rate`` (the static cache that
    serves as many hits as the technique), or the most permissive one if none does."""
    ok = [(t, o) for t, o in sweep if o.hit_rate >= hit_rate]
    if not ok:
        return min(sweep, key=lambda to: to[0])
    return max(ok, key=lambda to: to[0])
