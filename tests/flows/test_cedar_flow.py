"""The cedar flow at smoke scale: DataLoader (num_workers calibrated; the hindsight best as an oracle),
cedar (the mechanism's ablation) and cedar optimized on the image, text and audio pipelines, on Dask
workers; the headline is the geometric mean of per-pipeline ratios; the regime sweeps the per-sample
CPU cost of a synthetic pipeline; cedar optimized is offered the cluster's other Dask worker for offload.
The caching DataLoader (its deterministic prefix cached in memory, num_workers calibrated) is a deployable
baseline. The session's shared smoke run (faultkit.reference_run, cedar's caching on the storage block)."""
import math
import statistics

from faultkit import reference_run


def test_cedar_flow_smoke(prefect_api):
    report, storage = reference_run("cedar")
    h = report["headline"]
    assert h["metric"] == "geomean_samples_per_s" and h["baseline"] == "dataloader"
    assert h["technique"] == "cedar_optimized" and h["kind"] == "measured"
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0
    v, s = report["variants"], report["samples"]
    for name in ("image", "text", "audio"):
        assert {f"{name}/dataloader", f"{name}/cedar", f"{name}/cedar_optimized"} <= set(v)
        assert v[f"{name}/dataloader"]["num_workers"] in (0.0, 1.0)
        assert v[f"{name}/dataloader_cached"]["num_workers"] in (0.0, 1.0)  # the caching DataLoader, calibrated
        assert v[f"{name}/dataloader_oracle"]["samples_per_s"] >= v[f"{name}/dataloader"]["samples_per_s"]
    # the headline is the geometric mean of the three per-pipeline ratios (one repeat at smoke)
    per = [v[f"{n}/cedar_optimized"]["samples_per_s"] / v[f"{n}/dataloader"]["samples_per_s"]
           for n in ("image", "text", "audio")]
    assert h["ratio"] == statistics.geometric_mean(per) or math.isclose(h["ratio"], statistics.geometric_mean(per))
    assert s["cedar_optimized"]["geomean_samples_per_s"] and report["metric_kinds"]["num_workers"] == "measured"
    notes = "\n".join(report["notes"])
    assert notes.count("Outputs checked equal to cedar as written") == 3 and "timed plan" in notes
    assert "image plan chosen by the optimizer" in notes and "cache (" in notes
    # the Dask offload is offered (the cluster's other worker) and its model recorded; each pipeline
    # records where its stages ran and how results came back; the Dask path's outputs are verified too
    assert notes.count("Where its stages ran and how results came back") == 3
    assert notes.count("1 worker thread(s) offered to the optimizer") == 3 and "1 remote worker: Amdahl model" in notes
    assert notes.count("cedar_optimized (every rewrite, on Dask workers)") == 3
    m = h["mechanism"]
    assert (m["baseline"], m["technique"], m["kind"]) == ("cedar", "cedar_optimized", "measured")
    assert h["vs_oracle"]["baseline"] == "dataloader_oracle"
    assert h["vs_strongest"]["baseline"] in ("dataloader", "dataloader_cached", "cedar")
    assert report["roles"]["dataloader_oracle"] == ["oracle"]
    assert report["roles"]["dataloader_cached"] == ["deployable"] and notes.count("caching DataLoader (the same loader") == 3
    assert notes.count("dataloader_cached_w0") == 3  # its outputs are verified like the others
    g = report["regime"]
    assert g["parameter"] == "per_sample_cpu_us" and [pt["value"] for pt in g["points"]] == [20.0, 1000.0]
    assert all(pt["kind"] == "measured" and pt["baseline"] in ("dataloader", "dataloader_cached", "cedar")
               for pt in g["points"])
    assert g["headline_value"] > 0 and "Regime: a synthetic pipeline" in notes
    # the regime's calibration split is the task's own: other ids (from the point's size on) and another seed;
    # each point records optimize()'s share of cedar optimized's run
    from mlsys_flows.systems.cedar import Params, regime_items_at
    p = Params(**{k: v for k, v in report["parameters"].items() if k in Params.model_fields})
    for us in (20.0, 1000.0):
        n = regime_items_at(p, us)
        assert f"calibrated on {max(p.batch_size, n // 2)} samples from id {n}, seed {p.seed + 1}" in notes
    assert notes.count("of its run") >= 5  # three pipelines and both regime points
    # the diagnostic (not deployable): cedar optimized's epochs without optimize() vs the caching DataLoader
    diag = [r for r in report["ratios"] if r["technique"] == "cedar_optimized_epochs"]
    assert len(diag) == 1 and diag[0]["baseline"] == "dataloader_cached" and "cedar_optimized_epochs" not in report["roles"]
    assert storage.exists(f"reports/cedar/{report['run_id']}.json")
    assert storage.exists(f"runs/cedar/{report['run_id']}/data/text/corpus.parquet")
    assert storage.exists(f"runs/cedar/{report['run_id']}/data/audio/000000.wav")
