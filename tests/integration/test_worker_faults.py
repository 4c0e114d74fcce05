"""A real `dask worker` process SIGKILLed in the middle of a flow: the flow completes and its
RunReport equals a fault-free run's in every deterministic field (``deterministic_metrics`` of the
report: a system declares them in SystemResult.deterministic, else every metric whose name is not
timing-like).

The kill hits the flow's main work: the body task that ran longest in the fault-free reference
run. Its moment is an event, not a timer (faultkit.KillOnTask): the worker that starts that task
kills itself once the task function's own frame is on its stack, or, should the task end before
that is seen, as the task leaves "executing" (its result then never reaches the scheduler). A timer
cannot know how long the task runs on this machine today; one that guessed too long killed nothing.
Every implemented system (MLSYS_FAULTS=name,... narrows it).
"""
from __future__ import annotations

import pytest
from distributed import Client
from faultkit import (SMOKE_OVERRIDES, DaskProcesses, WorkerKillOnTask, body_task_durations, deterministic_view, fault_systems,
                      leaf_diff, no_rank_left, reference_run, wait_until)

from mlsys_flows import registry
from mlsys_flows.blocks import DaskCluster, ObjectStorage

pytestmark = pytest.mark.integration
# recycle's failover run kills a worker of its own and needs 4 (one per rank); this cluster has 2, so
# both runs of that system go without it (tests/flows/test_recycle_flow.py runs it). shef tunes its
# uniform chunk by a measured calibration, which two runs may settle apart: both runs fix the chunk
# (tests/flows/test_shef_flow.py runs the calibration)
OVERRIDES = {"recycle": {"failover_run": False}, "shef": {"tuned_chunk": 4096}}


@pytest.fixture(scope="module")
def dask_procs(prefect_api):
    from prefect.settings import PREFECT_API_URL

    with DaskProcesses(n_workers=2, env={"PREFECT_API_URL": PREFECT_API_URL.value()}) as procs:
        yield procs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", fault_systems())
def test_worker_sigkill_mid_flow_same_report(name, dask_procs, tmp_path):
    flow = registry.get(name).load_flow()
    cluster = DaskCluster(address=dask_procs.address)
    overrides = OVERRIDES.get(name, SMOKE_OVERRIDES.get(name))
    reference, _ = reference_run(name, overrides)  # fault-free, the session's shared smoke run

    target, seconds = max(body_task_durations(reference["run_id"]).items(), key=lambda kv: kv[1])
    with WorkerKillOnTask(dask_procs, target, tmp_path / "kill") as kill:
        try:
            faulted = flow(scale="smoke", cluster=cluster, storage=ObjectStorage(url=(tmp_path / "fault").as_uri()),
                           overrides=overrides)
        except BaseException as exc:
            raise AssertionError(f"the flow failed after the worker kill {kill.record}: {exc!r}") from exc
    print(f"target {target} (reference {seconds:.1f} s); kill: {kill.record}")  # shown with -s and on failure
    assert kill.record, f"no worker ran task {target} (reference {seconds:.1f} s): nothing was killed"
    killed = kill.killed_process()
    assert killed is not None, f"the killed pid {kill.record['pid']} is none of this test's workers"
    wait_until(lambda: killed.poll() is not None, timeout=10, what=f"worker pid {killed.pid} to exit")  # really dead
    diff = leaf_diff(deterministic_view(faulted), deterministic_view(reference))
    assert not diff, f"the fault {kill.record} changed deterministic fields (faulted != reference): {diff}"
    dask_procs.wait_for_workers(2)  # the replacement joined: later tests get a full cluster
    if name == "swiftmoe":  # its ranks ran on this cluster's workers
        assert faulted["environment"]["distributed"], "swiftmoe launched no ranks"
    with Client(dask_procs.address, timeout=30) as client:  # issue 32: no rank outlives its flow
        no_rank_left(client)


def test_recycle_failover_on_a_cluster_too_small_fails_first_naming_the_parameter(dask_procs, tmp_path):
    """The failover run needs 4 workers; a cluster started elsewhere with 2 is refused before any work
    (no calibration task runs), naming failover_run."""
    from mlsys_flows.systems.common.params import ParamsError

    flow = registry.get("recycle").load_flow()
    storage = ObjectStorage(url=(tmp_path / "small").as_uri())
    with pytest.raises(ParamsError, match="failover_run.*needs 4 Dask workers.*the cluster has 2"):
        flow(scale="smoke", cluster=DaskCluster(address=dask_procs.address), storage=storage)
    assert not storage.list("runs/recycle")  # nothing was written
