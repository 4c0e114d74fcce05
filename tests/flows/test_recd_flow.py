"""The RecD flow at smoke scale on Dask: a RunReport with the measured headline, the paper's other
ratios, the arrival-order trainer's loss and the mix sweep; a storage URL that does not exist fails
before any work."""
from __future__ import annotations

import math

import pytest

from faultkit import reference_run

from mlsys_flows.blocks import ObjectStorage, StorageError
from mlsys_flows.flows.recd import recd


def test_recd_smoke_flow():
    """The shared smoke run (faultkit.reference_run), as the contract test sees it."""
    report, storage = reference_run("recd")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["better"]) == ("time_to_target_s", "kjt", "ikjt", "lower")
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0
    assert h["vs_strongest"]["baseline"] in ("kjt", "kjt_clustered")
    assert [(r["metric"], r["baseline"]) for r in report["ratios"]] == [
        ("train_samples_per_s", "kjt"), ("stored_bytes", "kjt"), ("preprocess_batches_per_s", "kjt"),
        ("preprocess_batches_per_s", "kjt_clustered"), ("train_samples_per_s", "kjt_clustered"),
        ("time_to_target_s", "kjt_clustered"), ("heldout_logloss", "kjt"), ("samples_to_target", "kjt")]
    v = report["variants"]
    # issue 45: every trainer's held-out logloss, evaluated on the same held-out set against one declared target
    trainers = ("kjt", "kjt_clustered", "ikjt", "ikjt_arrival")
    assert all(math.isfinite(v[n]["heldout_logloss"]) and 0 < v[n]["heldout_logloss"] < 2 for n in trainers)
    assert len({v[n]["target_logloss"] for n in trainers}) == 1  # the median of the seeds' targets, one per seed
    assert all(set(report["samples"][n]["reached_target"]) <= {0.0, 1.0} for n in trainers)
    assert abs(v["ikjt"]["heldout_logloss"] - v["kjt_clustered"]["heldout_logloss"]) < 1e-3
    assert abs(v["ikjt_arrival"]["heldout_logloss"] - v["kjt"]["heldout_logloss"]) < 1e-3
    # issue 45: paired by seed, one sample per evaluated seed (each its own data and training run)
    seeds = report["parameters"]["eval_seeds"]
    assert seeds >= 2 and all(len(report["samples"][n][m]) == seeds for n in trainers
                              for m in ("time_to_target_s", "train_samples_per_s", "reached_target", "heldout_logloss"))
    assert report["samples"]["kjt"]["target_logloss"][0] != report["samples"]["kjt"]["target_logloss"][1]  # own held-out set
    assert report["headline"]["verdict"]["pairs"] <= seeds
    assert report["constraint"]["metric"] == "reached_target"
    held = next(c for c in report["curves"] if c["title"].startswith("held-out logloss"))
    assert set(held["series"]) == {*trainers, "target", "kjt, mean of 3 (the crossing's curve)",
                                   "ikjt, mean of 3 (the crossing's curve)"}
    assert {"heldout_logloss", "samples_to_target", "reached_target"} <= set(report["deterministic_metrics"])
    assert storage.exists(f"runs/recd/{report['run_id']}/data/heldout.parquet")
    assert v["ikjt"]["stored_bytes"] < v["kjt"]["stored_bytes"]
    assert v["ikjt"]["user_values_per_epoch"] < v["kjt_clustered"]["user_values_per_epoch"] == \
        v["kjt"]["user_values_per_epoch"]
    # same batches, same math: equal loss; arrival order: its own (finite) loss at the same steps
    assert abs(v["ikjt"]["final_loss"] - v["kjt_clustered"]["final_loss"]) < 1e-3
    assert math.isfinite(v["kjt"]["final_loss"])
    kinds = report["metric_kinds"]
    assert kinds["train_samples_per_s"] == kinds["sweep_train_samples_per_s"] == kinds["time_to_target_s"] == "measured"
    assert kinds["final_loss"] == kinds["user_id_share"] == kinds["heldout_logloss"] == "counted"
    assert {"final_loss", "user_id_share"} <= set(report["deterministic_metrics"])
    # the mix sweep: the three trainers' variants per point, each with its samples, and the ratio curve
    shares = report["parameters"]["mix_sweep"]
    assert len(shares) == 2  # smoke; quick sweeps >= 4 (tests/unit/test_recd_mechanism.py)
    for share in shares:
        for n in ("kjt", "kjt_clustered", "ikjt"):
            name = f"{n}@mix{share:g}"
            assert abs(v[name]["user_id_share"] - share) < 0.05
            assert len(report["samples"][name]["sweep_train_samples_per_s"]) == report["parameters"]["repeats"]
    curve = next(c for c in report["curves"] if c["title"] == "training throughput ratio vs lookup mix")
    for series in ("ikjt / kjt (ratio of medians)", "ikjt / kjt_clustered (ratio of medians)"):
        xs, ys = curve["series"][series]
        assert len(xs) == len(shares) and all(math.isfinite(y) and y > 0 for y in ys)
    loss = next(c for c in report["curves"] if c["title"].startswith("training loss"))
    assert set(loss["series"]) == {"kjt", "kjt_clustered", "ikjt", "ikjt_arrival"}
    # contract v3: the mechanism's ablation (the IKJT on arrival-order batches: same batches and math as kjt,
    # fewer repeats to leave out than on clustered batches) and the regime over the duplicated share
    assert report["roles"] == {"kjt": ["paper", "deployable"], "kjt_clustered": ["deployable"]}
    m = h["mechanism"]
    assert m["baseline"] == "ikjt_arrival" and m["kind"] == "measured" and math.isfinite(m["ratio"])
    assert abs(v["ikjt_arrival"]["final_loss"] - v["kjt"]["final_loss"]) < 1e-3
    assert v["ikjt"]["looked_up_ids_per_epoch"] < v["ikjt_arrival"]["looked_up_ids_per_epoch"] <= \
        v["kjt"]["looked_up_ids_per_epoch"]
    g = report["regime"]
    assert g["parameter"] == "duplicated share" and len(g["points"]) == len(shares) == 2
    values = [pt["value"] for pt in g["points"]]
    assert values == sorted(values) and 0 < values[0] < 0.2 < 0.5 < values[1] < 1
    assert [pt["value"] for pt in g["points"]] == [v[f"ikjt@mix{s:g}"]["duplicated_share"] for s in shares]
    assert all(pt["kind"] == "measured" and pt["baseline"] in ("kjt", "kjt_clustered") for pt in g["points"])
    assert 0.5 < g["headline_value"] < 1 and g["wins"] in ("everywhere", "nowhere", "above", "below", "undecided")
    assert storage.read_json(f"reports/recd/{report['run_id']}.json")["headline"] == h


def test_recd_storage_url_that_does_not_exist_fails_before_work(dask_cluster, tmp_path):
    missing = ObjectStorage(url=(tmp_path / "no" / "such" / "root").as_uri())
    with pytest.raises(StorageError, match="does not exist"):
        recd(scale="smoke", cluster=dask_cluster, storage=missing)
    assert not (tmp_path / "no").exists()
