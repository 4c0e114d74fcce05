"""The RecD flow at smoke scale on Dask: a RunReport with the measured headline and the paper's
other two ratios; a storage URL that does not exist fails before any work."""
from __future__ import annotations

import math

import pytest

from mlsys_flows.blocks import ObjectStorage, StorageError
from mlsys_flows.flows.recd import recd


def test_recd_smoke_flow(dask_cluster, local_storage):
    report = recd(scale="smoke", cluster=dask_cluster, storage=local_storage)
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"]) == ("train_samples_per_s", "kjt", "ikjt")
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0
    assert {r["metric"] for r in report["ratios"]} == {"stored_bytes", "preprocess_batches_per_s"}
    v = report["variants"]
    assert v["ikjt"]["stored_bytes"] < v["kjt"]["stored_bytes"]
    assert v["ikjt"]["user_values_per_epoch"] < v["kjt"]["user_values_per_epoch"]
    assert abs(v["ikjt"]["final_loss"] - v["kjt"]["final_loss"]) < 1e-3
    assert local_storage.read_json(f"reports/recd/{report['run_id']}.json")["headline"] == h


def test_recd_storage_url_that_does_not_exist_fails_before_work(dask_cluster, tmp_path):
    missing = ObjectStorage(url=(tmp_path / "no" / "such" / "root").as_uri())
    with pytest.raises(StorageError, match="does not exist"):
        recd(scale="smoke", cluster=dask_cluster, storage=missing)
    assert not (tmp_path / "no").exists()
