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
from mlsys_flows.platform.procs import Proc, stop_all
from mlsys_flows.systems.common.net import free_port

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
    procs = [Proc("scheduler", [*dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
                                          "--dashboard-address", "127.0.0.1:0"],
                  env=env, log=logs / "scheduler.log")]
    try:
        time.sleep(1)
        common = ["worker", address, "--host", "127.0.0.1", "--nthreads", "1", "--no-dashboard",
                  "--dashboard-address", "127.0.0.1:0", "--no-nanny"]
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


def test_a_system_flows_device_tasks_claim_the_pool_and_run_only_on_the_gpu_worker(dask_processes, local_storage):
    """recd at smoke with ``devices`` = a GPU pool: its device tasks (``ctx.submit(..., device="gpu")``:
    training and the mix sweep) run only on the worker started with ``--resources GPU=1``, the
    others on any worker, and the pool's Prefect concurrency limit exists with one slot per device."""
    from distributed import Client, get_task_stream
    from distributed.utils import key_split
    from prefect.client.orchestration import get_client

    from mlsys_flows import registry

    flow = registry.get("recd").load_flow()
    pool = ResourcePool(kind="gpu", devices=["cuda:0"], name="lab")
    with Client(dask_processes, timeout=60) as client:
        names = {a: w["name"] for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
        with get_task_stream(client) as stream:
            report = flow(scale="smoke", cluster=DaskCluster(address=dask_processes), devices=pool,
                          storage=local_storage)
    ran_on: dict[str, set[str]] = {}
    for record in stream.data:
        ran_on.setdefault(key_split(record["key"]), set()).add(names.get(record["worker"], record["worker"]))
    # Dask keys start with the task function's name (tasks/recd.py)
    assert ran_on.get("train") == ran_on.get("mix_sweep") == {"gpu-worker"}, ran_on
    assert {"make_dataset", "preprocess_throughput"} <= set(ran_on), ran_on  # the plain tasks ran too, anywhere
    assert report["headline"]["metric"] == "time_to_target_s"
    with get_client(sync_client=True) as api:
        assert api.read_global_concurrency_limit_by_name(pool.concurrency_limit_name).limit == 1


def test_a_device_pool_no_worker_has_fails_naming_the_parameter(prefect_api, local_storage):
    """The embedded cluster's workers advertise no GPU: the run fails fast naming ``devices``
    instead of waiting forever for a worker that will never come."""
    from mlsys_flows import registry

    flow = registry.get("recd").load_flow()
    started = time.monotonic()
    state = flow(scale="smoke", devices=ResourcePool(kind="gpu", name="lab"), storage=local_storage,
                 return_state=True)
    assert state.is_failed()
    assert "'devices'" in str(state.result(raise_on_failure=False)) and "--resources GPU=" in state.message
    assert time.monotonic() - started < 60


def test_a_remote_cluster_with_a_loopback_api_fails_before_work_naming_the_fix(prefect_api, local_storage):
    """The test harness's API is on 127.0.0.1; a scheduler on another machine (TEST-NET, unroutable)
    fails the run at once naming ``cluster`` and the fix, not after a connection attempt."""
    from mlsys_flows import registry

    state = registry.get("recd").load_flow()(scale="smoke", cluster=DaskCluster(address="tcp://192.0.2.1:8786"),
                                             storage=local_storage, return_state=True)
    assert state.is_failed()
    message = str(state.result(raise_on_failure=False))
    assert "'cluster'" in message and "prefect server start --host 0.0.0.0" in message and "192.0.2.1" in message


def test_a_worker_that_joins_after_the_run_started_is_warmed():
    """warm_workers registers a worker plugin: the worker present imports the module at once, and a
    worker added later imports it before it runs its first task (plugins are set up before a new
    worker reads the scheduler's stream)."""
    from distributed import Client, LocalCluster

    from mlsys_flows.runtime import warm_workers

    def imported() -> bool:
        return "colorsys" in sys.modules  # a standard module nothing here imports

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        first = set(client.scheduler_info()["workers"])
        assert client.run(imported) == {a: False for a in first}
        warm_workers(client, "colorsys")
        assert client.run(imported) == {a: True for a in first}
        cluster.scale(2)
        client.wait_for_workers(2, timeout=120)
        (late,) = set(client.scheduler_info()["workers"]) - first
        assert client.submit(imported, workers=[late], pure=False).result(timeout=120)


def test_the_device_check_waits_for_a_worker_that_joins_late():
    """check_workers_have waits (up to worker_wait_s) for a worker with the pool's resource: a GPU
    worker added once the check says it is waiting lets it pass; with none it fails naming the wait."""
    import logging
    import threading
    from types import SimpleNamespace

    from distributed import Client, LocalCluster, Worker

    from mlsys_flows.flows.common import check_workers_have
    from mlsys_flows.systems.common.params import ParamsError

    pool = ResourcePool(kind="gpu", name="late")
    waiting, outcome = threading.Event(), []

    class Waiting(logging.Handler):
        def emit(self, record):
            if "waiting up to" in record.getMessage():
                waiting.set()

    handler, logger = Waiting(), logging.getLogger("mlsys_flows.flows")
    logger.addHandler(handler)
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
            runner = SimpleNamespace(client=client)
            with pytest.raises(ParamsError, match=r"'devices'.*within 0.5 s"):
                check_workers_have(runner, pool, DaskCluster(address=cluster.scheduler_address, worker_wait_s=0.5))

            def check():
                try:
                    check_workers_have(runner, pool, DaskCluster(address=cluster.scheduler_address, worker_wait_s=300))
                    outcome.append("passed")
                except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                    outcome.append(exc)

            thread = threading.Thread(target=check)
            thread.start()
            assert waiting.wait(120), "the check never said it was waiting"
            assert not outcome  # still waiting: no worker has a GPU yet
            cluster.worker_spec["gpu"] = {"cls": Worker, "options": {"nthreads": 1, "resources": {"GPU": 1},
                                                                     "dashboard_address": None}}
            cluster.scale(len(cluster.worker_spec))
            thread.join(300)
            assert outcome == ["passed"]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)


def test_a_tls_scheduler_is_reached_with_certificates_from_secret_blocks(prefect_api):
    """A TLS-only scheduler (a certificate made here, in memory): DaskCluster builds distributed's
    Security from three Secret blocks (PEM text) and its task runner's client computes on it."""
    from distributed import LocalCluster
    from distributed.security import Security
    from prefect.blocks.system import Secret

    security = Security.temporary()
    pem = {"t-tls-ca": security.tls_ca_file, "t-tls-cert": security.tls_client_cert,
           "t-tls-key": security.tls_client_key}
    for name, value in pem.items():
        Secret(value=value).save(name, overwrite=True)
    with LocalCluster(n_workers=1, processes=False, protocol="tls://", host="127.0.0.1", security=security,
                      dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("tls://")
        block = DaskCluster(address=cluster.scheduler_address, tls_ca_secret="t-tls-ca", tls_cert_secret="t-tls-cert",
                            tls_key_secret="t-tls-key", client_kwargs={"timeout": 60})
        assert block.security().require_encryption
        with block.task_runner() as runner:
            assert runner.client.submit(sum, [1, 2]).result(timeout=60) == 3
