"""Run every method on a list of queries and collect per-query recall at each budget."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .adaptive import corpus_graph, gar as gar_run
from .gp import BagelConfig, bagel, dense_rank, lengthscale_grid, recall_at_k, rerank_top_b
from .workload import Query, noisy_oracle

METHODS = ("dense", "rerank", "gar", "bagel", "bagel_explore", "bagel_exploit")


def evaluate_queries(X: np.ndarray, queries: Sequence[Query], budgets: Sequence[int], cfg: BagelConfig,
                     score_noise: float, top_k: int | None = None, explore_beta_scale: float | None = None,
                     make_scorer: Callable[[int, Query], Callable[[int], float]] | None = None,
                     exploit: bool = False, gar: tuple[int, int] | None = None,
                     graph: np.ndarray | None = None, bagel_variants: bool = True) -> dict:
    """{'recall': {method: {budget: [per-query]}}, 'far_recall': same, 'calls': {method: {budget: [..]}},
    'lengthscale': [final fitted length scale per query]}. Each method gets a fresh scorer per run
    and may call it at most ``budget`` times (checked). ``explore_beta_scale``: also run BAGEL with this
    UCB weight as ``bagel_explore`` (None: skip it). ``exploit``: also run BAGEL with no exploration term
    (UCB weight 0: the GP posterior mean alone picks) as ``bagel_exploit``. ``make_scorer(j, query)``: a fresh scorer (with a
    ``calls`` counter) for the j-th query; None: the noisy label oracle. Scorers that keep ``flags``
    (per call: did the score fail?) add 'failed': {method: {budget: [failed scores among its calls]}}.
    ``gar``: also run graph-based adaptive re-ranking (GAR) with (batch, graph neighbours) as ``gar`` on the
    corpus graph ``graph`` (None: built here with that many neighbours). ``bagel_variants``: False runs
    no BAGEL at all (the baselines alone)."""
    if make_scorer is None:
        def make_scorer(j: int, q: Query):
            return noisy_oracle(q, score_noise)
    budgets = sorted(set(int(b) for b in budgets))
    if cfg.lengthscales is None:
        cfg = BagelConfig(**{**cfg.__dict__, "lengthscales": lengthscale_grid(X)})
    bagels = {"bagel": cfg} if bagel_variants else {}
    if explore_beta_scale is not None and bagel_variants:
        bagels["bagel_explore"] = BagelConfig(**{**cfg.__dict__, "beta_scale": explore_beta_scale})
    if exploit and bagel_variants:
        bagels["bagel_exploit"] = BagelConfig(**{**cfg.__dict__, "beta_scale": 0.0})
    if gar is not None and (graph is None or graph.shape[1] < gar[1]):
        graph = corpus_graph(X, gar[1])
    methods = [m for m in METHODS if m in ("dense", "rerank") or m in bagels or (m == "gar" and gar is not None)]
    rec = {m: {b: [] for b in budgets} for m in methods}
    far = {m: {b: [] for b in budgets} for m in methods}
    calls = {m: {b: [] for b in budgets} for m in methods if m != "dense"}
    failed = {m: {b: [] for b in budgets} for m in calls}
    flagged = False
    ls = []
    for j, q in enumerate(queries):
        k = top_k or len(q.relevant)
        far_ids = np.setdiff1d(q.relevant, q.near)
        order = dense_rank(X, q.q)
        rankings = {"dense": {b: order for b in budgets}, "rerank": {}}
        for b in budgets:
            sc = make_scorer(j, q)
            rankings["rerank"][b] = rerank_top_b(order, sc, b)
            calls["rerank"][b].append(sc.calls)
            failed["rerank"][b].append(sum(getattr(sc, "flags", ())))
            flagged |= hasattr(sc, "flags")
        if gar is not None:
            sc = make_scorer(j, q)
            rankings["gar"], gcalls = gar_run(order, sc, budgets, graph[:, :gar[1]], gar[0])
            for b in budgets:
                calls["gar"][b].append(len(gcalls[:b]))
                failed["gar"][b].append(sum(getattr(sc, "flags", ())[:b]))
            if sc.calls > budgets[-1]:
                raise RuntimeError(f"GAR called the scorer {sc.calls} times, budget {budgets[-1]}")
        for name, c in bagels.items():
            sc = make_scorer(j, q)
            tr = bagel(X, order, sc, budgets, c)
            rankings[name] = tr.rankings
            for b in budgets:
                calls[name][b].append(len(tr.scored[:b]))
                failed[name][b].append(sum(getattr(sc, "flags", ())[:b]))
            if sc.calls > budgets[-1]:
                raise RuntimeError(f"BAGEL called the scorer {sc.calls} times, budget {budgets[-1]}")
            if name == "bagel":
                ls.append(tr.lengthscales[-1])
        if not bagels:
            ls.append(float("nan"))
        for m in methods:
            for b in budgets:
                rec[m][b].append(recall_at_k(rankings[m][b], q.relevant, k))
                far[m][b].append(recall_at_k(rankings[m][b], far_ids, k) if len(far_ids) else 0.0)
    out = {"recall": rec, "far_recall": far, "calls": calls, "lengthscale": ls,
           "outside_top_b": {b: [outside_top_b(X, q, b) for q in queries] for b in budgets}}
    if flagged:
        out["failed"] = failed
    return out


def outside_top_b(X: np.ndarray, q: Query, budget: int) -> float:
    """Share of the query's relevant passages outside the dense retriever's top-``budget``: what no
    reranking of that top-B can reach."""
    top = set(dense_rank(X, q.q)[:budget].tolist())
    return float(np.mean([i not in top for i in q.relevant.tolist()]))


def merge(parts: Sequence[dict]) -> dict:
    """Concatenate the per-query lists of several evaluate_queries results (query chunks)."""
    out = {"recall": {}, "far_recall": {}, "calls": {}, "lengthscale": [], "outside_top_b": {}}
    for p in parts:
        for b, xs in p.get("outside_top_b", {}).items():
            out["outside_top_b"].setdefault(int(b), []).extend(xs)
        for key in ("recall", "far_recall", "calls", "failed"):
            for m, per_b in p.get(key, {}).items():
                for b, xs in per_b.items():
                    out.setdefault(key, {}).setdefault(m, {}).setdefault(int(b), []).extend(xs)
        out["lengthscale"].extend(p["lengthscale"])
        if "llm" in p:   # the LLM judge's request counts, summed over chunks
            llm = out.setdefault("llm", {"requests": 0, "failed": 0, "failures": []})
            llm["requests"] += p["llm"]["requests"]
            llm["failed"] += p["llm"]["failed"]
            llm["failures"] += p["llm"]["failures"]
    return out


def summarize(res: dict, budget: int) -> dict[str, dict[str, float]]:
    """Variants at the headline budget: mean recall@k, mean far-cluster recall, spread over queries (and,
    with an LLM scorer, the mean number of failed scores per query among each method's calls)."""
    out = {}
    for m in (m for m in METHODS if m in res["recall"]):
        r = np.asarray(res["recall"][m][budget])
        f = np.asarray(res["far_recall"][m][budget])
        out[m] = {"recall_at_k": float(r.mean()), "far_recall_at_k": float(f.mean()),
                  "recall_p10": float(np.quantile(r, 0.1)), "recall_p90": float(np.quantile(r, 0.9)),
                  "queries": float(len(r)),
                  "scorer_calls": float(np.mean(res["calls"][m][budget])) if m in res["calls"] else 0.0}
        if "failed" in res:
            out[m]["failed_scores"] = float(np.mean(res["failed"][m][budget])) if m in res["failed"] else 0.0
    return out


def calibrate(X: np.ndarray, queries: Sequence[Query], budget: int, cfg: BagelConfig, score_noise: float,
              beta_grid: Sequence[float], gar_batches: Sequence[int], gar_neighbours: Sequence[int],
              top_k: int | None = None) -> dict:
    """Tune BAGEL's UCB factor and GAR's (batch, neighbours) on calibration queries (never the evaluated
    ones), each by the largest mean recall@k at the headline ``budget`` with the offline oracle; ties go
    to the first value of the grid. {'beta_scale', 'beta_recall': {value: mean}, 'gar': (batch, k),
    'gar_recall': {(batch, k): mean}, 'queries'}."""
    if not queries:
        raise ValueError("calibration needs at least one query")
    grid = lengthscale_grid(X)
    beta_recall = {}
    for beta in beta_grid:
        c = BagelConfig(**{**cfg.__dict__, "beta_scale": float(beta), "lengthscales": grid})
        rs = []
        for q in queries:
            tr = bagel(X, dense_rank(X, q.q), noisy_oracle(q, score_noise), [budget], c)
            rs.append(recall_at_k(tr.rankings[budget], q.relevant, top_k or len(q.relevant)))
        beta_recall[float(beta)] = float(np.mean(rs))
    graph = corpus_graph(X, max(gar_neighbours))
    gar_recall = {}
    for bs in gar_batches:
        for k in gar_neighbours:
            rs = []
            for q in queries:
                rank, _ = gar_run(dense_rank(X, q.q), noisy_oracle(q, score_noise), [budget], graph[:, :k], bs)
                rs.append(recall_at_k(rank[budget], q.relevant, top_k or len(q.relevant)))
            gar_recall[(int(bs), int(k))] = float(np.mean(rs))
    best_beta = max(beta_recall, key=lambda b: (beta_recall[b], -list(beta_recall).index(b)))
    best_gar = max(gar_recall, key=lambda g: (gar_recall[g], -list(gar_recall).index(g)))
    return {"beta_scale": best_beta, "beta_recall": beta_recall, "gar": best_gar, "gar_recall": gar_recall,
            "queries": len(queries)}
