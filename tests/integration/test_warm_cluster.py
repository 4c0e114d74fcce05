"""`mlsys-flows server`'s warm Dask cluster (issue 33): a run reporting to the server, with no cluster
of its own, runs its tasks there, and the cluster outlives the run; without the server nothing attaches."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client

from mlsys_flows import registry
from mlsys_flows.platform.server import WARM_WORKERS
from mlsys_flows.settings import warm_cluster_address

SYSTEM = "moetuner"  # a short smoke flow


@pytest.fixture
def platform(user_server):
    """The session's `mlsys-flows server` (tests/integration/conftest.py) and its warm cluster."""
    return user_server


def _scheduler_state(address: str) -> tuple[set[str], set[str]]:
    """(worker addresses, task prefixes the scheduler has seen)."""
    with Client(address, timeout=60) as client:
        workers = set(client.scheduler_info(n_workers=-1)["workers"])
        prefixes = set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes)))
    return workers, prefixes


def test_server_records_its_warm_cluster(platform, monkeypatch):
    info = json.loads((platform.dir / "server.json").read_text())
    assert info["dask_address"] == platform.dask_address and platform.dask_address.startswith("tcp://127.0.0.1:")
    monkeypatch.setenv("MLSYS_FLOWS_HOME", str(platform.root))
    assert warm_cluster_address(platform.api_url) == platform.dask_address
    assert warm_cluster_address("http://127.0.0.1:1/api") is None  # another API: a run there starts its own
    workers, _ = _scheduler_state(platform.dask_address)
    assert len(workers) == WARM_WORKERS
    with Client(platform.dask_address, timeout=60) as client:  # the preload imported every flow on each worker
        # a lambda travels by value: the workers cannot import this test module
        imported = client.run(lambda: {n for n in sys.modules if n.startswith("mlsys_flows.flows.")})
    flows = {f"mlsys_flows.flows.{spec.name}" for spec in registry.all_specs()}
    assert all(flows <= got for got in imported.values()), {w: flows - got for w, got in imported.items()}


def test_a_run_that_kills_workers_takes_a_cluster_of_its_own(platform, monkeypatch):
    """The warm cluster is shared by every run: one that SIGKILLs workers on purpose (recycle's failover
    run) starts its own, while the same system without that run attaches to the warm one."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from mlsys_flows.flows.common import resolve_cluster
    from mlsys_flows.systems.recycle import Params as RecycleParams

    monkeypatch.setenv("MLSYS_FLOWS_HOME", str(platform.root))
    with temporary_settings({PREFECT_API_URL: platform.api_url}):
        for failover, mode in ((True, "local"), (False, "address")):
            params = RecycleParams.for_scale("smoke", failover_run=failover)
            assert params.kills_workers() is failover
            cluster = resolve_cluster(None, shared=not params.kills_workers())
            assert cluster.mode == mode, (failover, cluster)
        assert resolve_cluster(None).address == platform.dask_address


def test_smoke_run_attaches_to_the_warm_cluster_which_survives_it(platform, tmp_path):
    workers_before, prefixes_before = _scheduler_state(platform.dask_address)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["MLSYS_FLOWS_HOME"] = str(platform.root)  # where the CLI finds the running server (server.json)
    out = tmp_path / "report.json"
    done = subprocess.run([str(Path(sys.executable).parent / "mlsys-flows"), "run", SYSTEM, "--scale", "smoke",
                           "--json", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert f"Prefect API: {platform.api_url}" in done.stdout
    assert json.loads(out.read_text())["system"] == SYSTEM
    workers_after, prefixes_after = _scheduler_state(platform.dask_address)
    assert prefixes_after - prefixes_before, "the run's tasks did not run on the warm cluster"
    assert workers_after == workers_before  # the same worker processes: not restarted, not closed
