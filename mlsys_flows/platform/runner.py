"""Run a system's flow locally: the one path used by the CLI, the bench runner and the tests.

Validation (system name, parameters, blocks) happens here before any Prefect or Dask work,
so bad input fails fast with a message naming the problem.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from mlsys_flows import registry
from mlsys_flows.errors import MlsysError
from mlsys_flows.platform.server import api_ready, discover_api_url, embedded_api, start_embedded_api
from mlsys_flows.settings import configure_prefect_home


class RunError(MlsysError, RuntimeError):
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
    return spec, spec.params_model().for_scale(scale, **overrides)


def connect(embedded: bool = True) -> str | None:
    """Find the Prefect API, the same way for every command: ``PREFECT_API_URL``, else a running
    `mlsys-flows server` (its ``server.json`` under ``MLSYS_FLOWS_HOME``). Its URL is exported as
    ``PREFECT_API_URL`` before prefect is imported, so this process and the Dask workers it starts use
    it; returns it. With no server: None, after starting the embedded temporary API when ``embedded``
    (it boots while the command goes on; :func:`api_ready` waits for it)."""
    configure_prefect_home()
    url = None if embedded_api() else discover_api_url()
    if url is not None:
        os.environ["PREFECT_API_URL"] = url
    elif embedded:
        start_embedded_api()
    return url


def connect_session() -> str:
    """:func:`connect` for a Python session (``mlsys_flows.connect``) and the `blocks` commands, which
    save and load at once: waits for the embedded API when that is the one, and points prefect at the
    API also when this process imported prefect before (then it had read its settings already). Returns
    the API URL."""
    url = connect() or start_embedded_api().ready()
    _reload_prefect_settings(url)
    return url


def _reload_prefect_settings(url: str) -> None:
    """Prefect reads the environment once, when ``prefect.context`` is imported: its global settings
    context. A session that imported prefect first (``from mlsys_flows.blocks import ...`` above the
    connect) would keep what it read then, Prefect's default profile under ``~/.prefect``. Rebuild that
    context from the environment :func:`connect` has just set, as Prefect 3.9 does itself after its plugins
    set variables (``refresh_global_settings_context``; a Prefect without it, the same assignment). Not a
    ``temporary_settings`` kept entered: that is a context variable, which a thread started later (a task
    runner's, the user's) does not inherit, and falls back to the global context."""
    import sys

    context = sys.modules.get("prefect.context")
    if context is None:  # prefect will read the environment when it is imported
        return
    refresh = getattr(context, "refresh_global_settings_context", None)
    if refresh is not None:
        refresh()
    else:
        context.GLOBAL_SETTINGS_CONTEXT = context.root_settings_context()
    from prefect.settings import get_current_settings

    current = get_current_settings().api.url
    if (current or "").rstrip("/") != url.rstrip("/"):  # a settings context entered around this call
        raise RunError(f"connect(): Prefect's settings here point at {current or 'its ephemeral API'}, not {url}, "
                       f"because a settings context is entered (temporary_settings, use_profile): call "
                       f"mlsys_flows.connect() outside it")


def run_system(name: str, scale: str = "quick", overrides: dict[str, Any] | None = None,
               storage: Any = None, cluster: Any = None, devices: Any = None, run_key: str | None = None,
               *, tags: tuple[str, ...] = ()):
    """Validate, run the flow, return its RunReport. ``run_key`` makes a training run resumable:
    a rerun with the same key continues from its last complete checkpoint. The run is tagged
    ``system:<name>`` and ``tags``; on a server where the system is deployed it is a run of that
    deployment (see :func:`_start`)."""
    overrides = dict(overrides or {})
    spec, params = validate(name, scale, overrides)
    # as validated (e.g. `-p rows=1e3` -> 1000): a deployment's schema checks JSON types strictly
    overrides = {k: v for k, v in params.model_dump(mode="json").items() if k in overrides}
    configure_prefect_home()
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    from mlsys_flows.blocks import DaskCluster, ObjectStorage, ResourcePool
    from mlsys_flows.systems.common.runreport import RunReport

    blocks = {"storage": storage, "cluster": cluster, "devices": devices}
    loaded = {"storage": _load_block(ObjectStorage, storage, "--storage"),
              "cluster": _load_block(DaskCluster, cluster, "--cluster"),
              "devices": _load_block(ResourcePool, devices, "--devices")}
    if loaded["storage"] is not None:
        loaded["storage"].check()
    flow = spec.load_flow()
    api_ready()  # an embedded API started early by the CLI has booted meanwhile
    # block names travel as names (the flow loads them, as in a deployment run); objects as loaded
    parameters = {"scale": scale, "overrides": overrides, "run_key": run_key,
                  **{k: v if isinstance(v, str) else loaded[k] for k, v in blocks.items()}}
    state = _start(name, flow, parameters, (f"system:{name}", *tags))
    if not state.is_completed():
        cause = _raised(state)
        if isinstance(cause, MlsysError):  # one of ours: its message names the field or the setting
            raise RunError(f"{name}: {cause}") from cause
        raise RunError(f"{name} flow run ended {state.type.value}: {state.message}") from cause
    return RunReport.model_validate(state.result())


def _raised(state) -> BaseException | None:
    """The exception a failed run raised, when its state still holds it (a run in this process)."""
    try:
        value = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - a result that cannot be read back: no cause to name
        return None
    return value if isinstance(value, BaseException) else None


def _start(name: str, flow, parameters: dict[str, Any], tags: tuple[str, ...]):
    """Run the flow in this process; its final state. Against a server where the system is deployed
    (``<name>/<name>``), the run is created as a run of that deployment, so the deployment's Runs tab
    lists it beside the UI's and the webhooks' runs: created Pending (a worker takes only Scheduled
    runs), then executed here. Otherwise (the embedded API, no deployment, or block objects rather
    than names, which a deployment's parameters cannot carry) a plain run with the same tags."""
    from prefect import tags as tagged
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
    from prefect.flow_engine import run_flow
    from prefect.states import Pending

    deployment = None
    if embedded_api() is None and all(v is None or isinstance(v, str) for k, v in parameters.items()
                                       if k in ("storage", "cluster", "devices")):
        with get_client(sync_client=True) as client:
            try:
                deployment = client.read_deployment_by_name(f"{name}/{name}")
            except ObjectNotFound:
                pass
            if deployment is not None:
                sent = {k: v for k, v in parameters.items() if v is not None}  # None: the flow's default
                try:
                    flow_run = client.create_flow_run_from_deployment(deployment.id, parameters=sent,
                                                                      tags=list(tags), state=Pending())
                except PrefectHTTPStatusError as exc:  # e.g. a deployment made from other code refuses them
                    raise RunError(f"deployment {name}/{name} refused the run: {exc.response.text[:300]}") from None
    if deployment is None:
        with tagged(*tags), _no_heartbeats_on_the_embedded_api():
            return flow(**parameters, return_state=True)
    return run_flow(flow, flow_run=flow_run, parameters=parameters, return_type="state")


@contextlib.contextmanager
def no_flow_heartbeats():
    """No flow-run heartbeats in this process. They let a server notice a run whose process died; each
    flow and subflow run joins Prefect's heartbeat thread as it ends, which sleeps in 1 s steps: up to
    1 s per run, idle."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


@contextlib.contextmanager
def _no_heartbeats_on_the_embedded_api():
    """Heartbeats off while the API is the embedded one, which dies with the process: nobody watches them."""
    with no_flow_heartbeats() if embedded_api() is not None else contextlib.nullcontext():
        yield


def _load_block(cls, value, option: str):
    if value is None or not isinstance(value, str):
        return value
    api_ready()  # saved blocks are read from the API
    try:
        return cls.load(value)
    except ValueError as exc:
        raise RunError(f"{option} {value!r}: no {cls.__name__} block of that name ({exc})") from None


def write_report(report, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    return path
