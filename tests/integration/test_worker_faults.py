"""A real `dask worker` process SIGKILLed in the middle of a flow: the flow completes and its
RunReport equals a fault-free run's in every deterministic field (``deterministic_metrics`` of the
report: a system declares them in SystemResult.deterministic, else every metric whose name is not
timing-like).

The kill hits the flow's main work: the body task that ran longest in the fault-free reference
run, 40% into it and at most 1 s in (the reference may have run on a busier machine: a hotline
train of 21 s there took 1.7 s on warm worker processes).
Every implemented system (MLSYS_FAULTS=name,... narrows it).
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from faultkit import DaskProcesses, deterministic_view, fault_systems, leaf_diff, reference_run, body_task_durations

from mlsys_flows import registry
from mlsys_flows.blocks import DaskCluster, ObjectStorage

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def dask_procs(prefect_api):
    from prefect.settings import PREFECT_API_URL

    with DaskProcesses(n_workers=2, env={"PREFECT_API_URL": PREFECT_API_URL.value()}) as procs:
        yield procs


class WorkerKiller(threading.Thread):
    """SIGKILLs the process of the worker that runs ``target`` (a task function's name) once that
    task has run ``after_s``, then starts a replacement worker. Should every ``target`` task end
    sooner (a faster run than the reference), the next task, a later ``target`` included, that runs
    ``min_run_s`` is killed."""

    def __init__(self, procs: DaskProcesses, target: str, after_s: float, min_run_s: float = 0.2,
                 timeout_s: float = 300):
        super().__init__(daemon=True)
        self.procs, self.target, self.after_s, self.min_run_s = procs, target, after_s, min_run_s
        self.timeout_s = timeout_s
        self.killed: tuple[str, str] | None = None  # (worker address, task key)
        self.observed: dict[str, float] = {}  # seconds each task key was seen running, for the failure message
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        from distributed.utils import key_split

        try:
            with self.procs.client() as client:
                pids = client.run(os.getpid)
                deadline = time.monotonic() + self.timeout_s
                seen: dict[tuple[str, str], float] = {}
                targets_seen: set[tuple[str, str]] = set()
                fallback = False
                while not self.stop.is_set() and time.monotonic() < deadline:
                    now = time.monotonic()
                    processing = client.processing()
                    if set(processing) - set(pids):  # a worker that joined after the start (a replacement)
                        pids = client.run(os.getpid)
                    running = [(a, k) for a, keys in processing.items() for k in keys if a in pids]
                    targets = {(a, k) for a, k in running if key_split(k) == self.target}
                    fallback |= bool(targets_seen - targets)  # a target ran and ended unkilled: faster than planned
                    targets_seen |= targets
                    for addr, key in running:
                        ran = now - seen.setdefault((addr, key), now)
                        self.observed[key] = ran
                        if ran >= (self.min_run_s if fallback else self.after_s if (addr, key) in targets else float("inf")):
                            os.kill(pids[addr], signal.SIGKILL)
                            self.killed = (addr, key)
                            self.procs.add_worker()
                            return
                    time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", fault_systems())
def test_worker_sigkill_mid_flow_same_report(name, dask_procs, tmp_path):
    flow = registry.get(name).load_flow()
    cluster = DaskCluster(address=dask_procs.address)
    reference, _ = reference_run(name)  # fault-free, on an embedded cluster

    # the flow's main work: the task that ran longest in the fault-free run, killed 40% (at most 1 s) into it
    target, seconds = max(body_task_durations(reference["run_id"]).items(), key=lambda kv: kv[1])
    killer = WorkerKiller(dask_procs, target, after_s=min(1.0, max(0.2, 0.4 * seconds)))
    killer.start()
    try:
        faulted = flow(scale="smoke", cluster=cluster, storage=ObjectStorage(url=(tmp_path / "fault").as_uri()))
    except BaseException as exc:
        raise AssertionError(f"the flow failed after the worker kill {killer.killed}: {exc!r}") from exc
    finally:
        killer.stop.set()
        killer.join(timeout=30)
    print(f"killed worker {killer.killed}")  # shown with -s, and in a failure's captured output
    assert killer.error is None, killer.error
    assert killer.killed, (
        f"task {target} (reference {seconds:.1f} s) never ran {killer.after_s:.1f} s on a worker: nothing was "
        f"killed; seen running: {killer.observed}")
    assert dask_procs.workers[0].poll() is not None or dask_procs.workers[1].poll() is not None  # really dead
    diff = leaf_diff(deterministic_view(faulted), deterministic_view(reference))
    assert not diff, f"the fault {killer.killed} changed deterministic fields (faulted != reference): {diff}"
    dask_procs.wait_for_workers(2)  # the replacement joined: later tests get a full cluster
