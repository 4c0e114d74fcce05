"""Fixtures shared by every test layer.

- ``prefect_api``: one Prefect test harness (a real temporary API) per session; flow tests use it.
- ``dask_cluster``: a module-scoped ``LocalCluster(dashboard_address=None)`` wrapped in a
  ``DaskCluster`` block pointing at its address.
- ``local_storage``: an ``ObjectStorage`` on a temporary folder.
- ``s3``/``s3_storage``: a real SeaweedFS S3 server on 127.0.0.1 (session) and a fresh bucket.
- ``@pytest.mark.placement_graphs``: the test needs the authors' published placement graphs; it skips
  in one line when they are absent. In CI they lie in ``../shared`` beside the checkout, which is
  exported as ``$MLSYS_PLACEMENT_GRAPHS`` (unless already set); users have the repository alone.
"""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

# A failing property test makes Hypothesis's pytest plugin write a patch with libcst; in a full unit run
# that crashed the session (INTERNALERROR, AttributeError: __provides__) and lost every other result. The
# plugin skips the patch when the module cannot be imported; the failing example is in the test's output.
sys.modules.setdefault("hypothesis.extra._patching", None)

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

# The published placement graphs are opt-in data ($MLSYS_PLACEMENT_GRAPHS); CI keeps them beside the clone.
_PLACEMENT_GRAPHS = Path(__file__).resolve().parents[2] / "shared" / "data" / "placement-graphs"
if "MLSYS_PLACEMENT_GRAPHS" not in os.environ and _PLACEMENT_GRAPHS.is_dir():
    os.environ["MLSYS_PLACEMENT_GRAPHS"] = str(_PLACEMENT_GRAPHS)


def pytest_configure(config):
    config.addinivalue_line("markers", "budget(seconds, reason): this test's body may take longer than "
                                       "TEST_BUDGET_S (an end-to-end run through another tool); the reason says why")
    config.addinivalue_line("markers", "placement_graphs: needs the authors' published placement graphs "
                                       "($MLSYS_PLACEMENT_GRAPHS); skips when they are absent")


def pytest_runtest_setup(item):
    if item.get_closest_marker("placement_graphs") is not None:
        from mlsys_flows.systems.placement.graph import SHIPPED, published_available

        missing = sorted(set(SHIPPED) - set(published_available()))
        if missing:
            pytest.skip("published placement graphs absent: set $MLSYS_PLACEMENT_GRAPHS to their folder")


# One test's body may take at most this long (its fixtures are shared and timed apart; pytest-timeout's
# `timeout` in pytest.ini stays the hang guard of setup, body and teardown together). `make test` keeps
# the whole suite under 25 minutes only while no single test grows past this.
TEST_BUDGET_S = float(os.environ.get("MLSYS_TEST_BUDGET_S", "60"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("budget")
    budget = TEST_BUDGET_S if marker is None else marker.args[0]
    if report.when == "call" and report.passed and report.duration > budget:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {report.duration:.0f} s, over the {budget:g} s one test may "
                           f"take (tests/conftest.py TEST_BUDGET_S): share its setup or make its workload smaller")


_LAYER_ORDER = {"unit": 0, "flows": 1, "integration": 2}


def pytest_collection_modifyitems(items):
    """Unit tests first, then flows, then integration (a stable sort keeps each layer's order):
    fast feedback first, and the unit tests that fork (cedar's DataLoader workers) run before the
    session's Prefect harness starts its threads. A child forked from a process whose harness
    threads hold the logging and capture locks died at exit (exit code 1) under pytest's capture."""
    items.sort(key=lambda item: _LAYER_ORDER.get(Path(str(item.fspath)).parent.name, len(_LAYER_ORDER)))


@pytest.fixture(autouse=True)
def _torch_state_does_not_leak():
    """Code under test may set torch's thread count (trainers pin it to 1) or default dtype; a
    later test must not inherit them: thread count changes float reduction order."""
    import torch

    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    yield
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect-home")
    os.environ["PREFECT_HOME"] = str(home)
    from prefect.testing.utilities import prefect_test_harness

    from mlsys_flows.platform.runner import no_flow_heartbeats

    # Nothing here watches for the crashed runs heartbeats exist to detect (the crash tests resume by
    # run key), and each would cost up to 1 s idle at every flow run's end.
    with prefect_test_harness(server_startup_timeout=120), no_flow_heartbeats():
        yield
        from faultkit import close_warm_cluster

        close_warm_cluster()  # its processes log through this API while they close


@pytest.fixture(scope="module")
def dask_cluster():
    from distributed import LocalCluster

    from mlsys_flows.blocks import DaskCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, processes=True) as cluster:
        yield DaskCluster(address=cluster.scheduler_address)


@pytest.fixture
def local_storage(tmp_path):
    from mlsys_flows.blocks import ObjectStorage

    return ObjectStorage(url=(tmp_path / "storage").as_uri()).check()


@pytest.fixture(scope="session")
def s3():
    from mlsys_flows.testing.local_s3 import SeaweedS3

    with SeaweedS3() as server:
        yield server


@pytest.fixture
def s3_storage(s3):
    from mlsys_flows.blocks import ObjectStorage

    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(bucket)
    return ObjectStorage(url=f"s3://{bucket}/data", endpoint_url=s3.endpoint_url, region="us-east-1",
                         access_key_id=s3.access_key, secret_access_key=s3.secret_key).check()
