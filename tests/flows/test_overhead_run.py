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
