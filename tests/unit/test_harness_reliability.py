"""The harness pieces the fault tests rely on: deterministic metrics, resume records, run keys."""
from __future__ import annotations

import pytest

from mlsys_flows.blocks import CheckpointStore
from mlsys_flows.flows.common import SystemResult, deterministic_metrics, timing_metric


@pytest.mark.parametrize("name", ["samples_per_s", "time_to_target_s", "p99_latency_ms", "throughput_mb_s",
                                  "end_to_end_time_s", "train_throughput", "ops_per_s", "gpu_util", "wall_time"])
def test_timing_metrics(name):
    assert timing_metric(name)


@pytest.mark.parametrize("name", ["final_loss", "stored_bytes", "hit_rate", "alltoall_bytes", "max_stage_load",
                                  "recall_at_k", "in_batch_dedup", "steps", "success_rate", "top1_accuracy"])
def test_deterministic_metrics(name):
    assert not timing_metric(name)


def test_declared_deterministic_metrics_win():
    variants = {"a": {"loss": 1.0, "gap": 0.1, "samples_per_s": 3.0}, "b": {"loss": 2.0}}
    assert deterministic_metrics(SystemResult(variants=variants)) == ["gap", "loss"]
    assert deterministic_metrics(SystemResult(variants=variants, deterministic={"loss", "absent"})) == ["loss"]
    assert deterministic_metrics(SystemResult(variants=variants, deterministic=set())) == []


def test_resume_is_recorded_and_saves_keep_the_record(local_storage):
    store = CheckpointStore(storage=local_storage, keep_last=2)
    assert store.resume("r", default="fresh") == (-1, "fresh") and store.resumes("r") == []
    for step in range(3):
        store.save("r", step, {"step": step})
    assert store.resume("r")[0] == 2
    store.save("r", 3, {"step": 3})
    assert [r["step"] for r in store.resumes("r")] == [2]
    assert [e["step"] for e in store.manifest("r")] == [2, 3]
