"""Bad inputs through the flow call, for every implemented system: the flow fails with a
ParamsError naming the parameter before any work - no task run, no subflow, nothing written.

The cluster given is a scheduler address where nothing listens: a flow that reached its body
would fail on it (or hang) instead of failing fast with a ParamsError.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from faultkit import child_flow_runs, implemented, task_runs_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlsys_flows import registry
from mlsys_flows.blocks import DaskCluster, ObjectStorage
from mlsys_flows.docsgen.limits import bad_override
from mlsys_flows.systems.common.params import ParamsError

DEAD_CLUSTER = DaskCluster(address="tcp://127.0.0.1:9")


def _rejected_before_work(name: str, field: str, **kwargs) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        storage = ObjectStorage(url=(Path(tmp) / "storage").as_uri())
        started = time.monotonic()
        state = registry.get(name).load_flow()(storage=storage, cluster=DEAD_CLUSTER, return_state=True, **kwargs)
        assert state.is_failed(), state
        exc = state.result(raise_on_failure=False)
        assert f"'{field}'" in str(exc), str(exc)
        assert time.monotonic() - started < 30, "validation is not fast"
        run_id = state.state_details.flow_run_id
        assert task_runs_of(run_id) == [] and child_flow_runs(run_id) == []  # no task, no body subflow
        assert not any(Path(tmp).rglob("*")), "something was written to storage"
        return exc


@pytest.mark.parametrize("name", implemented())
@settings(deadline=None, max_examples=3, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_flow_rejects_bad_overrides_before_any_work(name, data):
    field, overrides = data.draw(bad_override(registry.get(name).params_model()))
    exc = _rejected_before_work(name, field, scale="smoke", overrides=overrides)
    assert isinstance(exc, ParamsError) and exc.field.split(".")[0] == field


@pytest.mark.parametrize("name", implemented()[:1])
def test_flow_rejects_bad_scale_and_run_key(name):
    _rejected_before_work(name, "scale", scale="smoke", overrides={"scale": "full"})
    exc = _rejected_before_work(name, "run_key", scale="smoke", run_key="../escape")
    assert isinstance(exc, ParamsError)
