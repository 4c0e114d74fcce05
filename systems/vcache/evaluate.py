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

from .cache import GlobalVerifiedPolicy, Policy, SemanticCache, StaticThreshold, VerifiedPolicy
from .workload import Stream


@dataclass
class Outcome:
    hits: int
    errors: int
    queries: int
    entries: int
    fits: int = 0
    warm: int = 0      # per-entry vCache: queries whose nearest entry had finished its warm-up (tau* decided)
    tail_hits: int = 0     # hits and errors over the stream's last quarter (TAIL_SHARE of the queries)
    tail_errors: int = 0
    tail_queries: int = 0

    @property
    def warm_share(self) -> float:
        return self.warm / self.queries

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
        out = {"hit_rate": self.hit_rate, "error_rate": self.error_rate, "hit_precision": self.precision,
               "model_calls": float(self.queries - self.hits), "cache_entries": float(self.entries),
               "queries": float(self.queries)}
        if self.tail_queries:
            out |= {"tail_hit_rate": self.tail_hits / self.tail_queries,
                    "tail_error_rate": self.tail_errors / self.tail_queries}
        return out


TAIL_SHARE = 0.25   # the stream's last quarter: where the cache is warmest (how far the stream let it get)


def tail_start(n: int) -> int:
    """The first query of the stream's last TAIL_SHARE."""
    return n - int(round(TAIL_SHARE * n))


def replay(stream: Stream, policy: Policy, seed: int = 0, block: int = 256) -> Outcome:
    """Exactly the sequential protocol (``SemanticCache.lookup`` per query), with the neighbour
    search batched: a block of queries is compared with the entries cached before the block in one
    matrix product, and each query of the block also with the entries the block itself inserted."""
    labels = stream.labels
    vecs = stream.vectors
    cache = SemanticCache(vecs.shape[1], policy, model=lambda i: int(labels[i]),
                          judge=lambda cached, fresh: cached == fresh, seed=seed)
    hits = errors = warm = tail_hits = tail_errors = 0
    tail_from = tail_start(len(labels))
    # per-entry vCache: count the lookups whose neighbour had finished its warm-up (the bound decided them)
    per_entry = isinstance(policy, VerifiedPolicy) and not isinstance(policy, GlobalVerifiedPolicy)
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
            if per_entry and i >= 0 and policy.n_obs(cache.entries[i]) >= policy.min_obs:
                warm += 1
            response, hit, _ = cache.resolve(b0 + j, qs[j], i, s)
            if hit:
                wrong = int(response != labels[b0 + j])
                hits += 1
                errors += wrong
                if b0 + j >= tail_from:
                    tail_hits += 1
                    tail_errors += wrong
    return Outcome(hits, errors, len(labels), len(cache.entries), getattr(policy, "fits", 0), warm,
                   tail_hits, tail_errors, len(labels) - tail_from)


# Static thresholds share one causal neighbour list per stream: each query's NEIGHBOURS nearest earlier
# prompts (cosine, float32, ties to the earlier prompt), so a sweep costs one causal similarity pass
# instead of one search of the growing cache per threshold.
NEIGHBOURS = 128


@dataclass
class Neighbours:
    """For query j: ``idx[j, :count[j]]``, the earlier queries nearest to it with similarity at least
    ``floor`` (similarity descending, ties: the earlier query first), and their similarities ``sim``.
    ``full[j]``: more earlier queries than the ``k`` listed reach ``floor``."""
    idx: np.ndarray    # int32 [n, k]
    sim: np.ndarray    # float32 [n, k]
    count: np.ndarray  # int [n]
    full: np.ndarray   # bool [n]
    floor: float


def causal_neighbours(vectors: np.ndarray, k: int = NEIGHBOURS, floor: float = -np.inf,
                      block: int = 256) -> Neighbours:
    """Every query's ``k`` nearest earlier queries with similarity at least ``floor``, exact (blocked
    float32 matrix products, the similarities ``replay`` computes)."""
    n = len(vectors)
    idx = np.zeros((n, k), np.int32)
    sim = np.full((n, k), -np.inf, np.float32)
    count = np.zeros(n, np.int64)
    full = np.zeros(n, bool)
    for b0 in range(0, n, block):
        b1 = min(n, b0 + block)
        s = vectors[b0:b1] @ vectors[:b1].T                       # [rows, b1]: row r is query b0 + r
        s[:, b0:][np.triu_indices(b1 - b0)] = -np.inf              # only earlier queries
        rows, cols = np.nonzero(s >= floor)
        vals = s[rows, cols]
        order = np.lexsort((cols, -vals, rows))                    # per row: similarity descending, earlier first
        rows, cols, vals = rows[order], cols[order], vals[order]
        per_row = np.bincount(rows, minlength=b1 - b0)
        rank = np.arange(len(rows)) - np.repeat(np.cumsum(per_row) - per_row, per_row)
        keep = rank < k
        idx[b0 + rows[keep], rank[keep]] = cols[keep]
        sim[b0 + rows[keep], rank[keep]] = vals[keep]
        count[b0:b1] = np.minimum(per_row, k)
        full[b0:b1] = per_row > k
    return Neighbours(idx, sim, count, full, float(floor))


def static_outcomes(stream: Stream, thresholds, neighbours: Neighbours | None = None) -> list[Outcome]:
    """``replay(stream, StaticThreshold(t))`` for every ``t`` at once. A static cache holds exactly the
    prompts that missed, so query j's nearest cached entry is its nearest earlier query that missed:
    the first such in its neighbour list, when its similarity reaches t. Where every listed neighbour
    reaches t and none missed, an unlisted one may still be the nearest: that query is searched
    against the whole cache, as ``replay`` does. Equal to ``replay`` (a unit test checks)."""
    vecs, labels = stream.vectors, stream.labels
    n = len(labels)
    ts = np.asarray([float(t) for t in thresholds], np.float64)
    nt = len(ts)
    nb = neighbours if neighbours is not None else causal_neighbours(vecs, floor=float(ts.min()) if nt else 0.0)
    if nt and ts.min() < nb.floor:
        raise ValueError(f"threshold {ts.min():g} lies below the neighbour lists' floor {nb.floor:g}")
    missed = np.zeros((n, nt), bool)            # missed[k, i]: query k missed (is cached) at threshold i
    hits = np.zeros(nt, np.int64)
    errors = np.zeros(nt, np.int64)
    tail_from = tail_start(n)
    tail_hits = tail_errors = None
    cols = np.arange(nt)
    cache = np.zeros((nt, n), np.int32)         # per threshold: the cached queries, in insertion order
    size = np.zeros(nt, np.int64)
    for j in range(n):
        if j == tail_from:
            tail_hits, tail_errors = hits.copy(), errors.copy()
        c = int(nb.count[j])
        if c == 0:   # no earlier query reaches the floor: a miss at every threshold
            missed[j] = True
            cache[cols, size] = j
            size += 1
            continue
        ids, ss = nb.idx[j, :c], nb.sim[j, :c].astype(np.float64)
        reach = ss[:, None] >= ts[None, :]                 # [c, nt]
        ok = reach & missed[ids]
        first = ok.argmax(0)
        hit = ok[first, cols]
        resp = labels[ids[first]]
        if nb.full[j]:  # earlier queries beyond the list: undecided where all listed reach t and none missed
            undecided = np.flatnonzero(~hit & reach[c - 1])
            if len(undecided):
                every = vecs[:j] @ vecs[j]
                for i in undecided:
                    cached = cache[i, :size[i]]
                    sims = every[cached]
                    a = int(sims.argmax())
                    if float(sims[a]) >= ts[i]:
                        hit[i], resp[i] = True, labels[cached[a]]
        hits += hit
        errors += hit & (resp != labels[j])
        missed[j] = ~hit
        miss = np.flatnonzero(~hit)
        cache[miss, size[miss]] = j
        size[miss] += 1
    if tail_hits is None:   # an empty last quarter
        tail_hits, tail_errors = hits.copy(), errors.copy()
    return [Outcome(int(hits[i]), int(errors[i]), n, int(size[i]), 0, 0, int(hits[i] - tail_hits[i]),
                    int(errors[i] - tail_errors[i]), n - tail_from) for i in range(nt)]


# Below this threshold a static cache hits so often that most neighbour lists hold no missed prompt and
# the whole cache must be searched; the cache is small there, so ``replay`` is the cheaper of the two.
NEIGHBOURS_FROM = 0.9


def static_sweep(stream: Stream, thresholds: np.ndarray,
                 neighbours: Neighbours | None = None) -> list[tuple[float, Outcome]]:
    """Every static threshold of ``thresholds`` replayed on ``stream``: ``replay`` below
    NEIGHBOURS_FROM, ``static_outcomes`` from it (the same outcomes, far cheaper where the cache is large)."""
    ts = [float(t) for t in thresholds]
    high = [t for t in ts if t >= NEIGHBOURS_FROM]
    if high and neighbours is None:
        neighbours = causal_neighbours(stream.vectors, floor=NEIGHBOURS_FROM)
    fast = dict(zip(high, static_outcomes(stream, high, neighbours))) if high else {}
    return [(t, fast[t] if t in fast else replay(stream, StaticThreshold(t))) for t in ts]


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
