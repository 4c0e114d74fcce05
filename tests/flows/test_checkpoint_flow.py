"""The checkpoint flow at smoke (the session's shared reference run, run key "reference"): every variant
measured, the headline and its comparison against the strongest deployable baseline on end-to-end
iteration time (final drain included), checkpointing changes no training result, every mode's checkpoint
equals the synchronous one, and the resumable run left complete checkpoints under the run key."""
from __future__ import annotations

import math

import pytest

from faultkit import REFERENCE_RUN_KEY, reference_run

from mlsys_flows.blocks import CheckpointStore


def test_checkpoint_smoke_report():
    report, storage = reference_run("checkpoint")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("iter_time_s", "sync", "async", "measured")
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0
    v, kinds, p = report["variants"], report["metric_kinds"], report["parameters"]
    assert set(v) == {"none", "sync", "async_eager", "dcp_async", "dcp_async_lazy", "async_serialize", "async",
                      "training_run"}
    # vs_strongest: end-to-end iteration time against the best of the four deployable baselines
    vs, rivals = h["vs_strongest"], ("sync", "async_eager", "dcp_async", "dcp_async_lazy")
    assert vs["metric"] == "iter_time_s" and vs["baseline"] in rivals
    assert vs["baseline_value"] == min(v[b]["iter_time_s"] for b in rivals)
    assert vs["verdict"]["outcome"] in {"wins", "ties", "loses"}
    # the headline's iteration time includes the final drain; loop_iter_time_s leaves it out
    for n in ("async_eager", "dcp_async", "dcp_async_lazy", "async"):
        for it, loop, drain in zip(*(report["samples"][n][m] for m in ("iter_time_s", "loop_iter_time_s", "drain_s"))):
            assert it == pytest.approx(loop + drain / p["steps"])
    # the in-loop stall per checkpoint stays a claim
    assert any(r["metric"] == "stall_s_per_checkpoint" and (r["baseline"], r["technique"]) == ("sync", "async")
               for r in report["ratios"])
    # contract v3: the ablation (background write, no in-memory snapshot) is measured on the same runs
    assert h["mechanism"]["baseline"] == "async_serialize" and h["mechanism"]["kind"] == "measured"
    assert math.isfinite(h["mechanism"]["ratio"]) and h["mechanism"]["ratio"] > 0
    # the ablation serialises in the loop: its in-loop stall is at least its serialisation time, > 0
    assert v["async_serialize"]["stall_s_per_checkpoint"] > 0
    assert v["async"]["drain_s"] >= 0 and v["sync"]["drain_s"] < v["sync"]["stall_s_per_checkpoint"]
    reg = report["regime"]
    assert reg["parameter"] == "state size" and reg["unit"] == "MB"
    assert [round(pt["value"], 3) for pt in reg["points"]] == [round(3 * 4 * p["depth"] * (w * w + w) / 1e6, 3)
                                                              for w in p["regime_widths"]]
    assert reg["headline_value"] == reg["points"][-1]["value"] and {pt["kind"] for pt in reg["points"]} == {"measured"}
    assert kinds["iter_time_s"] == kinds["stall_s_per_iter"] == kinds["flush_mb_s"] == kinds["drain_s"] == "measured"
    assert kinds["weights_digest"] == kinds["checkpoint_mb"] == kinds["checkpoint_equals_sync"] == "counted"
    # checkpoints change nothing: one digest and one final loss over every variant and the resumable run
    assert len({v[n]["weights_digest"] for n in v}) == 1 and len({v[n]["final_loss"] for n in v}) == 1
    for n in ("sync", "async_eager", "dcp_async", "dcp_async_lazy", "async_serialize", "async"):
        assert v[n]["checkpoint_equals_sync"] == 1.0
        assert v[n]["checkpoints_per_run"] == p["steps"] // p["every"]
        assert v[n]["stall_s_per_iter"] > 0 and v[n]["flush_mb_s"] > 0
        assert len(report["samples"][n]["overhead_s_per_iter"]) == p["repeats"]
    assert v["none"]["stall_s_per_iter"] == 0.0 and v["none"]["checkpoints_per_run"] == 0
    assert {"weights_digest", "final_loss", "checkpoint_mb"} <= set(report["deterministic_metrics"])
    # the resumable run: complete checkpoints under the run key, the newest one at the last step
    store = CheckpointStore(storage=storage, prefix="checkpoints/checkpoint")
    assert store.latest(REFERENCE_RUN_KEY)["step"] == p["steps"] // p["every"] * p["every"]
    assert not storage.list(f"runs/checkpoint/{report['run_id']}/bench")  # the bench cleaned up after itself
    assert storage.exists(f"reports/checkpoint/{report['run_id']}.json")
