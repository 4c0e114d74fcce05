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
    assert set(v) == {"dense", "rerank", "gar", "bagel", "bagel_explore", "bagel_exploit", "digits_dense",
                      "digits_rerank", "digits_gar", "digits_bagel"}
    assert kinds["recall_at_k"] == kinds["far_recall_at_k"] == kinds["scorer_calls"] == "counted"
    budget = report["parameters"]["budget"]
    assert v["rerank"]["scorer_calls"] == v["gar"]["scorer_calls"] == v["bagel"]["scorer_calls"] == \
        v["bagel_explore"]["scorer_calls"] == v["bagel_exploit"]["scorer_calls"] == budget
    assert v["dense"]["scorer_calls"] == 0
    for m in v.values():
        assert 0.0 <= m["recall_p10"] <= m["recall_at_k"] <= m["recall_p90"] <= 1.0
        assert m["queries"] == report["parameters"]["queries"] * report["parameters"]["trials"]
    # the dense retriever never reaches the far cluster; reranking its top-B cannot either
    assert v["dense"]["far_recall_at_k"] == v["rerank"]["far_recall_at_k"] == 0.0
    assert any(k.endswith("workload.pkl") for k in storage.list("runs/bagel/"))
    # contract v3: one sample per trial (3), the exploitation-only ablation, the per-cluster regime
    assert report["roles"] == {"rerank": ["paper", "deployable"], "gar": ["deployable"], "dense": ["deployable"]}
    # smoke runs on digits, so the digits claim is the headline's own run; BAGEL's UCB factor was tuned
    assert v["digits_bagel"] == v["bagel"] and report["parameters"]["beta_scale"] is None
    assert any(n.startswith("Calibration on the headline workload") and "beta_scale = " in n for n in report["notes"])
    assert h["repeats"] == 3 and len(report["samples"]["bagel"]["recall_at_k"]) == 3
    assert h["mechanism"]["baseline"] == "bagel_exploit"
    g = report["regime"]
    assert g["parameter"] == "per_cluster" and [p["value"] for p in g["points"]] == [5.0, 20.0]
    assert all(p["kind"] == "counted" and p["baseline"] in ("rerank", "gar", "dense") for p in g["points"])
    assert g["headline_value"] == report["parameters"]["per_cluster"]
    assert any(n.startswith("Regime: relevant passages per cluster") for n in report["notes"])
    # the budget curve's note (where BAGEL is below rerank); the bridge and graph notes are minilm only
    assert any(n.startswith("Budget curve (mean recall@k over all") for n in report["notes"])
    assert not any(n.startswith(("Bridge re-graded", "GAR's corpus graph")) for n in report["notes"])
