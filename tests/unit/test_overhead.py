"""The orchestration-overhead benchmark (benchmarks/overhead.py): its pure parts. One tiny real run is in
tests/flows/test_overhead_run.py (it needs the session's Prefect API, which unit tests do not start)."""
from __future__ import annotations

import json

import pytest

from benchmarks import overhead as ov


# ----- busy intervals and the critical path ---------------------------------------------------------
def test_merge_counts_overlapping_work_once():
    assert ov.merge_intervals([(5, 6), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 6)]
    assert ov.busy_time([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4.0)
    # nested and identical intervals add nothing
    assert ov.busy_time([(0, 10), (2, 3), (0, 10)]) == pytest.approx(10.0)
    assert ov.busy_time([]) == 0.0


def test_busy_time_is_not_the_sum_of_task_times():
    """A broken union (summing the intervals) would give 6 s here, not 3."""
    parallel = [(0.0, 3.0), (0.0, 3.0)]
    assert ov.busy_time(parallel) == pytest.approx(3.0)
    assert sum(e - s for s, e in parallel) == pytest.approx(6.0)


def test_busy_time_clips_to_the_window():
    assert ov.busy_time([(-1, 2), (8, 12)], window=(0, 10)) == pytest.approx(4.0)


def test_broken_interval_is_rejected():
    with pytest.raises(ValueError, match="ends before it starts"):
        ov.merge_intervals([(0, 1), (3, 2)])


def test_max_concurrency():
    assert ov.max_concurrency([(0, 2), (1, 3), (1.5, 2.5)]) == 3
    assert ov.max_concurrency([(0, 1), (1, 2), (2, 3)]) == 1  # back to back is not parallel
    assert ov.max_concurrency([]) == 0


# ----- orchestration's share ---------------------------------------------------------------------
def test_share_is_wall_minus_the_union():
    # tasks busy 0-4 and 5-8 (the second two overlap): 7 s of 10 s; 3 s orchestration
    got = ov.orchestration_share(10.0, [(0, 4), (5, 7), (6, 8)])
    assert got["task_busy_s"] == pytest.approx(7.0)
    assert got["orchestration_s"] == pytest.approx(3.0)
    assert got["share"] == pytest.approx(0.3)


def test_share_rejects_broken_inputs():
    with pytest.raises(ValueError, match="positive"):
        ov.orchestration_share(0.0, [(0, 1)])
    with pytest.raises(ValueError, match="outside the run"):  # tasks busier than the run itself
        ov.orchestration_share(5.0, [(0, 4), (4, 9)])
    # the same intervals clipped to the run's window are fine
    assert ov.orchestration_share(5.0, [(0, 4), (4, 9)], window=(0, 5))["share"] == pytest.approx(0.0)


def test_stage_table_and_parallel_speedup():
    one = ov.stage_table([("load", 0, 1), ("eval", 1, 3), ("eval", 3, 5), ("eval", 5, 7)])
    two = ov.stage_table([("load", 0, 1), ("eval", 1, 3), ("eval", 1, 3), ("eval", 3, 5)])
    assert one["eval"] == {"n": 3, "span_s": 6.0, "busy_s": 6.0, "concurrency": 1}
    assert two["eval"]["concurrency"] == 2 and two["load"]["concurrency"] == 1
    runs = [{"factor": 1.0, "n_workers": 1, "stages": one, "body_s": 8.0, "wall_s": 10.0, "task_busy_s": 7.0,
             "overrides": {"x": 1}},
            {"factor": 1.0, "n_workers": 2, "stages": two, "body_s": 5.0, "wall_s": 7.0, "task_busy_s": 5.0,
             "overrides": {"x": 1}}]
    (s,) = ov.scaling_summary(runs)
    assert s["parallel_stages"] == ["eval"]
    assert s["parallel_speedup"] == pytest.approx(6.0 / 4.0)
    assert s["body_speedup"] == pytest.approx(8.0 / 5.0)


def test_summary_and_paired_ratios():
    assert ov.summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    r = ov.paired_ratios([2.0, 6.0], [1.0, 2.0])
    assert (r["min"], r["max"]) == (2.0, 3.0)
    with pytest.raises(ValueError):
        ov.paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        ov.summary([])


def test_result_is_a_generic_table_with_kinds():
    details = {"transfer": {"mb": 1.0, "samples": {m: [1.0, 2.0] for m in
                                                   ("dask-local", "dask", "prefect-local", "prefect-dask",
                                                    "prefect-persisted", "prefect-storage-key")}}},
    result = ov.build_result(details[0], "embedded", {"cpu": "x", "cores": 2, "commit": None, "date": "d",
                                                      "load_before": None, "load_after": None})
    assert result["columns"] == ov.COLUMNS and len(result["rows"]) == 6
    assert all(set(r) == set(ov.COLUMNS) and r["kind"] == "measured" for r in result["rows"])
    json.dumps(result)
    assert "| part |" in ov.markdown(result)


def test_docs_tables_are_written_between_the_markers(tmp_path):
    doc = tmp_path / "overhead.md"
    doc.write_text("intro\n<!-- overhead:start -->\nold\n<!-- overhead:end -->\nafter\n")
    result = ov.build_result({"fixed": {"samples": {"embedded": [{"to_first_task": 1.0, "last_task_to_exit": 2.0,
                                                                  "total": 3.0, "to_imported": 0.5}]}}},
                             "embedded", {"cpu": "x", "cores": 2, "commit": "c", "date": "d",
                                          "load_before": None, "load_after": None})
    ov.write_docs(result, doc)
    text = doc.read_text()
    assert text.startswith("intro\n<!-- overhead:start -->\n| part |") and text.endswith("<!-- overhead:end -->\nafter\n")
    assert "\nold\n" not in text and "command to first task start" in text
    doc.write_text("no markers\n")
    with pytest.raises(RuntimeError, match="markers"):
        ov.write_docs(result, doc)


def test_a_stage_parallel_at_one_size_counts_at_every_size():
    seq = ov.stage_table([("eval", 0, 1), ("eval", 1, 2)])
    par = ov.stage_table([("eval", 0, 2), ("eval", 0, 2)])
    base = {"body_s": 4.0, "wall_s": 5.0, "task_busy_s": 2.0, "overrides": {"x": 1}}
    runs = [{**base, "factor": 1.0, "n_workers": 1, "stages": seq}, {**base, "factor": 1.0, "n_workers": 2, "stages": seq},
            {**base, "factor": 2.0, "n_workers": 1, "stages": seq}, {**base, "factor": 2.0, "n_workers": 2, "stages": par}]
    small, big = ov.scaling_summary(runs)
    assert small["parallel_stages"] == big["parallel_stages"] == ["eval"]
    assert small["parallel_speedup"] == pytest.approx(1.0) and big["parallel_speedup"] == pytest.approx(1.0)


# ----- part 6: issue 42's floor --------------------------------------------------------------------
def _cli_sample(total, body, first):
    return {"total": total, "to_first_task": first, "body": body, "fixed": total - body,
            "to_flow_run_created": first - 0.5, "created_to_first_task": 0.5,
            "last_task_to_flow_run_end": 0.4, "flow_run_end_to_exit": total - body - first - 0.4}


def test_floor_rows_pair_the_fixed_cost_with_the_plain_flow_per_repeat():
    samples = {"server": {"cli": [_cli_sample(10.0, 4.0, 1.5), _cli_sample(12.0, 4.0, 1.8)],
                          "plain": [{"total": 4.0, "to_first_task": 3.0}, {"total": 5.0, "to_first_task": 3.6}]}}
    rows = ov.floor_rows({"run": "mlsys-flows run placement --scale smoke", "targets": ov.FLOOR_TARGETS,
                          "samples": samples})
    fixed = next(r for r in rows if "fixed cost" in r["what"])
    assert fixed["median"] == 7.0 and fixed["ratio to vs (median)"] == pytest.approx(1.55)  # 6/4 and 8/5
    assert "1.5x" in fixed["what"]
    first = next(r for r in rows if "command to first task (target" in r["what"])
    assert first["median"] == pytest.approx(1.65) and first["ratio to vs (median)"] == pytest.approx(0.5)
    # the itemised fixed cost adds up to it
    items = [r["median"] for r in rows if "of which:" in r["what"] or "after the body:" in r["what"]]
    assert len(items) == 4
    assert sum(items) == pytest.approx(samples["server"]["cli"][0]["fixed"] / 2 + samples["server"]["cli"][1]["fixed"] / 2)


def test_floor_reads_the_embedded_runs_from_its_sqlite_database(tmp_path):
    """The embedded API stops with its command: its run is read from Prefect's SQLite tables (UTC text
    timestamps), the harness's own publish-report task left out."""
    import sqlite3

    db = tmp_path / "prefect.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE flow_run (id TEXT, created TEXT, start_time TEXT, end_time TEXT)")
        con.execute("CREATE TABLE task_run (flow_run_id TEXT, name TEXT, task_key TEXT, start_time TEXT, end_time TEXT)")
        con.execute("INSERT INTO flow_run VALUES ('r1', '2026-12-06 04:00:00.000000', '2026-12-06 04:00:01.000000', "
                    "'2026-12-06 04:00:09.000000')")
        con.executemany("INSERT INTO task_run VALUES (?, ?, ?, ?, ?)", [
            ("r1", "solve-1a2", "solve-9f8e7d6c5b4a39281706f5e4d3c2b1a0", "2026-12-06 04:00:02.000000",
             "2026-12-06 04:00:05.000000"),
            ("r1", "publish-report-3c4", "publish-report-0a", "2026-12-06 04:00:06.000000", "2026-12-06 04:00:08.000000"),
            ("r2", "other-1", "other-1", "2026-12-06 04:00:02.000000", "2026-12-06 04:00:03.000000")])
    fr, runs = ov._db_run(db, "r1")
    assert fr["end"] - fr["created"] == pytest.approx(9.0)
    assert [(n, e - s) for n, s, e in runs] == [("solve", 3.0)]


def test_idle_gaps_name_the_tasks_around_the_longest_stretches_without_work():
    runs = [("make", 0.0, 1.0), ("train", 3.0, 10.0), ("eval", 4.0, 5.0), ("report", 10.5, 11.0)]
    gaps = ov.idle_gaps(runs)
    assert gaps == [{"s": 2.0, "after": "make", "before": "train"},
                    {"s": 0.5, "after": "train", "before": "report"}]
    assert ov.idle_gaps([("a", 0, 2), ("b", 1, 3)]) == []
