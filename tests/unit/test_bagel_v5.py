"""BAGEL, the review of issue 47: calibration queries kept apart from the evaluated ones by relevant set
(city and unordered aspect pair), GAR's corpus-graph edge shares, the budget curve's crossover note and the
bridge (same_city) re-graded to 0 by the oracle alone."""
from __future__ import annotations

import zlib

import numpy as np

from mlsys_flows.systems.bagel import Params
from mlsys_flows.systems.bagel.plan import (build, evaluate_same_city, graph_edge_shares, query_key,
                                            same_city_queries, tune)
from mlsys_flows.systems.bagel.result import _budget_note, _bridge_note, _graph_note


def _embed(texts):
    """A fake text embedder (no model): a fixed unit vector per text, the city's and the aspect's words
    pulling it toward shared directions, so aspects and cities form clusters."""
    out = []
    for t in texts:
        v = np.random.default_rng(zlib.crc32(t.encode())).standard_normal(16) * 0.3
        for w in t.replace(",", " ").replace(".", " ").replace("?", " ").split():
            v += 0.2 * np.random.default_rng(zlib.crc32(w.lower().encode())).standard_normal(16)
        out.append(v / np.linalg.norm(v))
    return np.asarray(out)


def _params(**kw):
    base = dict(embedding="minilm", cities=4, per_cluster=3, regime_per_cluster=[2, 3], queries=6, trials=3,
                regime_queries=4, calibration_queries=4)
    return Params.for_scale("smoke", **{**base, **kw})


def test_calibration_queries_share_no_relevant_set_with_an_evaluated_query():
    p = _params()
    d = build(p, "minilm", _embed)
    labels = d["labels"]
    taken = {query_key(labels, pt["idx"], q) for name, pt in d["parts"].items() if name != "calibration"
             for q in pt["queries"]}
    cal = d["parts"]["calibration"]
    keys = [query_key(labels, cal["idx"], q) for q in cal["queries"]]
    assert len(keys) == p.calibration_queries and len(set(keys)) == len(keys) and not set(keys) & taken
    # the key ignores which aspect the long question asks about, and it fixes the relevant set
    for pt in (d["parts"]["trial0"], cal):
        for q in pt["queries"]:
            city, aspects = query_key(labels, pt["idx"], q)
            g = pt["idx"][q.relevant]
            assert set(labels["city"][g]) == {city} and set(labels["aspect"][g]) == aspects


def test_graph_edge_shares_count_each_kind_of_link():
    # passages 0-1: city 0 aspect 0; 2: city 0 aspect 1; 3: city 1 aspect 0; 4: city 1 aspect 1
    X = np.array([[0.0], [0.1], [0.25], [1.0], [3.0]])
    city, aspect = np.array([0, 0, 0, 1, 1]), np.array([0, 0, 1, 0, 1])
    e = graph_edge_shares(X, city, aspect, [1])[1]
    # nearest: 0->1 (pair), 1->0 (pair), 2->1 (same city), 3->2 (neither), 4->3 (same city)
    assert e == {"same_pair": 0.4, "same_city": 0.4, "same_aspect": 0.0, "other": 0.2}
    both = graph_edge_shares(X, city, aspect, [2, 1])
    assert list(both) == [1, 2] and abs(sum(both[2].values()) - 1.0) < 1e-12


def test_same_city_regrades_only_the_bridge_and_the_run_reports_it():
    p = _params(trials=1)
    d = build(p, "minilm", _embed)
    tuned = tune(p, d)
    assert set(tuned["workload"]["edges"]) == set(p.gar_neighbours)
    assert tuned["workload"]["queries"] == p.queries >= tuned["workload"]["distinct_sets"]
    X, qs = same_city_queries(p, d, 0.0, 3)
    orig = d["parts"]["trial0"]["queries"][:3]
    city = d["labels"]["city"][d["parts"]["trial0"]["idx"]]
    for q, o in zip(qs, orig):
        changed = q.relevance != o.relevance
        assert changed.any() and (o.relevance[changed] == p.same_city).all() and (q.relevance[changed] == 0).all()
        assert (city[changed] == city[o.near[0]]).all() and not np.isin(np.flatnonzero(changed), o.relevant).any()
        assert (q.relevant == o.relevant).all()
    res = evaluate_same_city(p, d, tuned, 0.0, 3)
    assert set(res["recall"]) == {"dense", "rerank", "gar", "bagel", "bagel_exploit"}
    assert res["calls"]["bagel"][p.budget] == [p.budget] * 3
    bridge = {"recall": {m: r[p.budget] for m, r in res["recall"].items()},
              "far_recall": {m: r[p.budget] for m, r in res["far_recall"].items()}}
    first = {k: {m: {p.budget: [0.5] * p.queries} for m in ("rerank", "gar", "bagel", "bagel_exploit")}
             for k in ("recall", "far_recall")}
    note = _bridge_note(p, first, bridge)
    assert "first 3 queries of trial 0" in note and "same_city = 0 " in note
    assert "GAR used k = " in _graph_note(tuned) and _graph_note({"gar": (5, 4), "workload": {}}) is None


def test_budget_note_names_the_budgets_below_rerank_and_the_crossover():
    mean = {"bagel": [0.5, 0.55, 0.9, 1.0], "rerank": [0.6, 0.6, 0.65, 0.7], "dense": [0.6, 0.6, 0.6, 0.6],
            "bagel_exploit": [0.45, 0.6, 0.8, 0.9]}
    note = _budget_note([10, 20, 30, 40], mean, 12)
    assert "below rerank at B = 10, 20 and at or above it from B = 30 on" in note
    assert "between B = 20 and 30" in note and "below bagel_exploit (no exploration) at B = 20;" in note
    assert "rerank equals the dense retriever at B = 10, 20 " in note
    assert "at or above rerank at every budget" in _budget_note([10], {"bagel": [1.0], "rerank": [0.5],
                                                                          "dense": [0.4]}, 1)
