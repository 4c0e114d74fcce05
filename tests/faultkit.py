"""Helpers of the reliability tests: real Dask processes, Prefect API reads, report comparison.

Importable from every test folder (pytest puts tests/ on sys.path for its conftest.py).
"""
from __future__ import annotations

import json
import math
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from mlsys_flows import registry

BIN = Path(sys.executable).parent


def implemented() -> list[str]:
    return registry.names()


def fault_systems(names: list[str] | None = None) -> list[str]:
    """``names`` (default: every implemented system), narrowed by MLSYS_FAULTS=name,name,... while
    developing one system (`make test` leaves it unset: every system)."""
    names = implemented() if names is None else names
    only = [n.strip() for n in os.environ.get("MLSYS_FAULTS", "").split(",") if n.strip()]
    unknown = set(only) - set(implemented())
    if unknown:
        raise ValueError(f"MLSYS_FAULTS names unknown systems: {sorted(unknown)}")
    return [n for n in names if n in only] if only else names


def survivors(family: list, grace_s: float = 10.0) -> list:
    """The processes of ``family`` still alive (zombies aside) once each has had ``grace_s`` to
    finish exiting: a child whose parent has just returned can be mid-exit (empty cmdline), and is
    not a stray. ``grace_s`` is a hang guard; an exiting process is gone in milliseconds."""
    import psutil

    _, alive = psutil.wait_procs(family, timeout=grace_s)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


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
        # the panels, not their series: a series may follow a timed choice (recycle's Oobleck rows); the
        # variants they draw are compared above
        "curves": [(c["title"], c["x_label"], c["y_label"]) for c in report["curves"]],
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


def rank_states(client) -> dict:
    """Each worker's ``rank_state()``: whether it still runs a torch.distributed rank or belongs to a
    process group."""
    from mlsys_flows.platform.ranks import rank_state

    return client.run(rank_state)


def ranks_idle(states: dict) -> bool:
    return bool(states) and all(s == {"rank_running": False, "process_group": False} for s in states.values())


def no_rank_left(client) -> None:
    """No worker of ``client``'s cluster runs a rank or belongs to a process group (issue 32)."""
    states = rank_states(client)
    assert ranks_idle(states), states


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
class DaskProcesses:
    """``dask scheduler`` and ``dask worker`` processes on 127.0.0.1 (no nanny, one thread each,
    so a SIGKILL takes the worker and its running task down for good). The workers are forked from a
    zygote that imported their heavy modules once (tests/dask_zygote.py): a replacement started after
    a kill is a new process that skips 5-10 s of imports.

    The scheduler binds a port of its own choosing and names it in its scheduler file: a port picked
    here and bound seconds later by a slow-starting scheduler can be taken meanwhile, and a client
    retrying a port nobody listens on can connect to itself (a loopback TCP self-connect), then
    waits forever in distributed's handshake read, which has no timeout (seen once in CI: a
    600 s hang in ``Client(...)``). Clients connect only after the file exists."""

    def __init__(self, n_workers: int = 2, env: dict[str, str] | None = None):
        self.workdir = Path(tempfile.mkdtemp(prefix="mlsys-dask-"))
        self.scheduler_file = self.workdir / "scheduler.json"
        self.address = ""
        # What a nanny would set: one BLAS/OpenMP thread per worker thread.
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                    "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "error", **(env or {})}
        self.n_workers = n_workers
        self.scheduler: subprocess.Popen | None = None
        self.zygote: subprocess.Popen | None = None
        self._zygote_lock = threading.Lock()  # add_worker runs in the kill watcher's thread too
        self.workers: list[ForkedWorker] = []

    def __enter__(self) -> "DaskProcesses":
        try:
            self.scheduler = self._spawn("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", "0",
                                                       "--scheduler-file", str(self.scheduler_file),
                                                       "--no-dashboard", "--dashboard-address", "127.0.0.1:0",
                                                       "--no-show"])
            self.address = self._wait_for_scheduler_file()
            for _ in range(self.n_workers):
                self.add_worker()
            self.wait_for_workers(self.n_workers)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_for_scheduler_file(self, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.scheduler.poll() is not None:
                raise RuntimeError(f"dask scheduler exited with {self.scheduler.returncode}: "
                                   f"{self._log_tail('scheduler')}")
            try:
                return json.loads(self.scheduler_file.read_text())["address"]
            except (FileNotFoundError, json.JSONDecodeError, KeyError):  # not written yet, or half written
                time.sleep(0.1)
        raise RuntimeError(f"dask scheduler wrote no scheduler file within {timeout_s} s: {self._log_tail('scheduler')}")

    def _log_tail(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else "(no log)"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "ab") as log:
            return subprocess.Popen([str(BIN / "dask"), *args], env=self.env, stdout=subprocess.DEVNULL,
                                    stderr=log, start_new_session=True)

    def add_worker(self) -> "ForkedWorker":
        """A `dask worker` process forked from the zygote (tests/dask_zygote.py): the heavy imports are
        done once there, not again in every replacement the fault tests start."""
        with self._zygote_lock:
            return self._fork_worker()

    def _fork_worker(self) -> "ForkedWorker":
        if self.zygote is None:
            with open(self.workdir / "zygote.log", "ab") as zlog:
                self.zygote = subprocess.Popen([sys.executable, str(Path(__file__).with_name("dask_zygote.py"))],
                                               env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=zlog, text=True, start_new_session=True)
            if self.zygote.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the worker zygote did not start: {self._log_tail('zygote')}")
        log = self.workdir / f"worker-{len(self.workers)}.log"
        self.zygote.stdin.write(json.dumps([[self.address, "--host", "127.0.0.1", "--nthreads", "1",
                                              "--no-nanny", "--no-dashboard", "--dashboard-address", "127.0.0.1:0",
                                              "--memory-limit", "0"], str(log)]) + "\n")
        self.zygote.stdin.flush()
        proc = ForkedWorker(int(self.zygote.stdout.readline()))
        self.workers.append(proc)
        return proc

    def client(self):
        from distributed import Client

        return Client(self.address, timeout=30, set_as_default=False)

    def wait_for_workers(self, n: int, timeout: float = 60) -> None:
        with self.client() as c:
            c.wait_for_workers(n, timeout=timeout)

    def __exit__(self, *exc) -> None:
        # workers first, while their scheduler still answers: a worker whose scheduler is gone spends
        # its close retrying it (about 10 s for two), one that can say goodbye exits at once
        for group in (self.workers, [self.scheduler]):
            for proc in group:
                if proc is not None and proc.poll() is None:
                    proc.terminate()
            for proc in group:
                if proc is None:
                    continue
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        if self.zygote is not None:  # its stdin closed, it exits
            self.zygote.stdin.close()
            try:
                self.zygote.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.zygote.kill()
                self.zygote.wait(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)


class ForkedWorker:
    """A worker process forked by the zygote, with the part of ``subprocess.Popen`` the tests use. Its
    parent is the zygote, which lets the kernel reap it: it is gone (``poll`` not None) once its PID is;
    the exit status is not kept (-1 stands for it)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"dask worker pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def _signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


# ----- a worker that kills itself while it runs a given task ------------------------------------------
KILL_PLUGIN = "mlsys-kill-on-task"
_RUNNING = ("executing", "long-running")  # long-running: the task seceded (worker_client), its body still runs


class KillOnTask(WorkerPlugin):
    """Installed on every worker (and on every worker that joins later): the first worker, across all
    of them, whose task ``target`` (a task function's name, the prefix of its Dask key) starts
    executing SIGKILLs itself while that task runs.

    The moment is an event, not a timer: a timer has to guess how long the task runs on this machine
    today, and a guess that is too long kills nothing. Preferred moment ``body``: a watcher thread sees
    the task function's own frame on a stack, so the fault hits the work itself rather than Prefect's
    engine around it. Should the task leave "executing" before that is seen (a body shorter than
    the watcher's poll), moment ``leaving``: the worker dies inside the transition hook, before it
    sends the result to the scheduler, so the scheduler still sees the task's work lost.

    One-shot across processes: the worker that creates ``marker_dir/claimed`` with O_CREAT|O_EXCL is
    the one that dies; every other worker, a replacement started after the kill included, finds it
    taken. Before dying the worker writes ``marker_dir/killed.json`` (key, worker, pid, moment) for the
    test to read; it appears complete or not at all (written aside, then renamed)."""

    name = KILL_PLUGIN

    def __init__(self, target: str, marker_dir: str, poll_s: float = 0.002):
        self.target, self.marker_dir, self.poll_s = target, marker_dir, poll_s

    def setup(self, worker) -> None:
        self.address, self.key, self.started = worker.address, None, 0.0
        self.lock, self.stop = threading.Lock(), threading.Event()

    def teardown(self, worker) -> None:
        self.stop.set()  # unregistered (end of a test): the watcher, if any, must not fire later

    def transition(self, key, start, finish, **kwargs) -> None:
        from distributed.utils import key_split

        if self.key is None:
            if finish == "executing" and key_split(key) == self.target and self._claim(key):
                self.key, self.started = key, time.monotonic()
                threading.Thread(target=self._watch, name="kill-on-task", daemon=True).start()
        elif key == self.key and start in _RUNNING and finish not in _RUNNING:
            self._kill("leaving", f"the task went {start} -> {finish} before its body was seen")

    def _claim(self, key) -> bool:
        try:
            fd = os.open(os.path.join(self.marker_dir, "claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(fd, f"{key} {self.address} {os.getpid()}\n".encode())
        os.close(fd)
        return True

    def _watch(self) -> None:
        while not self.stop.wait(self.poll_s):
            for frame in sys._current_frames().values():
                while frame is not None:
                    if frame.f_code.co_name == self.target:
                        self._kill("body", f"{frame.f_code.co_qualname}, line {frame.f_lineno}")
                    frame = frame.f_back

    def _kill(self, moment: str, where: str) -> None:
        with self.lock:  # the watcher and the transition hook may both fire: one record, one kill
            if self.stop.is_set():
                return
            record = {"key": str(self.key), "worker": self.address, "pid": os.getpid(), "moment": moment,
                      "where": where, "after_s": round(time.monotonic() - self.started, 3)}
            path = os.path.join(self.marker_dir, "killed.json")
            with open(path + ".tmp", "w") as f:
                json.dump(record, f)
            os.replace(path + ".tmp", path)
            os.kill(os.getpid(), signal.SIGKILL)


class WorkerKillOnTask:
    """Test side of :class:`KillOnTask`: registers the plugin on ``procs``' scheduler, starts a
    replacement worker as soon as the kill record appears, and unregisters the plugin on exit so the
    module's later tests run on plain workers. ``marker_dir``: a fresh, empty folder per test."""

    def __init__(self, procs: DaskProcesses, target: str, marker_dir: Path, timeout_s: float = 300):
        self.procs, self.target, self.marker_dir, self.timeout_s = procs, target, Path(marker_dir), timeout_s
        self.record: dict[str, Any] | None = None
        self.replacement: ForkedWorker | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._replace, name="kill-replacement", daemon=True)

    def __enter__(self) -> "WorkerKillOnTask":
        import cloudpickle

        self.marker_dir.mkdir(parents=True, exist_ok=True)
        # The workers cannot import this module (tests/ is not on their path): ship the class by value.
        # The scheduler keeps the pickled bytes (for workers that join later): only this call pickles it.
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        try:
            with self.procs.client() as client:
                client.register_plugin(KillOnTask(self.target, str(self.marker_dir)))
        finally:
            cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        self.thread.start()
        return self

    def _replace(self) -> None:
        # Polling a file the dying worker writes: the kill itself is the event; the deadline only
        # keeps a run in which nothing is killed from leaving this thread behind.
        deadline = time.monotonic() + self.timeout_s
        while not self._check() and not self.stop.wait(0.05) and time.monotonic() < deadline:
            pass

    def _check(self) -> bool:
        """Reads the record and starts the replacement once it exists."""
        record = self.marker_dir / "killed.json"
        if self.record is None and record.exists():
            self.record = json.loads(record.read_text())
            self.replacement = self.procs.add_worker()
        return self.record is not None

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self._check()  # a kill in the thread's last 50 ms still gets its replacement
        with self.procs.client() as client:
            client.unregister_worker_plugin(KILL_PLUGIN)

    def killed_process(self) -> "ForkedWorker | None":
        """The DaskProcesses worker the record names (by pid), or None."""
        pid = self.record and self.record["pid"]
        return next((p for p in self.procs.workers if p.pid == pid), None)


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
_REFERENCES: dict[Any, tuple[dict, Any]] = {}
REFERENCE_RUN_KEY = "reference"


_WARM: dict[str, Any] = {}
# Systems whose smoke run needs a cluster it starts itself (besides runs that kill workers): dsi pins its
# helper threads to cores and grows the workers of its own cluster only (its flow test checks the pinning).
OWN_CLUSTER = {"dsi"}
# The shared smoke run of a system with these overrides: cedar's caches on the storage block, the path its
# flow test checks (the local-folder cache is the unit tests'), so that test needs no run of its own.
SMOKE_OVERRIDES: dict[str, dict[str, Any]] = {"cedar": {"cache": "storage"}}


def warm_cluster():
    """A ``DaskCluster`` block on one LocalCluster kept for the test session, as `mlsys-flows server`'s
    warm cluster serves every run: its 2 worker processes import torch, Prefect and the flows once,
    not once per run (a fresh embedded cluster costs 15-30 s of a smoke run on 2 cores, its body a few)."""
    if "cluster" not in _WARM:
        from distributed import LocalCluster

        from mlsys_flows.blocks import DaskCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None)
        _WARM["cluster"], _WARM["local"] = DaskCluster(address=cluster.scheduler_address), cluster
    return _WARM["cluster"]


def close_warm_cluster() -> None:
    """Close the session's warm cluster, if one was started (the Prefect API fixture calls this before
    its API goes: the scheduler and workers log through it while they close)."""
    local = _WARM.pop("local", None)
    _WARM.pop("cluster", None)
    if local is not None:
        local.close()


def reference_run(name: str, overrides: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    """(RunReport, storage) of a fault-free smoke run (run key ``reference``), with ``overrides`` of the
    smoke parameters if given (each set of overrides its own run). On the session's warm cluster, like
    a run against `mlsys-flows server`; a run that kills workers on purpose (``kills_workers``) takes
    the embedded cluster, as it would there, and so does a system in ``OWN_CLUSTER``. ``overrides=None``: the
    system's ``SMOKE_OVERRIDES``. Needs the Prefect API (the ``prefect_api`` fixture)."""
    if overrides is None:
        overrides = SMOKE_OVERRIDES.get(name)
    ref = name if not overrides else (name, tuple(sorted(overrides.items())))
    if ref not in _REFERENCES:
        import atexit
        import shutil
        import tempfile

        from mlsys_flows.blocks import ObjectStorage

        folder = tempfile.mkdtemp(prefix=f"mlsys-ref-{name}-")
        atexit.register(shutil.rmtree, folder, True)
        storage = ObjectStorage(url=Path(folder).as_uri())
        spec = registry.get(name)
        own = name in OWN_CLUSTER or spec.params_model().for_scale("smoke", **(overrides or {})).own_cluster()
        report = spec.load_flow()(scale="smoke", storage=storage, run_key=REFERENCE_RUN_KEY, overrides=overrides,
                                  cluster=None if own else warm_cluster())
        _REFERENCES[ref] = (report, storage)
    return _REFERENCES[ref]

