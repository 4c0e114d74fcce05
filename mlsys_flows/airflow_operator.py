"""Airflow operator that runs an mlsys-flows system: ``MlsysFlowOperator``.

Imports only ``airflow.sdk`` and httpx (through prefect_rest.py): Airflow and Prefect cannot
share one runtime environment (their fastapi pins conflict, see DESIGN.md), so the default mode
talks to a Prefect server over REST: it validates the parameters, creates a run of the system's
deployment and polls it to a final state. ``mode="in_process"`` instead runs the flow inside the
Airflow task (needs prefect in the same environment; imported only then).

    from mlsys_flows.airflow_operator import MlsysFlowOperator

    MlsysFlowOperator(task_id="recd", system="recd", scale="quick",
                      overrides={"seed": 1}, api_url="{{ var.value.prefect_api_url }}")

Its flow-parameter arguments (``scale``, ``overrides``, ``storage``, ``cluster``, ``devices``, ``run_key``) are
the harness's, declared in ``flow_params.py``, and are checked by the same rules before any run.
"""
from __future__ import annotations

import os
from typing import Any, Literal, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from mlsys_flows import flow_params, registry
from mlsys_flows.prefect_rest import PrefectAPIError, PrefectREST
from mlsys_flows.systems.common.params import ParamsError


class MlsysFlowOperator(BaseOperator):
    """Trigger ``system``'s deployment on a Prefect API and wait for its final state.

    Returns (XCom) ``{"flow_run_id", "state", "deployment", "ui_url"}``; raises AirflowException
    when the run does not complete, and before any run when a parameter is invalid.
    """

    # every flow parameter (flow_params.NAMES) is an argument of the same name, templated
    template_fields: Sequence[str] = ("system", *flow_params.NAMES, "deployment", "api_url", "idempotency_key")
    ui_color = "#e6f0ff"

    def __init__(self, *, system: str, scale: str = "quick", overrides: dict[str, Any] | None = None,
                 deployment: str | None = None, api_url: str | None = None,
                 mode: Literal["deployment", "in_process"] = "deployment", wait: bool = True,
                 poll_interval_s: float = 5.0, run_timeout_s: float = 6 * 3600,
                 idempotency_key: str | None = None, storage: str | None = None, cluster: str | None = None,
                 devices: str | None = None, run_key: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if mode not in ("deployment", "in_process"):
            raise ValueError(f"mode must be 'deployment' or 'in_process' (got {mode!r})")
        # a non-object (e.g. a list) is kept as given, so execute() refuses it naming `overrides`
        self.overrides = {} if overrides is None else dict(overrides) if isinstance(overrides, dict) else overrides
        self.system, self.scale = system, scale
        self.deployment, self.api_url, self.mode, self.wait = deployment, api_url, mode, wait
        self.poll_interval_s, self.run_timeout_s, self.idempotency_key = poll_interval_s, run_timeout_s, idempotency_key
        # names of saved ObjectStorage / DaskCluster / ResourcePool blocks
        self.storage, self.cluster, self.devices = storage, cluster, devices
        self.run_key = run_key  # makes the run's training resumable under this key

    def _parameters(self) -> dict[str, Any]:
        """The flow parameters sent: every declared one that is set (scale and overrides always)."""
        values = {name: getattr(self, name) for name in flow_params.NAMES}
        return {k: v for k, v in values.items() if v is not None and v != ""}

    def _validate(self) -> None:
        try:
            model = registry.get(self.system).params_model()
        except registry.UnknownSystem as exc:
            raise AirflowException(str(exc)) from None
        except ImportError as exc:  # an Airflow env without the system's dependencies
            self.log.warning("%s: overrides not checked here (%s); the flow validates them first", self.system, exc)
            model = None
        try:
            flow_params.check(self._parameters(), model, self.system)
        except ParamsError as exc:
            raise AirflowException(str(exc)) from None

    def _idempotency_key(self, context: Any) -> str | None:
        """One Prefect run per task try: a retried try starts a new run, a re-sent request does not."""
        if self.idempotency_key:
            return self.idempotency_key
        try:
            ti = context["ti"]
            return f"airflow:{ti.dag_id}:{context['run_id']}:{ti.task_id}:{ti.try_number}"
        except (KeyError, TypeError, AttributeError):
            return None

    def execute(self, context: Any) -> dict[str, Any]:
        self._validate()  # before any run is created
        if self.mode == "in_process":
            return self._run_in_process()
        api_url = self.api_url or os.environ.get("PREFECT_API_URL")
        if not api_url:
            raise AirflowException("api_url not set and PREFECT_API_URL not in the environment")
        name = self.deployment or f"{self.system}/{self.system}"
        try:
            with PrefectREST(api_url) as api:
                deployment = api.read_deployment(name)
                run = api.create_flow_run(deployment["id"], self._parameters(),
                                          idempotency_key=self._idempotency_key(context), tags=["airflow"])
                ui_url = api_url.rstrip("/").removesuffix("/api") + f"/runs/flow-run/{run.id}"
                self.log.info("Prefect flow run %s (%s) of %s: %s", run.name, run.id, name, ui_url)
                result = {"flow_run_id": run.id, "state": "SCHEDULED", "deployment": name, "ui_url": ui_url}
                if not self.wait:
                    return result
                final = api.wait_for_final_state(run.id, timeout_s=self.run_timeout_s, poll_s=self.poll_interval_s)
        except (PrefectAPIError, TimeoutError) as exc:
            raise AirflowException(str(exc)) from None
        state = final["state"]
        result["state"] = state["type"]
        if state["type"] != "COMPLETED":
            raise AirflowException(f"flow run {run.name} ({run.id}) ended {state['type']}: {state.get('message')}")
        self.log.info("flow run %s completed", run.name)
        return result

    def _run_in_process(self) -> dict[str, Any]:
        from mlsys_flows.runner import RunError, run_system  # imports prefect: only in this mode

        try:
            report = run_system(self.system, self.scale, self.overrides, storage=self.storage, cluster=self.cluster,
                                devices=self.devices, run_key=self.run_key)
        except RunError as exc:
            raise AirflowException(str(exc)) from None
        h = report.headline
        self.log.info("%s: %s %s vs %s = %.3fx (%s)", self.system, h.metric, h.technique, h.baseline, h.ratio, h.kind)
        return {"state": "COMPLETED", "run_id": report.run_id, "headline": h.model_dump(mode="json")}
