"""The cedar flow at smoke scale: DataLoader, cedar and cedar optimized on both pipelines, on Dask workers."""
import math

from mlsys_flows.flows.cedar import cedar


def test_cedar_flow_smoke(dask_cluster, local_storage):
    report = cedar(scale="smoke", cluster=dask_cluster, storage=local_storage, overrides={"cache": "storage"})
    h = report["headline"]
    assert h["metric"] == "samples_per_s" and h["baseline"] == "dataloader" and h["technique"] == "cedar_optimized"
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0
    v = report["variants"]
    for name in ("image", "text"):
        assert {f"{name}/dataloader", f"{name}/cedar", f"{name}/cedar_optimized"} <= set(v)
        assert v[f"{name}/dataloader"]["num_workers"] in (0.0, 1.0)
    notes = "\n".join(report["notes"])
    assert "Outputs of the three match as multisets: True" in notes and notes.count("match as multisets: True") == 2
    assert "image plan chosen by the optimizer" in notes and "cache (" in notes
    assert local_storage.exists(f"reports/cedar/{report['run_id']}.json")
    assert local_storage.exists(f"runs/cedar/{report['run_id']}/data/text/corpus.parquet")
