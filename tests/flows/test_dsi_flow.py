"""The DSI flow at smoke scale on Dask: a RunReport with the measured headline against the strongest
on-trainer loader, all four variants (the mechanism's ablation, DPP co-located on the trainer's core,
included) training on the same samples, DPP and the projected loader reading fewer bytes than full
rows, the regime swept over the smoke preset's preprocessing costs; an empty or incomplete dataset
fails before any training."""
from __future__ import annotations

import math
import os

import pytest

from faultkit import reference_run

from mlsys_flows.flows.dsi import dsi
from mlsys_flows.systems.common.params import ParamsError
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
    assert set(v) == {"inline", "inline_full_rows", "dpp", "dpp_colocated"}
    assert v["dpp"]["samples"] == v["inline"]["samples"] == v["inline_full_rows"]["samples"] == \
        v["dpp_colocated"]["samples"] > 0
    assert v["dpp_colocated"]["bytes_read"] == v["dpp"]["bytes_read"]  # the same reads: only where they run differs
    m = h["mechanism"]
    assert (m["baseline"], m["technique"], m["kind"]) == ("dpp_colocated", "dpp", "measured")
    assert math.isfinite(m["ratio"]) and m["ratio"] > 0
    g = report["regime"]
    assert g["parameter"] == "extra_preprocess" and [pt["value"] for pt in g["points"]] == [0.0, 1.27]
    assert all(pt["kind"] == "measured" and pt["baseline"] == "inline" and pt["ratio"] > 0 for pt in g["points"])
    assert g["headline_value"] == g["paper_value"] == 1.27  # the headline at the paper's point
    # ... as the timed runs ran it: the CPU budget's rounds are those of the regime's point at 1.27
    cost = next(n for n in report["notes"] if n.startswith("Preprocessing cost:"))
    sweep = next(n for n in report["notes"] if n.startswith("Regime:"))
    rounds = cost.split("(", 1)[1].split(" round", 1)[0]
    assert cost.startswith("Preprocessing cost: extra_preprocess=1.27 ") and f"{rounds} rounds)" in sweep
    assert report["roles"] == {"inline": ["paper", "deployable"], "inline_full_rows": ["deployable"]}
    assert v["dpp"]["bytes_read"] < v["inline_full_rows"]["bytes_read"]
    assert v["inline"]["bytes_read"] < v["inline_full_rows"]["bytes_read"]
    for name in v:
        assert 0 <= v[name]["stall_fraction"] <= 1 and v[name]["step_ms"] > 0 and math.isfinite(v[name]["final_loss"])
    assert 1 <= v["dpp"]["workers_mean"] <= v["dpp"]["workers_max"]
    workers = next(n for n in report["notes"] if n.startswith("DPP workers"))
    if len(os.sched_getaffinity(0)) > 1:
        # the run's cluster offers two DPP workers on the DPP core(s); the controller starts with one and adds
        # the second on the start-up event (the trainer waits for its first batch), so its curve changes
        ys = report["curves"][0]["series"]["dpp"][1]
        assert ys[0] == 1 and max(ys) == v["dpp"]["workers_max"] >= 2, workers
        assert "0.00 s: 1, " in workers and "(no change)" not in workers
        assert workers.count("tcp://") >= 2  # work items ran on both DPP workers
    assert {(r["baseline"], r["technique"]) for r in report["ratios"] if r["metric"] == "trainer_samples_per_s"} == \
        {("inline_full_rows", "dpp"), ("inline_full_rows", "inline")}
    assert any("CPU budget" in n for n in report["notes"]) and any(n.startswith("Regime:") for n in report["notes"])
    assert report["curves"][0]["series"]["dpp"][1], "workers over time"
    assert storage.read_json(f"reports/dsi/{report['run_id']}.json")["headline"] == h
    pinning = next(n for n in report["notes"] if n.startswith("Pinning"))
    if len(os.sched_getaffinity(0)) > 1:  # the embedded cluster's scheduler (this process) and DPP worker
        assert "scheduler (the flow's process)" in pinning and "DPP worker" in pinning
    # restored: no thread of this process (which ran the scheduler) stays pinned after the run
    parent = os.sched_getaffinity(os.getppid())
    assert all(os.sched_getaffinity(int(t)) == parent for t in os.listdir("/proc/self/task"))


def test_dsi_empty_or_incomplete_dataset_fails_before_training(dask_cluster, local_storage):
    with pytest.raises(d.DatasetError, match="empty dataset"):
        dsi(scale="smoke", overrides={"dataset": "nothing/here"}, cluster=dask_cluster, storage=local_storage)
    local_storage.write_bytes("mine/part-0.parquet", d.to_parquet(d.generate_file(
        Params.for_scale("smoke"), 0), 256))
    with pytest.raises(d.DatasetError, match="'dense_99'"):
        dsi(scale="smoke", overrides={"dataset": "mine", "features": ["dense_0", "dense_99"]},
            cluster=dask_cluster, storage=local_storage)
    assert not [k for k in local_storage.list("reports")]


def test_dsi_dataset_larger_than_the_disk_fails_before_any_work(dask_cluster, local_storage):
    huge = {"files": 10_000, "row_groups_per_file": 10_000, "rows_per_group": 1_048_576}
    with pytest.raises(ParamsError, match="'files'.*GB free"):
        dsi(scale="smoke", overrides=huge, cluster=dask_cluster, storage=local_storage)
    assert not local_storage.list("runs") and not local_storage.list("reports")
