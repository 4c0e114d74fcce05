"""What one bagel run evaluates, built once per workload: the corpus (embedded once), the evaluated
queries of every trial, the regime's queries at each relevant-passages-per-cluster point, and the
calibration queries (disjoint from every evaluated query) on which BAGEL's UCB factor and GAR's batch and
graph size are tuned. Then one part of it evaluated with the tuned values. Pure: no prefect/dask."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .evaluate import calibrate, evaluate_queries

CALIBRATION_SEED = 7919   # offset of the calibration queries' seed from the run's seed


def _views(p, kind: str, embed):
    """(X_all, texts_all or None, labels or None, view(per) -> (idx, X, queries_of(n, seed))); labels: the
    minilm corpus' {'city', 'aspect'} of every passage."""
    if kind == "minilm":
        from .text import make_corpus, text_queries

        per_max = max([p.per_cluster, *p.regime_per_cluster])
        corpus = make_corpus(p.cities, per_max, p.seed)
        X_all = np.asarray(embed(corpus.texts), np.float64)

        def view(per):
            idx = np.flatnonzero(corpus.slot < per)
            sub, X = corpus.subset(idx), X_all[idx]
            return idx, X, lambda n, seed: text_queries(sub, X, n, p.far_quantile, p.same_city, p.same_aspect, seed)
        return X_all, corpus.texts, {"city": corpus.city, "aspect": corpus.aspect}, view
    from .workload import digits_embeddings, make_queries

    X_all, labels = digits_embeddings(p.dim, p.normalize)
    idx = np.arange(len(X_all))

    def view(per):
        return idx, X_all, lambda n, seed: [(q, None) for q in make_queries(
            X_all, labels, n, per, p.query_noise, p.far_quantile, p.relevance_width, seed)]
    return X_all, None, None, view


def query_key(labels: dict, idx: np.ndarray, q) -> tuple[int, frozenset]:
    """A minilm query's (city, unordered aspect pair): two queries with the same key have the same relevant
    passages (the city's passages on both aspects), whichever aspect their long question asks about."""
    return int(labels["city"][idx[q.near[0]]]), frozenset(int(a) for a in q.classes)


def build(p, kind: str, embed: Callable | None = None) -> dict:
    """{'kind', 'X_all', 'texts_all', 'labels' (minilm: every passage's 'city' and 'aspect'; digits: None),
    'parts': {name: {'idx', 'queries', 'query_texts'}}} with parts
    'trial0'.., 'regime5'.. and 'calibration'; plus trial 0's view as 'X', 'queries', 'texts',
    'query_texts'. ``embed(texts) -> [n, dim]``: the text embedder (minilm only; every distinct query
    text is embedded once)."""
    if kind == "minilm" and embed is None:
        raise ValueError("the minilm workload needs the text embedder")
    X_all, texts_all, labels, view = _views(p, kind, embed)
    parts = {}
    idx, X, draw = view(p.per_cluster)
    for t in range(p.trials):
        parts[f"trial{t}"] = (idx, draw(p.queries, p.seed + t))
    for c in p.regime_per_cluster:
        ic, _, dc = view(c)
        parts[f"regime{c}"] = (ic, dc(p.regime_queries, p.seed))
    # calibration: fresh draws with their own seed, none with the relevant set of an evaluated query (on
    # minilm the same city and unordered aspect pair, whatever the text; on digits the same embedding), no
    # repeats among themselves
    taken = {query_key(labels, i, q) for i, pairs in parts.values() for q, _ in pairs} if labels else set()
    vecs = [q.q for _, pairs in parts.values() for q, t in pairs if t is None]
    cal, seen = [], set()
    for q, t in draw(4 * p.calibration_queries + 64, p.seed + CALIBRATION_SEED):
        if len(cal) == p.calibration_queries:
            break
        key = query_key(labels, idx, q) if labels else None
        if labels and (key in taken or key in seen):
            continue
        if t is None and any(np.array_equal(q.q, v) for v in vecs):
            continue
        seen.add(key)
        cal.append((q, t))
    if not cal:
        raise ValueError("no calibration query left that differs from the evaluated ones")
    parts["calibration"] = (idx, cal)
    if kind == "minilm":
        distinct = sorted({t for _, pairs in parts.values() for _, t in pairs})
        E = dict(zip(distinct, np.asarray(embed(distinct), np.float64)))
        for _, pairs in parts.values():
            for q, t in pairs:
                q.q = E[t]
    out = {"kind": kind, "X_all": X_all, "texts_all": texts_all, "labels": labels,
           "parts": {name: {"idx": i, "queries": [q for q, _ in pairs], "query_texts": [t for _, t in pairs]}
                     for name, (i, pairs) in parts.items()}}
    first = out["parts"]["trial0"]
    out.update(X=X_all[first["idx"]], queries=first["queries"], query_texts=first["query_texts"],
               texts=None if texts_all is None else [texts_all[i] for i in first["idx"]])
    return out


def part_view(data: dict, part: str) -> tuple[np.ndarray, list, list, list | None]:
    """(X, queries, query texts, passage texts or None) of one part."""
    pt = data["parts"][part]
    texts = None if data["texts_all"] is None else [data["texts_all"][i] for i in pt["idx"]]
    return data["X_all"][pt["idx"]], pt["queries"], pt["query_texts"], texts


def tune(p, data: dict) -> dict:
    """BAGEL's UCB factor (``beta_scale``, or the best of ``beta_grid``) and GAR's (batch, neighbours) from the
    calibration queries, with the offline oracle as the scorer."""
    X, queries, _, _ = part_view(data, "calibration")
    grid = [p.beta_scale] if p.beta_scale is not None else p.beta_grid
    out = calibrate(X, queries, p.budget, p.config(grid[0]), p.score_noise, grid, p.gar_batches, p.gar_neighbours,
                    p.top_k)
    out["fixed"] = p.beta_scale is not None
    out["workload"] = workload_stats(p, data)
    return out


def graph_edge_shares(X: np.ndarray, city: np.ndarray, aspect: np.ndarray, ks) -> dict[int, dict[str, float]]:
    """For GAR's corpus graph with each k of ``ks`` nearest neighbours: the share of its edges that link a
    passage to one of the same (city, aspect) pair ('same_pair'), to the same city under another aspect
    ('same_city': the link a query's far aspect needs), to another city under the same aspect
    ('same_aspect'), or to neither ('other')."""
    from .adaptive import corpus_graph

    g = corpus_graph(X, max(ks))
    out = {}
    for k in sorted(ks):
        src, dst = np.repeat(np.arange(len(X)), k), g[:, :k].ravel()
        sc, sa = city[src] == city[dst], aspect[src] == aspect[dst]
        out[int(k)] = {"same_pair": float(np.mean(sc & sa)), "same_city": float(np.mean(sc & ~sa)),
                       "same_aspect": float(np.mean(~sc & sa)), "other": float(np.mean(~sc & ~sa))}
    return out


def workload_stats(p, data: dict) -> dict:
    """The minilm headline's corpus graph edge shares (``graph_edge_shares`` at every ``gar_neighbours``) and
    how many of the evaluated queries are distinct (by text, and by city and unordered aspect pair: the
    trials share one corpus and may draw the same query); {} on digits."""
    labels = data.get("labels")
    if not labels:
        return {}
    first = data["parts"]["trial0"]
    idx = first["idx"]
    trials = [data["parts"][f"trial{t}"] for t in range(p.trials)]
    texts = [t for pt in trials for t in pt["query_texts"]]
    keys = {query_key(labels, pt["idx"], q) for pt in trials for q in pt["queries"]}
    return {"edges": graph_edge_shares(data["X_all"][idx], labels["city"][idx], labels["aspect"][idx],
                                       p.gar_neighbours),
            "queries": len(texts), "distinct_texts": len(set(texts)), "distinct_sets": len(keys)}


def same_city_queries(p, data: dict, value: float, n: int) -> tuple[np.ndarray, list]:
    """(X, queries): the first ``n`` queries of trial 0 with the oracle's grade of the query's city under the
    aspects it does not ask about set to ``value`` (the relevant set and every other grade unchanged): the
    bridge between a query's two aspects, re-graded without re-embedding anything (minilm only)."""
    from dataclasses import replace

    labels = data.get("labels")
    if not labels:
        raise ValueError("same_city applies to the minilm workload only")
    X, queries, _, _ = part_view(data, "trial0")
    idx = data["parts"]["trial0"]["idx"]
    city = labels["city"][idx]
    out = []
    for q in queries[:n]:
        rel = q.relevance.copy()
        bridge = city == city[q.near[0]]
        bridge[q.relevant] = False
        rel[bridge] = value
        out.append(replace(q, relevance=rel))
    return X, out


def evaluate_same_city(p, data: dict, tuned: dict, value: float, n: int) -> dict:
    """Rerank, GAR, BAGEL and bagel_exploit at the headline budget on ``same_city_queries`` (the values tuned
    with the run's own same_city)."""
    X, queries = same_city_queries(p, data, value, n)
    return evaluate_queries(X, queries, [p.budget], p.config(tuned["beta_scale"]), p.score_noise, p.top_k, None,
                            exploit=True, gar=tuple(tuned["gar"]))


def evaluate_part(p, data: dict, tuned: dict, part: str, start: int = 0, stop: int | None = None,
                  make_scorer=None, claim: bool = False, budgets=None, explore: bool = True) -> dict:
    """Every method on queries[start:stop] of ``part`` with the tuned values. ``claim``: the second
    workload's claim (dense, rerank, GAR and BAGEL only); ``explore``: False skips bagel_explore."""
    X, queries, _, _ = part_view(data, part)
    return evaluate_queries(X, queries[start:stop], budgets or p.budgets(), p.config(tuned["beta_scale"]),
                            p.score_noise, p.top_k, None if claim or not explore else explore_factor(p, tuned),
                            make_scorer=make_scorer, exploit=not claim, gar=tuple(tuned["gar"]))


def explore_factor(p, tuned: dict) -> float:
    """bagel_explore's UCB factor: the parameter, or twice the tuned one."""
    return p.explore_beta_scale if p.explore_beta_scale is not None else 2.0 * tuned["beta_scale"]
