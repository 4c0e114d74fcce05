"""The harness pieces the fault tests rely on: deterministic metrics, resume records, run keys."""
from __future__ import annotations

from mlsys_flows.blocks import CheckpointStore
from mlsys_flows.systems.common.report import SystemResult


def test_deterministic_metrics_default_to_the_counted_ones():
    variants = {"a": {"loss": 1.0, "gap": 0.1, "samples_per_s": 3.0, "time_s": 2.0}, "b": {"loss": 2.0}}
    kinds = {"loss": "counted", "gap": "counted", "samples_per_s": "measured", "time_s": "modelled"}
    det = lambda **kw: SystemResult(variants=variants, kinds=kinds, **kw).deterministic_metrics(variants)  # noqa: E731
    assert det() == ["gap", "loss"]
    assert det(deterministic={"loss", "absent"}) == ["loss"]
    assert det(deterministic=set()) == []


def test_resume_is_recorded_and_saves_keep_the_record(local_storage):
    store = CheckpointStore(storage=local_storage, keep_last=2)
    assert store.resume("r", default="fresh") == (-1, "fresh") and store.resumes("r") == []
    for step in range(3):
        store.write("r", step, {"step": step})
    assert store.resume("r")[0] == 2
    store.write("r", 3, {"step": 3})
    assert [r["step"] for r in store.resumes("r")] == [2]
    assert [e["step"] for e in store.manifest("r")] == [2, 3]
