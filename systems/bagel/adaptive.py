"""GAR, graph-based adaptive re-ranking (MacAvaney, Tonellotto and Macdonald, "Adaptive Re-Ranking with a
Corpus Graph", CIKM 2022): the deployable baseline that, like BAGEL, may score passages beyond the
retriever's top-B, but follows a corpus graph instead of a model of the scores.

The corpus graph links every passage to its ``k`` nearest neighbours in the embedding space (the paper's
dense "TCT" graph; built once per corpus, before any query). Scoring proceeds in batches of ``batch``
passages, alternating between the next unscored passages of the initial (dense) ranking and the top of the
frontier: the unscored graph neighbours of the passages scored so far, each prioritized by the best score
among the scored passages that link to it. When the frontier is empty the batch comes from the initial
ranking. The budget counts scorer calls, as for every method here. The final ranking lists the scored
passages by score, then backfills every other passage in the initial ranking's order. Pure numpy.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .gp import sqdist


def corpus_graph(X: np.ndarray, k: int, chunk: int = 512) -> np.ndarray:
    """[N, k]: the ``k`` nearest other passages of every passage (Euclidean, the cosine order on unit
    vectors), nearest first."""
    n = len(X)
    k = min(k, n - 1)
    out = np.empty((n, k), np.int64)
    for a in range(0, n, chunk):
        d = sqdist(X[a:a + chunk], X)
        d[np.arange(len(d)), np.arange(a, a + len(d))] = np.inf
        part = np.argpartition(d, k, axis=1)[:, :k]
        rows = np.take_along_axis(d, part, 1)
        out[a:a + len(d)] = np.take_along_axis(part, np.argsort(rows, axis=1, kind="stable"), 1)
    return out


def gar(order: np.ndarray, scorer: Callable[[int], float], budgets: Sequence[int], graph: np.ndarray,
        batch: int) -> tuple[dict[int, np.ndarray], list[int]]:
    """Run GAR to max(budgets) scorer calls; returns ({budget: final ranking}, scored passages in call order).
    The ranking at budget b uses only the first b calls (GAR's batches never depend on the budget, so the
    first b calls of the longest run are the calls GAR makes with budget b)."""
    budgets = sorted(set(int(b) for b in budgets))
    B = min(budgets[-1], len(order))
    if batch < 1:
        raise ValueError("batch must be >= 1")
    scores: dict[int, float] = {}
    calls: list[int] = []
    frontier: dict[int, float] = {}       # passage -> priority (best score of a scored neighbour)
    ptr, from_frontier = 0, False
    while len(calls) < B:
        room = min(batch, B - len(calls))
        if from_frontier and frontier:
            # the highest-priority frontier passages (ties: the one added first)
            take = sorted(frontier, key=lambda i: -frontier[i])[:room]
        else:
            take = []
            while len(take) < room and ptr < len(order):
                i = int(order[ptr])
                ptr += 1
                if i not in scores:
                    take.append(i)
        for i in take:
            scores[i] = float(scorer(i))
            calls.append(i)
            frontier.pop(i, None)
        for i in take:
            s = scores[i]
            for j in graph[i].tolist():
                if j not in scores and frontier.get(j, -np.inf) < s:
                    frontier[j] = s
        from_frontier = not from_frontier
    rankings = {}
    for b in budgets:
        first = calls[:b]
        ys = np.array([scores[i] for i in first])
        head = np.asarray(first, np.int64)[np.argsort(-ys, kind="stable")]
        rest = order[~np.isin(order, head)]
        rankings[b] = np.concatenate([head, rest])
    return rankings, calls
