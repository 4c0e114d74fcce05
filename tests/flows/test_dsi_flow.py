"""The DSI flow at smoke scale on Dask: a RunReport with the measured headline against the strongest
on-trainer loader, all three variants training on the same samples, DPP and the projected loader
reading fewer bytes than full rows; an empty or incomplete dataset fails before any training."""
from __future__ import annotations

import math

import pytest

from faultkit import reference_run

from mlsys_flows.flows.dsi import dsi
from mlsys_flows.systems.dsi import Params
from mlsys_flows.systems.dsi import data as d


def test_dsi_smoke_flow():
    """The shared smoke run (faultkit.reference_run), as the contract test sees it."""
    report, storage = reference_run("dsi")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"]) == ("trainer_samples_per_s", "inline", "dpp")
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0
    assert h["vs_strongest"]["baseline"] in ("inline", "inline_full_rows")
    v = report["variants"]
    assert set(v) == {"inline", "inline_full_rows", "dpp"}
    assert v["dpp"]["samples"] == v["inline"]["samples"] == v["inline_full_rows"]["samples"] > 0
    assert v["dpp"]["bytes_read"] < v["inline_full_rows"]["bytes_read"]
    assert v["inline"]["bytes_read"] < v["inline_full_rows"]["bytes_read"]
    for name in v:
        assert 0 <= v[name]["stall_fraction"] <= 1 and v[name]["step_ms"] > 0 and math.isfinite(v[name]["final_loss"])
    assert 1 <= v["dpp"]["workers_mean"] <= v["dpp"]["workers_max"]
    assert {(r["baseline"], r["technique"]) for r in report["ratios"] if r["metric"] == "trainer_samples_per_s"} == \
        {("inline_full_rows", "dpp"), ("inline_full_rows", "inline")}
    assert any("CPU budget" in n for n in report["notes"])
    assert report["curves"][0]["series"]["dpp"][1], "workers over time"
    assert storage.read_json(f"reports/dsi/{report['run_id']}.json")["headline"] == h


def test_dsi_empty_or_incomplete_dataset_fails_before_training(dask_cluster, local_storage):
    with pytest.raises(d.DatasetError, match="empty dataset"):
        dsi(scale="smoke", overrides={"dataset": "nothing/here"}, cluster=dask_cluster, storage=local_storage)
    local_storage.write_bytes("mine/part-0.parquet", d.to_parquet(d.generate_file(
        Params.for_scale("smoke"), 0), 256))
    with pytest.raises(d.DatasetError, match="'dense_99'"):
        dsi(scale="smoke", overrides={"dataset": "mine", "features": ["dense_0", "dense_99"]},
            cluster=dask_cluster, storage=local_storage)
    assert not [k for k in local_storage.list("reports")]
