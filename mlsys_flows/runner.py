"""Run a system's flow locally: the one path used by the CLI, the bench runner and the tests.

Validation (system name, parameters, blocks) happens here before any Prefect or Dask work,
so bad input fails fast with a message naming the problem.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mlsys_flows import registry
from mlsys_flows.server import api_ready
from mlsys_flows.settings import configure_prefect_home


class RunError(RuntimeError):
    """A run could not start or did not finish; the message is meant for a user."""


def parse_param(text: str) -> tuple[str, Any]:
    """``key=value`` -> (key, value); the value is read as JSON when it parses, else as text."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise RunError(f"--param {text!r}: expected key=value")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def validate(name: str, scale: str, overrides: dict[str, Any]):
    """The system's spec and validated parameters; raises UnknownSystem / ParamsError / RunError."""
    spec = registry.get(name)
    if spec.status != "implemented":
        raise RunError(f"system {name!r} is planned, not implemented yet (see `mlsys-flows list`)")
    return spec, spec.params_model().for_scale(scale, **overrides)


def run_system(name: str, scale: str = "quick", overrides: dict[str, Any] | None = None,
               storage: Any = None, cluster: Any = None, devices: Any = None, run_key: str | None = None):
    """Validate, run the flow, return its RunReport. ``run_key`` makes a training run resumable:
    a rerun with the same key continues from its last complete checkpoint."""
    overrides = dict(overrides or {})
    spec, _ = validate(name, scale, overrides)
    configure_prefect_home()
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    from mlsys_flows.blocks import DaskCluster, ObjectStorage, ResourcePool
    from mlsys_flows.systems.common.report import RunReport

    if any(isinstance(v, str) for v in (storage, cluster, devices)):
        api_ready()  # saved blocks are read from the API
    storage = _load_block(ObjectStorage, storage, "--storage")
    cluster = _load_block(DaskCluster, cluster, "--cluster")
    devices = _load_block(ResourcePool, devices, "--devices")
    if storage is not None:
        storage.check()
    flow = spec.load_flow()
    api_ready()  # an embedded API started early by the CLI has booted meanwhile
    state = flow(scale=scale, overrides=overrides, storage=storage, cluster=cluster, devices=devices, run_key=run_key,
                 return_state=True)
    if not state.is_completed():
        raise RunError(f"{name} flow run ended {state.type.value}: {state.message}")
    return RunReport.model_validate(state.result())


def _load_block(cls, value, option: str):
    if value is None or not isinstance(value, str):
        return value
    try:
        return cls.load(value)
    except ValueError as exc:
        raise RunError(f"{option} {value!r}: no {cls.__name__} block of that name ({exc})") from None


def write_report(report, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    return path
