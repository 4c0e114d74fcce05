"""COMM-RAND's regime points (contract v4): a point counts only where every policy reached random
batching's target and kept its final accuracy within accuracy_gap_points; otherwise it says who broke what."""
from __future__ import annotations

from mlsys_flows.systems.commrand import Params
from mlsys_flows.systems.commrand.result import build_result, regime_sample


def _res(comm_rand_tta, comm_rand_acc=0.90):
    def policy(tta, acc):
        return {"tta_s": [tta], "cap_s": [3.0], "test_acc": acc}
    return {"target": 0.85, "random": policy(1.0, 0.91), "community": policy(0.8, 0.90),
            "comm_rand": policy(comm_rand_tta, comm_rand_acc)}


def test_a_point_where_every_policy_met_the_target_at_parity_is_valid():
    pt = regime_sample(Params.for_scale("smoke"), 0.9, _res(0.7))
    assert pt.valid and pt.invalid == "" and pt.samples["comm_rand"] == [0.7]


def test_a_missed_target_or_parity_invalidates_the_point_naming_who():
    p = Params.for_scale("smoke")
    missed = regime_sample(p, 0.5, _res(None))
    assert not missed.valid and "comm_rand did not reach the target 0.8500" in missed.invalid
    worse = regime_sample(p, 0.5, _res(0.7, comm_rand_acc=0.91 - (p.accuracy_gap_points + 1) / 100))
    assert not worse.valid and "comm_rand ended" in worse.invalid and "below random's 91.00%" in worse.invalid


def test_build_result_reports_the_four_policies_the_rates_and_the_regime():
    """The whole pure pipeline on a tiny graph: the ablation is a variant with its own samples, each policy's
    learning rate is reported, the regime's points are at the swept community sizes, the headline's value is
    community_batches, and the notes say how often validation ran."""
    import pytest

    pytest.importorskip("torch")
    from mlsys_flows.systems.commrand import POLICIES, SPEC
    from mlsys_flows.systems.commrand.train import compare, sweep_community_batches
    from mlsys_flows.systems.common.report import build_report
    from mlsys_flows.systems.common.runreport import Environment

    p = Params.for_scale("smoke", nodes=1_500, regime_nodes=1_000, epochs=2, repeats=2, feature_dim=16, hidden=8,
                         batch_size=64)
    g = p.make_graph()
    lrs = {"random": 0.01, "community": 0.02, "comm_rand": 0.01}
    r = compare(g, **p.train_kwargs(lrs))
    sweep = sweep_community_batches(**p.regime_kwargs(lrs))
    info = {"key": "k", "nodes": g.nodes, "edges": g.edges, "communities": g.communities, "homophily": g.homophily(),
            "train": len(g.train), "val": len(g.val), "test": len(g.test), "feature_bytes": int(g.features.nbytes),
            "row_bytes": int(g.features.shape[1] * g.features.itemsize)}
    res = build_result(p, info, r, sweep, {"lrs": {v: r[v]["lr"] for v in POLICIES}, "scores": {}})
    assert set(res.variants) == set(POLICIES) and SPEC.mechanism.ablation in res.samples
    assert res.variants["community"]["learning_rate"] == 0.02 and res.variants["comm_fixed"]["learning_rate"] == 0.01
    assert [pt.value for pt in res.regime] == sorted(p.regime_community_batches)
    assert res.regime_headline_value == p.community_batches
    assert all(len(pt.samples["comm_rand"]) == p.regime_repeats for pt in res.regime)
    assert any(f"Validation runs {p.evals_per_epoch} times per epoch" in n for n in res.notes)
    assert any("no calibration ran" in n for n in res.notes)
    env = Environment(device="cpu", cores=2, platform="x", versions={}, git_sha="a", git_dirty=False, code_hash="c")
    rep = build_report(SPEC, params=p.model_dump(mode="json"), result=res, run_id="r", environment=env, wall_time_s=1.0)
    d = rep.model_dump(mode="json")
    assert d["headline"]["mechanism"]["baseline"] == "comm_fixed"
    assert d["headline"]["vs_strongest"]["baseline"] in ("random", "community")
    assert d["regime"]["parameter"] == "community_batches" and len(d["regime"]["points"]) == 2
    assert {c["provenance"] for c in d["components"]} == {"learned", "packaged", "scripted"}


def _fake_policy(tta, cap, lr=0.01, acc=0.9):
    stats = {s: 1.0 for s in ("unique_nodes_per_batch", "feature_pages_per_batch", "feature_rows_per_epoch",
                              "communities_per_batch", "sampled_per_batch", "batches_per_epoch")}
    return {"test_acc": acc, "val_acc": [0.5, 0.9], "val_epochs": [0.5, 1.0], "val_s": [0.1, 0.2], "lr": lr,
            "stats": stats, "epoch_s": [c / 8 for c in cap], "tta_s": tta, "cap_s": cap,
            "epochs_to_target": [None if t is None else 1.0 for t in tta]}


def test_a_baseline_that_never_reached_the_target_is_not_the_strongest():
    """Equal held-out quality (the spec's constraint on reached_target): pure community order stops fast but never
    reaches the target with any seed, so it is left out of vs_strongest; against random, COMM-RAND's pairs count."""
    from mlsys_flows.systems.commrand import SPEC
    from mlsys_flows.systems.common.report import build_report
    from mlsys_flows.systems.common.runreport import Environment

    p = Params.for_scale("smoke", repeats=6)
    r = {"target": 0.8, "random": _fake_policy([4.0] * 6, [8.0] * 6),
         "community": _fake_policy([None] * 6, [1.0] * 6), "comm_rand": _fake_policy([2.0] * 6, [6.0] * 6),
         "comm_fixed": _fake_policy([3.0] * 6, [6.0] * 6)}
    sweep = {x: {"target": 0.8, **{v: _fake_policy(r[v]["tta_s"][:1], r[v]["cap_s"][:1]) for v in r if v != "target"}}
             for x in p.regime_community_batches}
    info = {"key": "k", "nodes": 10, "edges": 10, "communities": 2, "homophily": 0.9, "train": 6, "val": 2,
            "test": 2, "feature_bytes": 100, "row_bytes": 10}
    res = build_result(p, info, r, sweep)
    env = Environment(device="cpu", cores=2, platform="x", versions={}, git_sha="a", git_dirty=False, code_hash="c")
    d = build_report(SPEC, params=p.model_dump(mode="json"), result=res, run_id="r", environment=env,
                     wall_time_s=1.0).model_dump(mode="json")
    assert d["constraint"]["metric"] == "reached_target" and d["constraint"]["excluded"] == ["community"]
    assert d["headline"]["vs_strongest"]["baseline"] == "random"
    assert d["headline"]["mechanism"]["baseline"] == "comm_fixed" and d["headline"]["mechanism"]["ratio"] == 1.5
    assert not any(pt["valid"] for pt in d["regime"]["points"])   # community missed the target at every point
