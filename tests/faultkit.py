"""Helpers of the reliability tests: real Dask processes, Prefect API reads, report comparison.

Importable from every test folder (pytest puts tests/ on sys.path for its conftest.py).
"""
from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mlsys_flows import registry

BIN = Path(sys.executable).parent


def implemented() -> list[str]:
    return [s.name for s in registry.implemented()]


def fault_systems(names: list[str] | None = None) -> list[str]:
    """``names`` (default: every implemented system), narrowed by MLSYS_FAULTS=name,name,... while
    developing one system (`make test` leaves it unset: every system)."""
    names = implemented() if names is None else names
    only = [n.strip() for n in os.environ.get("MLSYS_FAULTS", "").split(",") if n.strip()]
    unknown = set(only) - set(implemented())
    if unknown:
        raise ValueError(f"MLSYS_FAULTS names unknown systems: {sorted(unknown)}")
    return [n for n in names if n in only] if only else names


# ----- RunReport: the fields that must not change when a fault is recovered -----------------------
def deterministic_view(report: dict[str, Any]) -> dict[str, Any]:
    """Everything a fault must not change: system, scale, parameters, variants and their metric
    names, the values of the report's deterministic metrics, the ratios' identities (and values
    where their metric is deterministic), curve identities. Excluded: run_id, created_at,
    environment, wall_time_s, timing-derived metrics, notes (they quote timings)."""
    det = set(report.get("deterministic_metrics", []))

    def ratio(r):
        keep = {k: r[k] for k in ("metric", "baseline", "technique", "better", "kind", "paper")}
        if r["metric"] in det:
            keep.update(baseline_value=_num(r["baseline_value"]), technique_value=_num(r["technique_value"]))
        return keep

    return {
        "system": report["system"], "scale": report["scale"], "parameters": report["parameters"],
        "variants": {v: {m: (_num(x) if m in det else "timing") for m, x in sorted(ms.items())}
                     for v, ms in sorted(report["variants"].items())},
        "headline": ratio(report["headline"]),
        "ratios": [ratio(r) for r in report["ratios"]],
        "curves": [(c["title"], c["x_label"], c["y_label"], sorted(c["series"])) for c in report["curves"]],
        "deterministic_metrics": sorted(det),
    }


def _num(x: float) -> Any:
    """Rounded to 9 significant digits: equal up to float summation order across processes."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return str(x)
    return float(f"{x:.9g}")


# ----- Prefect API reads ---------------------------------------------------------------------------
def task_runs_of(flow_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def child_flow_runs(flow_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))


def body_task_durations(flow_run_id) -> dict[str, float]:
    """Seconds each task function of a flow's body (the tasks it ran on the Dask cluster, in the
    run itself or in a subflow of the body) ran, its longest run, keyed by function name: the
    prefix of the task's Dask key. The harness's own ``publish-report`` task is left out."""
    from distributed.utils import key_split

    durations: dict[str, float] = {}
    stack = [flow_run_id]
    while stack:
        run_id = stack.pop()
        children = child_flow_runs(run_id)
        stack += [child.id for child in children]
        subflow_calls = {child.parent_task_run_id for child in children}  # not tasks: subflows' stand-ins
        for tr in task_runs_of(run_id):
            if tr.id not in subflow_calls and not tr.name.startswith("publish-report"):
                name, seconds = key_split(tr.task_key), tr.total_run_time.total_seconds()
                durations[name] = max(seconds, durations.get(name, 0.0))
    return durations


# ----- real Dask processes on loopback -------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaskProcesses:
    """``dask scheduler`` and ``dask worker`` processes on 127.0.0.1 (no nanny, one thread each,
    so a SIGKILL takes the worker and its running task down for good)."""

    def __init__(self, n_workers: int = 2, env: dict[str, str] | None = None):
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        # What a nanny would set: one BLAS/OpenMP thread per worker thread.
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                    "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "error", **(env or {})}
        self.n_workers = n_workers
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    def __enter__(self) -> "DaskProcesses":
        self.scheduler = self._spawn(["scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--no-dashboard", "--no-show"])
        for _ in range(self.n_workers):
            self.add_worker()
        self.wait_for_workers(self.n_workers)
        return self

    def _spawn(self, args: list[str]) -> subprocess.Popen:
        return subprocess.Popen([str(BIN / "dask"), *args], env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    def add_worker(self) -> subprocess.Popen:
        proc = self._spawn(["worker", self.address, "--host", "127.0.0.1", "--nthreads", "1", "--no-nanny",
                            "--no-dashboard", "--memory-limit", "0"])
        self.workers.append(proc)
        return proc

    def client(self):
        from distributed import Client

        return Client(self.address, timeout=30, set_as_default=False)

    def wait_for_workers(self, n: int, timeout: float = 60) -> None:
        with self.client() as c:
            c.wait_for_workers(n, timeout=timeout)

    def __exit__(self, *exc) -> None:
        for proc in [*self.workers, self.scheduler]:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in [*self.workers, self.scheduler]:
            if proc is None:
                continue
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def kill_process_group(proc: subprocess.Popen) -> None:
    """SIGKILL a process started with start_new_session=True and everything it spawned."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def wait_until(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def leaf_diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two JSON-like values differ, for readable assertion messages."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in leaf_diff(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in leaf_diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


# ----- one fault-free reference run per system, shared by the fault tests of a session ---------------
_REFERENCES: dict[str, tuple[dict, Any]] = {}
REFERENCE_RUN_KEY = "reference"


def reference_run(name: str) -> tuple[dict[str, Any], Any]:
    """(RunReport, storage) of a fault-free smoke run (embedded cluster, run key ``reference``).
    Needs the Prefect API (the ``prefect_api`` fixture)."""
    if name not in _REFERENCES:
        import atexit
        import shutil
        import tempfile

        from mlsys_flows.blocks import ObjectStorage

        folder = tempfile.mkdtemp(prefix=f"mlsys-ref-{name}-")
        atexit.register(shutil.rmtree, folder, True)
        storage = ObjectStorage(url=Path(folder).as_uri())
        report = registry.get(name).load_flow()(scale="smoke", storage=storage, run_key=REFERENCE_RUN_KEY)
        _REFERENCES[name] = (report, storage)
    return _REFERENCES[name]

