"""The bagel flow at smoke scale (the session's shared reference run): counted recall@k for the dense
retriever, top-B rerank and BAGEL at equal budget, with the per-query spread and the budget curve."""
import math

from faultkit import reference_run


def test_bagel_flow_smoke(prefect_api):
    report, storage = reference_run("bagel")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("recall_at_k", "rerank", "bagel", "counted")
    assert math.isfinite(h["ratio"]) or h["ratio"] == math.inf
    v, kinds = report["variants"], report["metric_kinds"]
    assert set(v) == {"dense", "rerank", "bagel", "bagel_explore"}
    assert kinds["recall_at_k"] == kinds["far_recall_at_k"] == kinds["scorer_calls"] == "counted"
    budget = report["parameters"]["budget"]
    assert v["rerank"]["scorer_calls"] == v["bagel"]["scorer_calls"] == v["bagel_explore"]["scorer_calls"] == budget and v["dense"]["scorer_calls"] == 0
    for m in v.values():
        assert 0.0 <= m["recall_p10"] <= m["recall_at_k"] <= m["recall_p90"] <= 1.0
        assert m["queries"] == report["parameters"]["queries"]
    # the dense retriever never reaches the far cluster; reranking its top-B cannot either
    assert v["dense"]["far_recall_at_k"] == v["rerank"]["far_recall_at_k"] == 0.0
    assert any(k.endswith("workload.pkl") for k in storage.list("runs/bagel/"))
