"""The cost of orchestration on this machine, measured as ratios in one run (issue 21).

    python -m benchmarks.overhead                      # everything: parts 1-5, quick, every flow
    python -m benchmarks.overhead --parts tasks,transfer --repeats 3
    python -m benchmarks.overhead --parts shares --systems moetuner,phaze --scale smoke

Five parts, each repeated with the variants interleaved (median and min-max over the repeats):

1. ``tasks``: one trivial function as a Prefect task on the harness's ``DaskTaskRunner`` vs the same
   function through plain ``distributed.Client.submit`` on the same ``LocalCluster``: seconds per
   task over N tasks submitted at once (throughput) and one at a time (latency). The Prefect task
   runs as the harness runs it (``tasks_on``: results persisted on an ObjectStorage) and with
   results kept in memory.
2. ``fixed``: a flow's fixed cost. A fresh ``python`` process imports the harness, runs a flow whose
   one task stamps its start and end, and exits; from the command to the task's start and from the
   task's end to the process's exit, with the embedded (temporary) API on a warm home and against a
   running Prefect server.
3. ``transfer``: a 100 MB array from a producer task on one worker to a consumer on the other:
   through Dask (the task's result), through Prefect results persisted on the storage block (the
   harness's setting: the result is written to storage as well as handed over by Dask), and through
   the storage block by key (the producer writes ``.npy`` bytes, the consumer reads them). Each
   against plain Dask and against the same work in one task (nothing moved).
4. ``shares``: every implemented flow at a scale; orchestration's share of wall time (see
   :func:`orchestration_share`), from the task runs' start and end times read back from the Prefect
   API after the run (no change to the harness).
5. ``scaling``: cedar, dsi and phaze at three data sizes with 1 and 2 Dask workers; time against
   size, and the 2-worker speedup of the parallel stages (see :func:`stage_table`).
6. ``floor``: issue 42's targets, whole commands paired by repeat: ``mlsys-flows run placement
   --scale smoke`` against ``python benchmarks/_plain_flow.py`` (a plain Prefect flow with one task,
   torch imported), with the running server (the CLI on its warm cluster) and on a temporary API (the
   CLI's embedded one, Prefect's ephemeral one for the plain flow). The CLI run's fixed cost is its
   whole command minus its flow body (first task start to last task end, from the run's task runs),
   itemised by the flow run's own timestamps.

Writes ``benchmarks/results/overhead.json`` (a generic table: columns, rows, notes, machine, plus
``details`` per part), ``docs/img/overhead-*.png`` and, with ``--docs``, the tables of
``docs/overhead.md`` between its ``<!-- overhead:start -->`` / ``<!-- overhead:end -->`` markers.
Prefect is imported only after the API is chosen (a running server is started first by default).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "overhead.json"
IMG = REPO / "docs" / "img"
DOC = REPO / "docs" / "overhead.md"
PARTS = ("tasks", "fixed", "transfer", "shares", "warmup", "scaling", "floor")
# The data-size parameters of the scaling flows, multiplied by each size factor (of the scale's preset).
SCALING = {"cedar": ("n_images", "n_docs", "n_clips"), "dsi": ("files",), "phaze": ("candidates",)}
EARLY_API_ENV = "MLSYS_OVERHEAD_EARLY_API"  # part 2's child starts the embedded API first, as the CLI does
OWN_CLUSTER_ENV = "MLSYS_OVERHEAD_OWN_CLUSTER"  # part 2's child starts its own LocalCluster despite a warm one
PLAIN_FLOW = REPO / "benchmarks" / "_plain_flow.py"  # part 6's yardstick: what a user would write instead
FLOOR_RUN = ("placement", "smoke")  # part 6's `mlsys-flows run`: the issue's example, a body of seconds
# Issue 42 item 4's targets: with a running server and its warm cluster, command to first task under 2 s and the
# fixed cost at most 1.5x the plain flow's whole command on the same API; embedded, at most 1.3x on Prefect's temporary API
FLOOR_TARGETS = {"first_task_s": 2.0, "server": 1.5, "embedded": 1.3}
HARNESS_TASKS = ("publish-report",)  # the harness's own tasks: orchestration, not the system's work
COLUMNS = ["part", "what", "kind", "unit", "median", "min", "max", "n", "vs", "ratio to vs (median)",
           "ratio to vs (min-max)"]


# ====================================================================================================
# Pure parts (unit-tested): intervals, shares, stages, summaries
# ====================================================================================================
def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering exactly the union of ``intervals``. An interval that ends
    before it starts is an error (a clock or a read-back bug), not something to drop silently."""
    items = sorted((float(s), float(e)) for s, e in intervals)
    merged: list[tuple[float, float]] = []
    for s, e in items:
        if e < s:
            raise ValueError(f"interval ends before it starts: ({s}, {e})")
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def busy_time(intervals: Iterable[tuple[float, float]], window: tuple[float, float] | None = None) -> float:
    """Seconds during which at least one interval is open (the length of their union), counted only
    inside ``window`` when given."""
    total = 0.0
    for s, e in merge_intervals(intervals):
        if window is not None:
            s, e = max(s, window[0]), min(e, window[1])
        total += max(0.0, e - s)
    return total


def idle_gaps(runs: Sequence[tuple[str, float, float]], top: int = 3) -> list[dict[str, Any]]:
    """The longest stretches between a flow's first task start and last task end when none of its task
    runs (``(name, start, end)``) was running, longest first: where orchestration's seconds between
    tasks go (the API, waiting on a result, work the flow body does itself), with the task that ended
    before each and the one that started after it."""
    gaps, open_until, last = [], None, None
    for name, s, e in sorted(runs, key=lambda r: r[1]):
        if open_until is not None and s > open_until:
            gaps.append({"s": s - open_until, "after": last, "before": name})
        if open_until is None or e > open_until:
            open_until, last = e, name
    return sorted(gaps, key=lambda g: -g["s"])[:top]


def max_concurrency(intervals: Iterable[tuple[float, float]]) -> int:
    """Most intervals open at one instant (an end and a start at the same instant do not overlap)."""
    events = sorted([(float(s), 1) for s, _ in intervals] + [(float(e), -1) for _, e in intervals],
                    key=lambda x: (x[0], x[1]))
    open_, best = 0, 0
    for _, step in events:
        open_ += step
        best = max(best, open_)
    return best


def orchestration_share(wall_s: float, intervals: Sequence[tuple[float, float]],
                        window: tuple[float, float] | None = None) -> dict[str, float]:
    """Orchestration's share of a run's wall time.

    Definition: the *task work on the critical path* is the union of the busy intervals of the
    run's tasks (each task run from its Running state to its terminal state, as the Prefect API
    records them): every instant at which at least one of the system's tasks was running. Whatever
    the flow spends at instants when no task runs -- process start, imports, the API, starting the
    Dask cluster, submitting, waiting for results to come back, work done in the flow body itself,
    publishing the report, teardown -- is orchestration:

        orchestration_s = wall_s - |union of task intervals|,   share = orchestration_s / wall_s.

    With parallel tasks the union counts overlapping work once, so it is the length of the busiest
    path through the run's time line, not the sum of task times. The task intervals include
    Prefect's own work inside a task run (parameter resolution, persisting the result), so the
    share is a lower bound of what orchestration costs. Intervals are clipped to ``window`` (the
    run's start and end on the same clock) when given."""
    if not wall_s > 0:
        raise ValueError(f"wall time must be positive (got {wall_s})")
    busy = busy_time(intervals, window)
    if busy > wall_s * 1.001 + 1e-6:
        raise ValueError(f"tasks busy {busy:.3f} s > wall {wall_s:.3f} s: intervals outside the run?")
    busy = min(busy, wall_s)
    return {"wall_s": wall_s, "task_busy_s": busy, "orchestration_s": wall_s - busy,
            "share": (wall_s - busy) / wall_s}


def stage_table(runs: Iterable[tuple[str, float, float]]) -> dict[str, dict[str, float]]:
    """Task runs (function name, start, end) grouped into stages by function: per stage the number
    of runs, its span (first start to last end), its busy time (union) and its peak concurrency. A
    stage whose runs overlap (peak concurrency >= 2) is a *parallel stage*."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for name, s, e in runs:
        groups.setdefault(name, []).append((s, e))
    return {name: {"n": len(iv), "span_s": max(e for _, e in iv) - min(s for s, _ in iv),
                   "busy_s": busy_time(iv), "concurrency": max_concurrency(iv)}
            for name, iv in groups.items()}


def parallel_stage_time(stages: dict[str, dict[str, float]], names: Iterable[str]) -> float:
    """Summed span of the named stages."""
    return sum(stages[n]["span_s"] for n in names if n in stages)


def summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        raise ValueError("no samples")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def paired_ratios(num: Sequence[float], den: Sequence[float]) -> dict[str, float]:
    """Per-repeat ratios num/den (the variants of one repeat were run back to back), summarised."""
    if len(num) != len(den) or not num:
        raise ValueError("paired samples must have the same, non-zero length")
    return summary([a / b for a, b in zip(num, den)])


def row(part: str, what: str, kind: str, unit: str, values: Sequence[float], vs: str = "",
        ratios: dict[str, float] | None = None, digits: int = 4) -> dict[str, Any]:
    s = summary(values)
    r = lambda x: float(f"{x:.{digits}g}")  # noqa: E731
    out = {"part": part, "what": what, "kind": kind, "unit": unit, "median": r(s["median"]), "min": r(s["min"]),
           "max": r(s["max"]), "n": s["n"], "vs": vs, "ratio to vs (median)": None, "ratio to vs (min-max)": ""}
    if ratios:
        out["ratio to vs (median)"] = round(ratios["median"], 3)
        out["ratio to vs (min-max)"] = f"{ratios['min']:.2f}-{ratios['max']:.2f}"
    return out


# ====================================================================================================
# Measurements (need Prefect; imported lazily, after the API is chosen)
# ====================================================================================================
def _local_cluster(n_workers: int = 2):
    from distributed import LocalCluster

    return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None)


def _storage(folder: Path):
    from mlsys_flows.blocks import ObjectStorage

    folder.mkdir(parents=True, exist_ok=True)
    return ObjectStorage(url=folder.as_uri()).check()


def measure_tasks(n_tasks: int, repeats: int, home: Path, log=print, n_sequential: int | None = None,
                  warmup: bool = True) -> dict[str, Any]:
    """Part 1: seconds per task, Prefect task on the DaskTaskRunner vs plain Client.submit."""
    from distributed import Client
    from prefect import flow

    from benchmarks import _overhead_tasks as T
    from mlsys_flows.blocks import DaskCluster
    from mlsys_flows.flows.common import tasks_on
    from mlsys_flows.runtime import shared_api

    results = _storage(home / "task-results")
    n_seq = n_sequential or max(3, n_tasks // 10)

    @flow(name="overhead-tasks", log_prints=False)
    def prefect_tasks(address: str, persist: bool) -> tuple[float, float]:
        with tasks_on(DaskCluster(address=address), results=results if persist else None):
            t0 = time.perf_counter()
            futures = [T.trivial_task.submit(i) for i in range(n_tasks)]
            out = [f.result() for f in futures]
            batch = time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in range(n_tasks, n_tasks + n_seq):  # inputs unseen in this flow run: never a cache hit
                T.trivial_task.submit(i).result()
            seq = time.perf_counter() - t0
        assert out == [i + 1 for i in range(n_tasks)], "wrong task results"
        return batch / n_tasks, seq / n_seq

    def plain(client) -> tuple[float, float]:
        t0 = time.perf_counter()
        out = client.gather([client.submit(T.trivial, i, pure=False) for i in range(n_tasks)])
        batch = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(n_seq):
            client.submit(T.trivial, i, pure=False).result()
        seq = time.perf_counter() - t0
        assert out == [i + 1 for i in range(n_tasks)], "wrong task results"
        return batch / n_tasks, seq / n_seq

    samples: dict[str, list[tuple[float, float]]] = {"dask": [], "prefect-memory": [], "prefect-persisted": []}
    # shared_api() before the cluster starts: its workers report to this process's API (see runtime.py)
    with shared_api(), _local_cluster() as cluster, Client(cluster) as client:
        if warmup:  # imports on the workers, the flow's first API calls
            plain(client), prefect_tasks(cluster.scheduler_address, False)
        for r in range(repeats):
            order = list(samples)
            order = order[r % 3:] + order[:r % 3]
            for variant in order:
                if variant == "dask":
                    samples[variant].append(plain(client))
                else:
                    samples[variant].append(prefect_tasks(cluster.scheduler_address, variant == "prefect-persisted"))
                log(f"  tasks repeat {r + 1}/{repeats} {variant}: {samples[variant][-1][0] * 1e3:.2f} ms/task batch, "
                    f"{samples[variant][-1][1] * 1e3:.2f} ms/task one at a time")
    shutil.rmtree(home / "task-results", ignore_errors=True)
    return {"n_tasks": n_tasks, "n_sequential": n_seq, "samples": {k: [list(x) for x in v] for k, v in samples.items()}}


def tasks_rows(d: dict[str, Any]) -> list[dict[str, Any]]:
    s = d["samples"]
    rows = []
    for i, mode in ((0, f"{d['n_tasks']} submitted at once"), (1, f"{d['n_sequential']} one at a time")):
        dask = [x[i] * 1e3 for x in s["dask"]]
        rows.append(row("1 tasks", f"plain Client.submit, {mode}", "measured", "ms/task", dask))
        for v, label in (("prefect-memory", "Prefect task, results in memory"),
                         ("prefect-persisted", "Prefect task as the harness runs it (results on storage)")):
            vals = [x[i] * 1e3 for x in s[v]]
            rows.append(row("1 tasks", f"{label}, {mode}", "measured", "ms/task", vals, vs="plain Client.submit",
                            ratios=paired_ratios(vals, dask)))
    return rows


def _fixed_child(home: str) -> None:
    """Child process of part 2 (``--child-fixed HOME``): imports, one flow with one task, exit."""
    t_started = time.time()
    from mlsys_flows.settings import configure_prefect_home

    configure_prefect_home()
    from mlsys_flows.platform import server

    if os.environ.get(EARLY_API_ENV):  # as the CLI does: the embedded API boots during the imports below
        server.start_embedded_api()
    from prefect import flow

    from benchmarks import _overhead_tasks as T
    from mlsys_flows.blocks import DaskCluster
    from mlsys_flows.flows.common import resolve_cluster, tasks_on
    from mlsys_flows.runtime import shared_api

    t_imported = time.time()
    server.api_ready()
    results = _storage(Path(home) / "fixed-results")

    @flow(name="overhead-fixed", log_prints=False)
    def fixed() -> dict[str, float]:
        stamps = {"flow_body": time.time()}
        # as the harness does: the server's warm cluster when it has one, else a fresh LocalCluster
        cluster = DaskCluster() if os.environ.get(OWN_CLUSTER_ENV) else resolve_cluster(None)
        with shared_api(), tasks_on(cluster, results=results):
            stamps["cluster_ready"] = time.time()
            stamps["task_start"], stamps["task_end"] = T.stamp.submit().result()
            stamps["task_returned"] = time.time()
        stamps["cluster_closed"] = time.time()
        return stamps

    stamps = fixed()
    print("OVERHEAD-FIXED " + json.dumps({"python_started": t_started, "imported": t_imported, **stamps,
                                          "flow_returned": time.time()}), flush=True)


def _child_env(home: Path, api_url: str | None, early: bool = False, own_cluster: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k not in (EARLY_API_ENV,
                                                                                             OWN_CLUSTER_ENV)}
    if early:
        env[EARLY_API_ENV] = "1"
    if own_cluster:
        env[OWN_CLUSTER_ENV] = "1"
    env.update({"MLSYS_FLOWS_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_LOGGING_LEVEL": "WARNING", "DASK_LOGGING__DISTRIBUTED": "warning",
                "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    if api_url:
        env["PREFECT_API_URL"] = api_url
        env["PREFECT_HOME"] = str(home / "prefect-client")
    else:
        env["PREFECT_HOME"] = str(home / "prefect-embedded")
        env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
    return env


def _run_fixed_child(home: Path, api_url: str | None, early: bool = False, timeout_s: float = 600,
                     own_cluster: bool = False) -> dict[str, float]:
    cmd = [sys.executable, "-m", "benchmarks.overhead", "--child-fixed", str(home)]
    t_command = time.time()
    proc = subprocess.run(cmd, env=_child_env(home, api_url, early, own_cluster), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s)
    t_exit = time.time()
    line = next((x for x in proc.stdout.splitlines() if x.startswith("OVERHEAD-FIXED ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"fixed-cost child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    d = json.loads(line.split(" ", 1)[1])
    return {"to_python": d["python_started"] - t_command, "to_imported": d["imported"] - t_command,
            "to_first_task": d["task_start"] - t_command, "task": d["task_end"] - d["task_start"],
            "last_task_to_exit": t_exit - d["task_end"], "total": t_exit - t_command,
            # the breakdown, in order
            "imported_to_flow_body": d["flow_body"] - d["imported"],
            "cluster_start": d["cluster_ready"] - d["flow_body"],
            "submit_to_task_start": d["task_start"] - d["cluster_ready"],
            "task_end_to_result": d["task_returned"] - d["task_end"],
            "cluster_close": d["cluster_closed"] - d["task_returned"],
            "cluster_closed_to_flow_returned": d["flow_returned"] - d["cluster_closed"],
            "flow_returned_to_exit": t_exit - d["flow_returned"]}


def measure_fixed(repeats: int, home: Path, api_url: str | None, log=print) -> dict[str, Any]:
    """Part 2: the fixed cost of a flow, embedded API (warm home) and, with ``api_url``, a running server."""
    # "server-own-cluster": the same server, the run starting its own LocalCluster (as before the warm cluster)
    apis = {"embedded": None, "embedded-early": None,
            **({"server": api_url, "server-own-cluster": api_url} if api_url else {})}

    def child(name: str) -> dict[str, float]:
        return _run_fixed_child(home, apis[name], early=name == "embedded-early", own_cluster=name == "server-own-cluster")

    for name in apis:  # warm-up: the embedded API's database is created here, not measured
        child(name)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in apis}
    for r in range(repeats):
        for name in (list(apis) if r % 2 == 0 else list(apis)[::-1]):
            samples[name].append(child(name))
            s = samples[name][-1]
            log(f"  fixed repeat {r + 1}/{repeats} {name}: command->first task {s['to_first_task']:.1f} s, "
                f"last task->exit {s['last_task_to_exit']:.1f} s")
    shutil.rmtree(home / "fixed-results", ignore_errors=True)
    return {"samples": samples}


def fixed_rows(d: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    labels = {"embedded": "embedded API, warm home, started by Prefect on the first API call",
              "embedded-early": "embedded API, warm home, started first (the CLI's default)",
              "server": "running Prefect server (its warm cluster, when it has one)",
              "server-own-cluster": "running Prefect server, the run's own LocalCluster"}
    for api, samples in d["samples"].items():
        for key, what in (("to_first_task", "command to first task start"),
                          ("last_task_to_exit", "last task end to process exit"),
                          ("total", "whole command (the task itself ~0 s)"),
                          ("to_imported", "  of which: command to harness imported (python, prefect, torch)"),
                          ("imported_to_flow_body", "  of which: imported to flow body start (API ready, flow run created)"),
                          ("cluster_start", "  of which: Dask LocalCluster start (2 worker processes)"),
                          ("submit_to_task_start", "  of which: task submitted to task start"),
                          ("task_end_to_result", "  of which: task end to its result in the flow"),
                          ("cluster_close", "  of which: Dask LocalCluster close"),
                          ("cluster_closed_to_flow_returned", "  of which: flow run finished"),
                          ("flow_returned_to_exit", "  of which: flow returned to process exit")):
            if key not in samples[0]:
                continue
            vals = [s[key] for s in samples]
            ratios = None
            if api != "embedded" and "embedded" in d["samples"]:
                ratios = paired_ratios(vals, [s[key] for s in d["samples"]["embedded"]])
            rows.append(row("2 fixed", f"{labels[api]}: {what}", "measured", "s", vals,
                            vs="embedded API" if ratios else "", ratios=ratios, digits=3))
    return rows


def _timed(cmd: list[str], env: dict[str, str], timeout_s: float = 600) -> tuple[float, float, str]:
    """Run ``cmd``; (start, end) epoch seconds around it and its stdout. Fails with its stderr's tail."""
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    t1 = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return t0, t1, proc.stdout


def _floor_env(home: Path, api_url: str | None) -> dict[str, str]:
    """A child's environment: with ``api_url`` the benchmark's server (whose state file in ``home``
    names its warm cluster); without, a home of its own, where no server is found."""
    return _child_env(home if api_url else home / "floor-embedded", api_url)


def _plain_command(home: Path, api_url: str | None) -> dict[str, float]:
    t0, t1, out = _timed([sys.executable, str(PLAIN_FLOW)], _floor_env(home, api_url))
    line = next(x for x in out.splitlines() if x.startswith("PLAIN-FLOW "))
    return {"total": t1 - t0, "to_first_task": json.loads(line.split(" ", 1)[1])["task_start"] - t0}


def _db_run(db: Path, flow_run_id: str) -> tuple[dict[str, float], list[tuple[str, float, float]]]:
    """The flow run's (created, start, end) and its task runs, read from the embedded API's SQLite
    database (that API stopped with its command). Prefect stores UTC timestamps as text there."""
    import sqlite3
    from datetime import datetime, timezone

    def epoch(text: str | None) -> float | None:
        if text is None:
            return None
        t = datetime.fromisoformat(text)
        return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()

    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        row_ = con.execute("SELECT created, start_time, end_time FROM flow_run WHERE id = ?", (flow_run_id,)).fetchone()
        if row_ is None:
            raise RuntimeError(f"flow run {flow_run_id} not in {db}")
        tasks = con.execute("SELECT name, task_key, start_time, end_time FROM task_run WHERE flow_run_id = ?",
                            (flow_run_id,)).fetchall()
    from distributed.utils import key_split

    runs = [(key_split(key), epoch(start), epoch(end)) for name, key, start, end in tasks
            if not name.startswith(HARNESS_TASKS) and start and end]
    return dict(zip(("created", "start", "end"), map(epoch, row_))), sorted(runs, key=lambda x: x[1])


def _api_flow_run(flow_run_id: str) -> tuple[dict[str, float], list[tuple[str, float, float]]]:
    from prefect.client.orchestration import get_client

    runs = _task_runs(flow_run_id)
    with get_client(sync_client=True) as client:
        fr = client.read_flow_run(flow_run_id)
    return {"created": fr.created.timestamp(), "start": fr.start_time.timestamp(), "end": fr.end_time.timestamp()}, runs


def _cli_command(home: Path, api_url: str | None) -> dict[str, float]:
    name, scale = FLOOR_RUN
    out = home / "floor-report.json"
    env = _floor_env(home, api_url)
    t0, t1, _ = _timed([str(Path(sys.executable).parent / "mlsys-flows"), "run", name, "--scale", scale,
                        "--json", str(out)], env)
    run_id = json.loads(out.read_text())["run_id"]
    fr, runs = _api_flow_run(run_id) if api_url else _db_run(Path(env["PREFECT_HOME"]) / "prefect.db", run_id)
    if not runs:
        raise RuntimeError(f"no task runs recorded for flow run {run_id}")
    first, last = runs[0][1], max(e for _, _, e in runs)
    return {"total": t1 - t0, "to_first_task": first - t0, "body": last - first, "fixed": (t1 - t0) - (last - first),
            # the fixed cost, itemised by the flow run's own timestamps (they add up to it)
            "to_flow_run_created": fr["created"] - t0, "created_to_first_task": first - fr["created"],
            "last_task_to_flow_run_end": fr["end"] - last, "flow_run_end_to_exit": t1 - fr["end"]}


def measure_floor(repeats: int, home: Path, api_url: str | None, log=print) -> dict[str, Any]:
    """Part 6: per API, the CLI's smoke run and the plain flow back to back, their order alternating."""
    apis = {"server": api_url, "embedded": None} if api_url else {"embedded": None}
    commands = {"cli": _cli_command, "plain": _plain_command}
    load = {"before": list(os.getloadavg())}  # this part's own: a --merge keeps it beside the others'

    for api, url in apis.items():  # warm-up: databases created, caches filled; not measured
        for fn in commands.values():
            fn(home, url)
    samples = {api: {c: [] for c in commands} for api in apis}
    for r in range(repeats):
        for api, url in apis.items():
            for c in (list(commands) if r % 2 == 0 else list(commands)[::-1]):
                samples[api][c].append(commands[c](home, url))
            cli, plain = samples[api]["cli"][-1], samples[api]["plain"][-1]
            log(f"  floor repeat {r + 1}/{repeats} {api}: cli {cli['total']:.1f} s (body {cli['body']:.1f}, "
                f"first task {cli['to_first_task']:.1f}), plain {plain['total']:.1f} s")
    load["after"] = list(os.getloadavg())
    return {"run": "mlsys-flows run {} --scale {}".format(*FLOOR_RUN), "targets": FLOOR_TARGETS, "samples": samples,
            "load": load}


def floor_rows(d: dict[str, Any]) -> list[dict[str, Any]]:
    rows, t = [], d.get("targets", FLOOR_TARGETS)
    labels = {"server": "running server, its warm cluster", "embedded": "temporary API (the CLI's embedded one, "
              "Prefect's ephemeral one for the plain flow)"}
    for api, s in d["samples"].items():
        cli, plain = s["cli"], s["plain"]
        plain_total = [x["total"] for x in plain]
        rows.append(row("6 floor", f"{labels[api]}: plain Prefect flow, one task, torch imported: whole command",
                        "measured", "s", plain_total, digits=3))
        rows.append(row("6 floor", f"{labels[api]}: plain Prefect flow: command to first task", "measured", "s",
                        [x["to_first_task"] for x in plain], digits=3))
        for key, what in (("total", "whole command"),
                          ("body", "flow body (first task start to last task end)"),
                          ("to_first_task", "command to first task" + (
                              f" (target < {t['first_task_s']:g} s)" if api == "server" else "")),
                          ("to_flow_run_created", "  of which: command to flow run created (python, imports, "
                                                  "API, blocks)"),
                          ("created_to_first_task", "  of which: flow run created to first task (parameters, "
                                                    "storage check, cluster, workers warmed)"),
                          ("last_task_to_flow_run_end", "  after the body: last task end to flow run end (report "
                                                        "built and published, artifacts)"),
                          ("flow_run_end_to_exit", "  after the body: flow run end to process exit (table, teardown)")):
            vals = [x[key] for x in cli]
            ratios = paired_ratios(vals, [x["to_first_task"] for x in plain]) if key == "to_first_task" else None
            rows.append(row("6 floor", f"{labels[api]}: {d['run']}: {what}", "measured", "s", vals,
                            vs="plain flow's command to first task" if ratios else "", ratios=ratios, digits=3))
        fixed = [x["fixed"] for x in cli]
        rows.append(row("6 floor", f"{labels[api]}: {d['run']}: fixed cost (whole command minus flow body; target "
                        f"<= {t[api]:g}x the plain flow's whole command)", "measured", "s", fixed,
                        vs="plain flow's whole command", ratios=paired_ratios(fixed, plain_total), digits=3))
    return rows


def measure_transfer(mb: float, repeats: int, home: Path, log=print) -> dict[str, Any]:
    """Part 3: seconds from submitting the producer to the consumer's result, per route."""
    import dask
    from distributed import Client
    from prefect import flow

    from benchmarks import _overhead_tasks as T
    from mlsys_flows.blocks import DaskCluster
    from mlsys_flows.flows.common import tasks_on
    from mlsys_flows.runtime import shared_api

    folder = home / "transfer"
    store = _storage(folder)

    @flow(name="overhead-transfer", log_prints=False)
    def prefect_route(address: str, w0: str, w1: str, mode: str, rep: int) -> float:
        on = lambda w: dask.annotate(workers=[w], allow_other_workers=False)  # noqa: E731
        results = _storage(folder / "prefect-results") if mode == "prefect-persisted" else None
        with tasks_on(DaskCluster(address=address), results=results):
            t0 = time.perf_counter()
            if mode == "prefect-local":
                with on(w0):
                    value = T.make_and_use_task.submit(mb).result()
            elif mode == "prefect-storage-key":
                with on(w0):
                    key = T.make_to_storage_task.submit(mb, store, f"arrays/{rep}.npy")
                with on(w1):
                    value = T.use_from_storage_task.submit(store, key).result()
            else:
                with on(w0):
                    a = T.make_array_task.submit(mb)
                with on(w1):
                    value = T.use_array_task.submit(a).result()
            return time.perf_counter() - t0 if value > 0 else float("nan")

    def dask_route(client, w0, w1, mode) -> float:
        t0 = time.perf_counter()
        if mode == "dask-local":
            client.submit(T.make_and_use, mb, workers=[w0], pure=False).result()
        else:
            a = client.submit(T.make_array, mb, workers=[w0], pure=False)
            client.submit(T.use_array, a, workers=[w1], pure=False).result()
            del a
        return time.perf_counter() - t0

    modes = ["dask-local", "dask", "prefect-local", "prefect-dask", "prefect-persisted", "prefect-storage-key"]
    samples: dict[str, list[float]] = {m: [] for m in modes}
    persisted: list[int] = []
    # shared_api() before the cluster starts: its workers report to this process's API (see runtime.py)
    with shared_api(), _local_cluster() as cluster, Client(cluster) as client:
        w0, w1 = sorted(client.scheduler_info(n_workers=-1)["workers"])[:2]
        dask_route(client, w0, w1, "dask"), prefect_route(cluster.scheduler_address, w0, w1, "prefect-dask", -1)
        for r in range(repeats):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                if mode.startswith("dask"):
                    samples[mode].append(dask_route(client, w0, w1, mode))
                else:
                    samples[mode].append(prefect_route(cluster.scheduler_address, w0, w1, mode, r))
                if mode == "prefect-persisted":  # the harness's setting really wrote the results
                    persisted.append(sum(store.size(k) for k in store.list("prefect-results")))
                store.delete("arrays")
                store.delete("prefect-results")
            log(f"  transfer repeat {r + 1}/{repeats}: " + ", ".join(f"{m} {samples[m][-1]:.2f} s" for m in modes))
    shutil.rmtree(folder, ignore_errors=True)
    return {"mb": mb, "samples": samples, "persisted_bytes": persisted}


def transfer_rows(d: dict[str, Any]) -> list[dict[str, Any]]:
    s, mb = d["samples"], d["mb"]
    labels = {"dask-local": "plain Dask, produce and use in one task (nothing moved)",
              "dask": "plain Dask, result moved to the other worker",
              "prefect-local": "Prefect task, produce and use in one task (nothing moved)",
              "prefect-dask": "Prefect tasks, through Dask (task result)",
              "prefect-persisted": "Prefect tasks, result persisted on the storage block (harness setting)",
              "prefect-storage-key": "Prefect tasks, through the storage block by key (.npy)"}
    if d.get("persisted_bytes"):
        labels["prefect-persisted"] += f" ({statistics.median(d['persisted_bytes']) / 1e6:.0f} MB written per repeat)"
    rows = []
    for mode, label in labels.items():
        vs = "dask-local" if mode in ("dask", "prefect-local") else ("dask" if mode != "dask-local" else "")
        rows.append(row("3 transfer", f"{mb:g} MB: {label}", "measured", "s", s[mode],
                        vs=labels[vs] if vs else "", ratios=paired_ratios(s[mode], s[vs]) if vs else None, digits=3))
    return rows


def _task_runs(flow_run_id: str, wait_s: float = 60.0) -> list[tuple[str, float, float]]:
    """(function name, start, end) of every task run of a flow run and its subflows, the harness's
    own tasks and subflows' stand-in task runs left out. Prefect records task runs from events, a
    moment after they happen: read until every run has ended and the count is stable."""
    from distributed.utils import key_split
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId

    deadline, last = time.monotonic() + wait_s, None
    while True:
        runs, pending = [], 0
        with get_client(sync_client=True) as client:
            stack = [flow_run_id]
            while stack:
                rid = stack.pop()
                children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[rid])))
                stack += [str(c.id) for c in children]
                standins = {c.parent_task_run_id for c in children}
                for tr in client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[rid]))):
                    if tr.id in standins or tr.name.startswith(HARNESS_TASKS):
                        continue
                    if tr.start_time is None or tr.end_time is None:
                        pending += 1
                        continue
                    runs.append((key_split(tr.task_key), tr.start_time.timestamp(), tr.end_time.timestamp()))
        if (pending == 0 and runs and len(runs) == last) or time.monotonic() > deadline:
            return sorted(runs, key=lambda x: x[1])
        last = len(runs)
        time.sleep(1.0)


def _run_flow(name: str, scale: str, overrides: dict[str, Any], home: Path, n_workers: int = 2,
              warm_workers: bool = True) -> dict[str, Any]:
    from mlsys_flows.blocks import DaskCluster
    from mlsys_flows.platform.runner import run_system

    storage = _storage(home / "runs")
    # the default shape: no cluster given, as `mlsys-flows bench` runs (the server's warm cluster when it has one)
    cluster = None if (n_workers, warm_workers) == (2, True) else DaskCluster(n_workers=n_workers,
                                                                              warm_workers=warm_workers)
    t0 = time.time()
    report = run_system(name, scale, overrides, storage=storage, cluster=cluster)
    t1 = time.time()
    storage.delete(f"runs/{name}")  # the run's data; its report stays under reports/
    storage.delete("task-results")
    return {"system": name, "scale": scale, "overrides": overrides, "n_workers": n_workers,
            **_share_of_run(report.run_id, t0, t1, report.wall_time_s)}


def _share_of_run(run_id: str, t0: float, t1: float, body_s: float) -> dict[str, Any]:
    """Orchestration's share of the run ``run_id`` between ``t0`` and ``t1`` (epoch seconds), from its
    task runs as the Prefect API recorded them."""
    runs = _task_runs(run_id)
    share = orchestration_share(t1 - t0, [(s, e) for _, s, e in runs], window=(t0, t1))
    body = orchestration_share(body_s, [(s, e) for _, s, e in runs], window=(t0, t1))
    return {"run_id": run_id, "wall_s": t1 - t0, "body_s": body_s, "task_runs": len(runs), **share,
            "body_share": body["share"], "first_task_s": (runs[0][1] - t0) if runs else None,
            "after_last_task_s": (t1 - max(e for _, _, e in runs)) if runs else None,
            "between_tasks_s": (max(e for _, _, e in runs) - runs[0][1] - busy_time([(s, e) for _, s, e in runs]))
            if runs else None, "gaps": idle_gaps(runs), "stages": stage_table(runs)}


def recorded_shares(systems: Sequence[str], scale: str, results: Path, log=print) -> dict[str, Any]:
    """Part 4 without rerunning anything: the runs of the committed RunReports
    (``results/<system>-<scale>.json``, as `mlsys-flows bench all --record` leaves them), read back
    from the Prefect API that recorded them (the current ``PREFECT_API_URL``). The wall time is the
    flow run's life in the API, from its creation to its end state; the process start and imports
    before it are part 2's."""
    from prefect.client.orchestration import get_client

    out: dict[str, list[dict[str, Any]]] = {}
    for name in systems:
        path = results / f"{name}-{scale}.json"
        try:
            report = json.loads(path.read_text())
            with get_client(sync_client=True) as client:
                fr = client.read_flow_run(report["run_id"])
            if fr.end_time is None:
                raise RuntimeError(f"flow run {report['run_id']} has not ended ({fr.state_type})")
            res = {"system": name, "scale": scale, "overrides": {}, "n_workers": None, "report": str(path.name),
                   **_share_of_run(report["run_id"], fr.created.timestamp(), fr.end_time.timestamp(),
                                   report["wall_time_s"])}
        except Exception as exc:  # noqa: BLE001 - one missing run must not lose the others
            log(f"  share {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
            out[name] = [{"system": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}]
            continue
        out[name] = [res]
        log(f"  share {name} (recorded run {res['run_id'][:8]}): wall {res['wall_s']:.1f} s, tasks busy "
            f"{res['task_busy_s']:.1f} s, orchestration {res['orchestration_s']:.1f} s = {res['share']:.1%}")
    return {"scale": scale, "runs": out, "source": f"recorded runs of {results.name}/<system>-{scale}.json"}


def measure_shares(systems: Sequence[str], scale: str, repeats: int, home: Path, log=print,
                   into: dict[str, Any] | None = None) -> dict[str, Any]:
    """Part 4: every named flow at ``scale``, ``repeats`` runs each (filling ``into`` as it goes)."""
    result = into if into is not None else {}
    out: dict[str, list[dict[str, Any]]] = {}
    result.update({"scale": scale, "runs": out})
    for r in range(repeats):
        for name in systems:
            try:
                res = _run_flow(name, scale, {}, home)
            except Exception as exc:  # noqa: BLE001 - one failing flow must not lose the others
                log(f"  share {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
                out.setdefault(name, []).append({"system": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                continue
            out.setdefault(name, []).append(res)
            log(f"  share {name} ({r + 1}/{repeats}): wall {res['wall_s']:.1f} s, tasks busy {res['task_busy_s']:.1f} s, "
                f"orchestration {res['orchestration_s']:.1f} s = {res['share']:.1%} (body only {res['body_share']:.1%})")
    return result


def measure_warmup(systems: Sequence[str], scale: str, repeats: int, home: Path, log=print) -> dict[str, Any]:
    """Part 4b: each flow with cold workers (each imports the flow's modules on its first task) and
    warm ones (``DaskCluster.warm_workers``: all import at once when the run starts), back to back,
    alternating which goes first."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in range(repeats):
        for i, name in enumerate(systems):
            for warm in ((False, True) if (r + i) % 2 == 0 else (True, False)):
                label = "warm" if warm else "cold"
                try:
                    res = _run_flow(name, scale, {}, home, warm_workers=warm)
                except Exception as exc:  # noqa: BLE001
                    log(f"  warmup {name} {label}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                out.setdefault(name, {}).setdefault(label, []).append(res)
                log(f"  warmup {name} {label} ({r + 1}/{repeats}): wall {res['wall_s']:.1f} s, orchestration "
                    f"{res['orchestration_s']:.1f} s = {res['share']:.1%}")
    return {"scale": scale, "runs": out}


def warmup_rows(d: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, by in d["runs"].items():
        if not {"cold", "warm"} <= set(by):
            continue
        cold, warm = by["cold"], by["warm"]
        n = min(len(cold), len(warm))
        for key, what, unit, scale_ in (("orchestration_s", "orchestration seconds", "s", 1),
                                        ("share", "orchestration share of the command's wall time", "%", 100)):
            c, w = [scale_ * x[key] for x in cold[:n]], [scale_ * x[key] for x in warm[:n]]
            rows.append(row("4b warm workers", f"{name} at {d['scale']}: {what}, cold workers", "measured", unit, c,
                            digits=3))
            rows.append(row("4b warm workers", f"{name} at {d['scale']}: {what}, warm workers", "measured", unit, w,
                            vs="cold workers", ratios=paired_ratios(c, w), digits=3))
    return rows


def shares_rows(d: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, runs in d["runs"].items():
        ok = [x for x in runs if "error" not in x]
        if not ok:
            rows.append({c: None for c in COLUMNS} | {"part": "4 shares", "what": f"{name}: FAILED ({runs[0]['error'][:120]})"})
            continue
        wall = "the recorded flow run's wall time" if d.get("source") else "the command's wall time"
        rows.append(row("4 shares", f"{name} at {d['scale']}: orchestration share of {wall}",
                        "measured", "%", [100 * x["share"] for x in ok], digits=3))
        x = ok[0] if len(ok) == 1 else None  # the breakdown of a single run
        detail = (f"; {x['first_task_s']:.1f} s before the first task, {x['after_last_task_s']:.1f} s after the last"
                  if x and x["first_task_s"] is not None else "")
        if x and x.get("gaps"):  # where the seconds between tasks go
            detail += (f", {x['between_tasks_s']:.1f} s between tasks, longest " +
                       ", ".join(f"{g['s']:.1f} s after {g['after']} before {g['before']}" for g in x["gaps"]))
        rows.append(row("4 shares", f"{name} at {d['scale']}: orchestration seconds (wall "
                        f"{statistics.median(x['wall_s'] for x in ok):.1f} s, {ok[0]['task_runs']} task runs{detail})",
                        "measured", "s", [x["orchestration_s"] for x in ok], digits=3))
        rows.append(row("4 shares", f"{name} at {d['scale']}: share of the flow body's time only", "measured", "%",
                        [100 * x["body_share"] for x in ok], digits=3))
    return rows


def measure_scaling(systems: Sequence[str], scale: str, factors: Sequence[float], home: Path,
                    log=print, into: dict[str, Any] | None = None) -> dict[str, Any]:
    """Part 5: each system at each size factor with 1 and 2 workers, back to back (filling ``into``)."""
    from mlsys_flows import registry

    result = into if into is not None else {}
    out: dict[str, list[dict[str, Any]]] = {}
    result.update({"scale": scale, "factors": list(factors), "runs": out})
    for name in systems:
        base = registry.get(name).params_model().for_scale(scale)
        for i, f in enumerate(factors):
            overrides = {p: max(2, round(getattr(base, p) * f)) for p in SCALING[name]}
            for workers in ((1, 2) if i % 2 == 0 else (2, 1)):  # alternate which goes first
                try:
                    res = _run_flow(name, scale, overrides, home, n_workers=workers)
                except Exception as exc:  # noqa: BLE001
                    log(f"  scaling {name} x{f} {workers}w: FAILED {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                res["factor"] = f
                out.setdefault(name, []).append(res)
                log(f"  scaling {name} x{f:g} ({overrides}) {workers} worker(s): wall {res['wall_s']:.1f} s, "
                    f"body {res['body_s']:.1f} s")
    return result


def scaling_summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size factor: body time with 1 and 2 workers, the parallel stages (task functions whose runs
    overlap in any 2-worker run of the system: a tiny size may not show it) and their 2-worker speedup
    (their summed span with 1 worker / with 2)."""
    parallel = sorted({n for r in runs if r["n_workers"] == 2 for n, st in r["stages"].items() if st["concurrency"] >= 2})
    out = []
    for f in sorted({r["factor"] for r in runs}):
        one = next((r for r in runs if r["factor"] == f and r["n_workers"] == 1), None)
        two = next((r for r in runs if r["factor"] == f and r["n_workers"] == 2), None)
        if one is None or two is None:
            continue
        p1, p2 = parallel_stage_time(one["stages"], parallel), parallel_stage_time(two["stages"], parallel)
        out.append({"factor": f, "overrides": one["overrides"], "body_1w_s": one["body_s"], "body_2w_s": two["body_s"],
                    "wall_1w_s": one["wall_s"], "wall_2w_s": two["wall_s"], "busy_1w_s": one["task_busy_s"],
                    "busy_2w_s": two["task_busy_s"], "parallel_stages": parallel,
                    "parallel_1w_s": p1, "parallel_2w_s": p2,
                    "parallel_speedup": (p1 / p2) if parallel and p2 > 0 else None,
                    "body_speedup": one["body_s"] / two["body_s"]})
    return out


def scaling_rows(d: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, runs in d["runs"].items():
        for s in scaling_summary(runs):
            size = ", ".join(f"{k}={v}" for k, v in s["overrides"].items())
            rows.append(row("5 scaling", f"{name} ({size}): flow body, 1 worker", "measured", "s", [s["body_1w_s"]], digits=3))
            rows.append(row("5 scaling", f"{name} ({size}): flow body, 2 workers", "measured", "s", [s["body_2w_s"]],
                            vs="1 worker", ratios=summary([s["body_2w_s"] / s["body_1w_s"]]), digits=3))
            rows.append(row("5 scaling", f"{name} ({size}): 2-worker speedup of the flow body (1-worker time / 2-worker)",
                            "measured", "x", [s["body_speedup"]], digits=3))
            if s["parallel_speedup"] is not None:
                rows.append(row("5 scaling", f"{name} ({size}): 2-worker speedup of the parallel stages "
                                f"({', '.join(s['parallel_stages'])}; {s['parallel_1w_s']:.1f} s -> {s['parallel_2w_s']:.1f} s)",
                                "measured", "x", [s["parallel_speedup"]], digits=3))
            else:
                rows.append({c: None for c in COLUMNS} | {
                    "part": "5 scaling", "what": f"{name} ({size}): no parallel stage (its tasks never overlap)",
                    "kind": "measured"})
    return rows


# ====================================================================================================
# Plots, JSON, docs
# ====================================================================================================
def plot_scaling(d: dict[str, Any], img: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, runs in d["runs"].items():
        summ = scaling_summary(runs)
        if not summ:
            continue
        fig, ax = plt.subplots(figsize=(5.8, 3.8))
        param = SCALING.get(name, ("size",))[0]
        xs = [s["overrides"].get(param, s["factor"]) for s in summ]
        ax.plot(xs, [s["body_1w_s"] for s in summ], "o-", label="flow body, 1 worker")
        ax.plot(xs, [s["body_2w_s"] for s in summ], "s-", label="flow body, 2 workers")
        ax.plot(xs, [s["busy_1w_s"] for s in summ], "o-.", label="task work (busy union), 1 worker")
        if any(s["parallel_speedup"] for s in summ):
            ax.plot(xs, [s["parallel_1w_s"] for s in summ], "o--", label="parallel stages, 1 worker")
            ax.plot(xs, [s["parallel_2w_s"] for s in summ], "s--", label="parallel stages, 2 workers")
        ax.plot(xs, [summ[0]["busy_1w_s"] * x / xs[0] for x in xs], ":", color="grey",
                label="linear from the smallest task work")
        others = [p for p in SCALING.get(name, ())[1:]]
        ax.set_xlabel(f"{param}" + (f" ({', '.join(others)} scaled alike)" if others else ""))
        ax.set_ylabel("seconds (measured)")
        ax.set_title(f"{name}: time against data size ({d['scale']} preset x {', '.join(f'{f:g}' for f in d['factors'])})",
                     fontsize=9)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = img / f"overhead-scaling-{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_shares(d: dict[str, Any], img: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [(n, statistics.median(x["share"] for x in rs if "error" not in x) * 100,
             statistics.median(x["wall_s"] for x in rs if "error" not in x))
            for n, rs in d["runs"].items() if any("error" not in x for x in rs)]
    if not data:
        return []
    fig, ax = plt.subplots(figsize=(6.5, 0.3 * len(data) + 1.4))
    ax.barh([n for n, _, _ in data], [s for _, s, _ in data], color="tab:orange")
    for i, (_, s, w) in enumerate(data):
        ax.text(s, i, f" {s:.0f}% of {w:.0f} s", va="center", fontsize=7)
    ax.axvline(5, color="grey", ls=":", lw=1)
    ax.set_xlim(0, max(s for _, s, _ in data) * 1.25 + 1)
    ax.set_xlabel(f"orchestration share of wall time, % (measured, {d['scale']})")
    ax.invert_yaxis()
    fig.tight_layout()
    path = img / "overhead-shares.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def machine() -> dict[str, Any]:
    import importlib.metadata as md

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    versions = {}
    for pkg in ("prefect", "prefect-dask", "distributed", "numpy"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "versions": versions, "commit": commit or None, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_before": None, "load_after": None}


def markdown(result: dict[str, Any]) -> str:
    cols = result["columns"]
    fmt = lambda v: "" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in result["rows"]]
    m = result["machine"]
    lines += ["", f"Measured on {m['cpu']} ({m['cores']} cores)."]
    for part, d in result["details"].items():
        at = d.get("measured") or {"commit": m["commit"], "date": m["date"], "api": result["api"]}
        lines.append(f"- {part}: {at['date']}, commit {at['commit']}, API: {at['api']}.")
    lines.append(f"- Last run: load average {m['load_before']} before and {m['load_after']} after.")
    lines += [f"- {n}" for n in result["notes"]]
    return "\n".join(lines)


def write_docs(result: dict[str, Any], doc: Path = DOC) -> None:
    text = doc.read_text()
    start, end = "<!-- overhead:start -->", "<!-- overhead:end -->"
    if start not in text or end not in text:
        raise RuntimeError(f"{doc} lacks the {start} / {end} markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{start}\n{markdown(result)}\n{end}{tail}")


NOTES = [
    "kind: every number is measured (wall clock on this machine); n is the number of repeats, the value the median and "
    "min/max the range over them; a ratio is taken per repeat (variants of one repeat run back to back) and summarised.",
    "1 tasks: the same trivial function; a Prefect task's extra cost is its task run (state calls to the API, "
    "events, result handling), which plain Dask does not have.",
    "2 fixed: a new python process runs the harness's imports, one flow whose one task stamps its start and end, and "
    "exits; the embedded API's home was warmed by one unmeasured run first. The 'of which' rows split the whole "
    "command by stamps the child takes (they add up to it).",
    "3 transfer: the producer is pinned to one Dask worker and the consumer to the other, so the array really moves; "
    "'persisted' is the harness's setting (every result also written to the storage block).",
    "4 shares: orchestration = the command's wall time minus the union of the system's task runs' busy intervals "
    "(Running to terminal state, read from the Prefect API after the run; the harness's publish-report task counts as "
    "orchestration). Work a flow does in its body outside tasks counts as orchestration too. Reusing the runs of a "
    "`bench all --record` sweep (--shares-from), the wall time is each flow run's life in the API, from its creation to "
    "its end state; the process's start and imports before it are part 2's fixed cost.",
    "4b warm workers: the same flow rerun back to back with DaskCluster(warm_workers=False) (each worker imports the "
    "flow's modules on its first task: the default before) and warm_workers=True (every worker imports them when the "
    "run starts, in parallel; the import time counts as orchestration); the ratio is cold over warm.",
    "5 scaling: parallel stages are task functions whose runs overlap in a 2-worker run; their speedup is their summed span "
    "with 1 worker over 2 workers. A flow whose tasks run one after another (cedar, dsi) has none.",
    "6 floor: issue 42 item 4's targets. Each repeat runs `mlsys-flows run placement --scale smoke --json` and "
    "`python benchmarks/_plain_flow.py` (one Prefect task, torch imported) back to back, their order alternating, after "
    "one unmeasured warm-up of each; the ratio of a fixed cost is taken per repeat against the plain flow's whole "
    "command on the same API. The CLI's flow body and timestamps come from its flow run as the API recorded it (the "
    "embedded API's SQLite database once it stopped).",
]


def build_result(details: dict[str, Any], api: str, info: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for part, fn in (("tasks", tasks_rows), ("fixed", fixed_rows), ("transfer", transfer_rows),
                     ("shares", shares_rows), ("warmup", warmup_rows), ("scaling", scaling_rows),
                     ("floor", floor_rows)):
        if part in details:
            rows += fn(details[part])
    return {"columns": COLUMNS, "rows": rows, "notes": NOTES, "machine": info, "api": api, "details": details}


# ====================================================================================================
# Command line
# ====================================================================================================
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--systems", default="all", help="flows for 'shares' (comma-separated, or 'all' implemented)")
    ap.add_argument("--scaling-systems", default=",".join(SCALING), help="flows for 'scaling' (of " + ",".join(SCALING) + ")")
    ap.add_argument("--scale", default="quick", help="scale of 'shares' and 'scaling' (smoke | quick | full)")
    ap.add_argument("--sizes", default="0.25,0.5,1", help="data-size factors of 'scaling' (times the scale's preset)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats of 'tasks', 'fixed' and 'transfer'")
    ap.add_argument("--share-repeats", type=int, default=1, help="runs of each flow in 'shares'")
    ap.add_argument("--shares-from", type=Path, metavar="RESULTS", help="'shares' reruns nothing: it reads the runs of "
                    "the RunReports in this folder (as `mlsys-flows bench all --record` leaves them) back from the "
                    "Prefect API at PREFECT_API_URL, which recorded them")
    ap.add_argument("--merge", type=Path, metavar="JSON", help="keep the other parts' details of this earlier "
                    "overhead.json (replace only the parts measured now)")
    ap.add_argument("--n-tasks", type=int, default=200, help="tasks per repeat in 'tasks'")
    ap.add_argument("--mb", type=float, default=100.0, help="array size of 'transfer', MB")
    ap.add_argument("--api", choices=("server", "embedded"), default="server",
                    help="Prefect API of this process's flows: a Prefect server started here (default) or the embedded one")
    ap.add_argument("--home", type=Path, default=REPO / ".mlsys-flows" / "overhead", help="working folder (kept warm)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--img", type=Path, default=IMG)
    ap.add_argument("--docs", action="store_true", help=f"also fill the tables of {DOC.relative_to(REPO)}")
    ap.add_argument("--render", type=Path, metavar="JSON", help="measure nothing: rebuild the table, plots and docs "
                    "from the details of an earlier overhead.json")
    ap.add_argument("--child-fixed", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_fixed:
        _fixed_child(args.child_fixed)
        return 0
    if args.render:
        earlier = json.loads(args.render.read_text())
        return _write_outputs(build_result(earlier["details"], earlier["api"], earlier["machine"]), args)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if bad := [p for p in parts if p not in PARTS]:
        ap.error(f"unknown part(s) {bad}; choose from {PARTS}")
    scaling_systems = [s for s in args.scaling_systems.split(",") if s]
    if bad := [s for s in scaling_systems if s not in SCALING]:
        ap.error(f"--scaling-systems: no size parameters known for {bad} (known: {', '.join(SCALING)})")
    home = args.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["MLSYS_FLOWS_HOME"] = str(home)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    if str(REPO) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):  # Dask workers import benchmarks.*
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    info = machine()
    info["load_before"] = list(os.getloadavg())
    running_api = os.environ.get("PREFECT_API_URL") if args.api == "server" else None
    # Prefect reads its settings when imported: choose its home (and below, the API) first.
    os.environ["PREFECT_HOME"] = str(home / ("prefect-client" if args.api == "server" else "prefect-embedded"))
    from mlsys_flows.settings import configure_prefect_home

    if args.api == "embedded":
        os.environ.pop("PREFECT_API_URL", None)
    configure_prefect_home()
    platform_ = None
    details: dict[str, Any] = {}
    started = time.perf_counter()
    stack = contextlib.ExitStack()
    try:
        if running_api:
            print(f"Prefect API {running_api} (PREFECT_API_URL)", flush=True)
        elif args.api == "server":
            from mlsys_flows.platform.server import LocalPlatform
            from mlsys_flows.systems.common.net import free_port

            print("starting a Prefect server on 127.0.0.1 ...", flush=True)
            platform_ = LocalPlatform(port=free_port(), root=home, worker=False).start()
            from prefect.settings import PREFECT_API_URL, temporary_settings

            os.environ["PREFECT_API_URL"] = platform_.api_url  # Dask workers and child processes
            stack.enter_context(temporary_settings(updates={PREFECT_API_URL: platform_.api_url}))  # this process
            print(f"Prefect API {platform_.api_url}", flush=True)
        api_url = running_api or (platform_.api_url if platform_ else None)
        if "tasks" in parts:
            print(f"1 tasks: {args.n_tasks} trivial tasks x {args.repeats} repeats", flush=True)
            details["tasks"] = measure_tasks(args.n_tasks, args.repeats, home)
        if "fixed" in parts:
            print(f"2 fixed: {args.repeats} repeats per API", flush=True)
            details["fixed"] = measure_fixed(args.repeats, home, api_url)
        if "transfer" in parts:
            print(f"3 transfer: {args.mb:g} MB x {args.repeats} repeats", flush=True)
            details["transfer"] = measure_transfer(args.mb, args.repeats, home)
        if "shares" in parts:
            from mlsys_flows import registry

            systems = registry.names() if args.systems == "all" else args.systems.split(",")
            if args.shares_from:
                print(f"4 shares: the recorded runs of {len(systems)} flows at {args.scale} ({args.shares_from})", flush=True)
                details["shares"] = recorded_shares(systems, args.scale, args.shares_from.resolve())
            else:
                print(f"4 shares: {len(systems)} flows at {args.scale}", flush=True)
                measure_shares(systems, args.scale, args.share_repeats, home, into=details.setdefault("shares", {}))
        if "warmup" in parts:
            from mlsys_flows import registry

            systems = registry.names() if args.systems == "all" else args.systems.split(",")
            print(f"4b warm workers: {len(systems)} flows at {args.scale}, cold vs warm workers", flush=True)
            details["warmup"] = measure_warmup(systems, args.scale, args.share_repeats, home)
        if "scaling" in parts:
            factors = [float(x) for x in args.sizes.split(",")]
            print(f"5 scaling: {scaling_systems} x sizes {factors} x 1/2 workers at {args.scale}", flush=True)
            measure_scaling(scaling_systems, args.scale, factors, home, into=details.setdefault("scaling", {}))
        if "floor" in parts:
            print(f"6 floor: {args.repeats} repeats per API", flush=True)
            details["floor"] = measure_floor(args.repeats, home, api_url)
    except KeyboardInterrupt:  # Ctrl-C: keep what was measured
        print("interrupted: writing what was measured so far", flush=True)
        info["interrupted"] = True
    finally:
        stack.close()
        if platform_ is not None:
            platform_.stop()
    info["load_after"] = list(os.getloadavg())
    info["duration_s"] = round(time.perf_counter() - started, 1)
    api = (f"the running Prefect server at {running_api}" if running_api else
           "a Prefect server on 127.0.0.1 started by the benchmark" if args.api == "server" else
           "the embedded (temporary) API")
    for part in details:  # where and when each part was measured (parts of a --merge keep theirs)
        details[part]["measured"] = {"commit": info["commit"], "date": info["date"], "api": api}
    if args.merge:
        earlier = json.loads(args.merge.read_text())
        for part, d in earlier["details"].items():
            if part not in details:
                d.setdefault("measured", {k: earlier["machine"][k] for k in ("commit", "date")} | {"api": earlier["api"]})
                details[part] = d
        details = {p: details[p] for p in PARTS if p in details}
    return _write_outputs(build_result(details, api, info), args)


def _write_outputs(result: dict[str, Any], args) -> int:
    details = result["details"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {args.out}")
    args.img.mkdir(parents=True, exist_ok=True)
    written = []
    if "scaling" in details:
        written += plot_scaling(details["scaling"], args.img)
    if "shares" in details:
        written += plot_shares(details["shares"], args.img)
    for p in written:
        print(f"wrote {p}")
    if args.docs:
        write_docs(result)
        print(f"wrote {DOC}")
    print(markdown(result))
    return 0

if __name__ == "__main__":
    sys.exit(main())
