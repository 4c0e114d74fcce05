"""A real multi-process Dask cluster: `dask scheduler` + two `dask worker` processes on 127.0.0.1,
one advertising GPU=1. A flow run through a DaskCluster(address=...) block places every task
annotated by ResourcePool(kind="gpu") on the GPU worker only."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from prefect import flow, task

from mlsys_flows.blocks import DaskCluster, ResourcePool
from mlsys_flows.procs import Proc, stop_all
from mlsys_flows.server import free_port

pytestmark = pytest.mark.integration
HERE = Path(__file__).resolve().parent


@task
def where(i: int) -> str:
    from distributed import get_worker

    time.sleep(0.2)  # long enough for the scheduler to spread plain tasks over both workers
    return get_worker().name


@flow
def placement(n: int = 6) -> dict[str, list[str]]:
    with ResourcePool(kind="gpu").annotate():
        gpu = [where.submit(i) for i in range(n)]
    cpu = [where.submit(100 + i) for i in range(n)]
    return {"gpu": [f.result() for f in gpu], "cpu": [f.result() for f in cpu]}


@pytest.fixture(scope="module")
def dask_processes(prefect_api, tmp_path_factory):
    from distributed import Client
    from prefect.settings import PREFECT_API_URL

    logs = tmp_path_factory.mktemp("dask")
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    # workers report task runs to the same Prefect API and import this module to run its tasks
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    dask = [str(Path(sys.executable).parent / "dask")]
    procs = [Proc("scheduler", [*dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                  env=env, log=logs / "scheduler.log")]
    try:
        time.sleep(1)
        common = ["worker", address, "--host", "127.0.0.1", "--nthreads", "1", "--no-dashboard", "--no-nanny"]
        procs.append(Proc("gpu-worker", [*dask, *common, "--name", "gpu-worker", "--resources", "GPU=1"],
                          env=env, log=logs / "gpu-worker.log"))
        procs.append(Proc("cpu-worker", [*dask, *common, "--name", "cpu-worker"], env=env, log=logs / "cpu-worker.log"))
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=90)
            resources = {w["name"]: w["resources"] for w in client.scheduler_info()["workers"].values()}
        assert resources == {"gpu-worker": {"GPU": 1.0}, "cpu-worker": {}}
        yield address
    finally:
        stop_all(procs, grace_s=5)


def test_gpu_tasks_land_only_on_the_gpu_worker(dask_processes):
    cluster = DaskCluster(address=dask_processes)
    state = placement.with_options(task_runner=cluster.task_runner())(return_state=True)
    assert state.is_completed(), state.message
    placed = state.result()
    assert placed["gpu"] == ["gpu-worker"] * 6
    assert set(placed["cpu"]) <= {"gpu-worker", "cpu-worker"} and "cpu-worker" in placed["cpu"]
