"""One tiny real run of the orchestration-overhead benchmark (benchmarks/overhead.py, part 1)."""
from __future__ import annotations

from pathlib import Path

from benchmarks import overhead as ov


def test_tiny_task_overhead_run(prefect_api, tmp_path, monkeypatch):
    """Two trivial tasks and one awaited alone, one repeat, no warm-up: every variant ran, its per-task
    time is positive, the rows are built."""
    repo = str(Path(ov.__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", repo)  # the Dask workers import benchmarks._overhead_tasks
    d = ov.measure_tasks(n_tasks=2, repeats=1, home=tmp_path, log=lambda *_: None, n_sequential=1, warmup=False)
    assert set(d["samples"]) == {"dask", "prefect-memory", "prefect-persisted"}
    assert all(len(v) == 1 and v[0][0] > 0 and v[0][1] > 0 for v in d["samples"].values())
    rows = ov.tasks_rows(d)
    assert len(rows) == 6 and all(r["unit"] == "ms/task" and r["kind"] == "measured" for r in rows)
    assert all(r["ratio to vs (median)"] > 0 for r in rows if r["vs"])


def test_shares_read_back_from_recorded_runs(prefect_api, tmp_path):
    """Part 4 without a rerun: the shared smoke run of phaze, read back from the API that recorded it.
    Its tasks' busy time is a real part of its wall time; a report with no run gives a named error."""
    import json

    from faultkit import reference_run

    report, _ = reference_run("phaze")
    (tmp_path / "phaze-smoke.json").write_text(json.dumps(report))
    d = ov.recorded_shares(["phaze", "cedar"], "smoke", tmp_path, log=lambda *_: None)
    (run,) = d["runs"]["phaze"]
    assert run["run_id"] == report["run_id"] and run["task_runs"] >= 2
    assert 0 < run["task_busy_s"] < run["wall_s"] and run["wall_s"] >= report["wall_time_s"] * 0.9
    assert abs(run["orchestration_s"] - (run["wall_s"] - run["task_busy_s"])) < 1e-9
    assert "publish-report" not in run["stages"] and run["stages"]
    assert "FileNotFoundError" in d["runs"]["cedar"][0]["error"]
    rows = ov.shares_rows(d)
    assert any("recorded flow run" in (r["what"] or "") for r in rows)
    assert any("cedar: FAILED" in (r["what"] or "") for r in rows)
