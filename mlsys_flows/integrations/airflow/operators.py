"""``MlsysFlowOperator``: runs an mlsys-flows system's Prefect deployment as an Airflow task.

    from mlsys_flows.integrations.airflow.operators import MlsysFlowOperator

    MlsysFlowOperator(task_id="recd", system="recd", scale="quick", overrides={"seed": 1},
                      prefect_conn_id="prefect_default")

It checks the flow parameters (``scale``, ``overrides``, ``storage``, ``cluster``, ``devices``,
``run_key``: the harness's, declared in ``flow_params.py``) by the harness's rules before any run,
creates a run of the deployment and defers to ``PrefectFlowRunTrigger``: the worker slot is free
while the flow runs, and the task ends with the run's final state. ``deferrable=False`` waits in
the worker instead (an Airflow without a triggerer), with the same trigger's loop. Killing the
task cancels the run: ``on_kill`` while the task runs in a worker, the trigger's ``on_kill``
while it is deferred (Airflow >= 3.3). ``PrefectRunLink`` links the task to the run's UI page.

Imports only ``airflow.sdk``/``airflow.triggers`` and httpx, no prefect (docs/platform.md,
section 4: Airflow). ``mode="in_process"`` runs the flow inside the task instead (needs prefect
in the Airflow environment; imported only then).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Literal, Sequence

from airflow.sdk import BaseOperator, BaseOperatorLink
from airflow.sdk.exceptions import AirflowException

from mlsys_flows import flow_params, registry
from mlsys_flows.integrations.airflow.hooks import PrefectHook
from mlsys_flows.integrations.airflow.triggers import PrefectFlowRunTrigger
from mlsys_flows.platform.prefect_rest import PrefectAPIError
from mlsys_flows.systems.common.params import ParamsError


class PrefectRunLink(BaseOperatorLink):
    """The task's "Prefect flow run" button: the run's page in the Prefect UI. The operator pushes
    the URL under this link's XCom key as soon as the run exists, so the button works while the
    task is deferred."""

    name = "Prefect flow run"

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        from airflow.sdk.execution_time.xcom import XCom  # the configured XCom backend

        return XCom.get_value(ti_key=ti_key, key=self.xcom_key) or ""


class MlsysFlowOperator(BaseOperator):
    """Run ``system``'s deployment on the Prefect API of ``prefect_conn_id`` and end with its state.

    Returns (XCom) ``{"flow_run_id", "state", "deployment", "ui_url"}``; raises AirflowException
    when the run does not complete, and before any run when a parameter is invalid.
    """

    # every flow parameter (flow_params.NAMES) is an argument of the same name, templated
    template_fields: Sequence[str] = ("system", *flow_params.NAMES, "deployment", "prefect_conn_id", "idempotency_key")
    operator_extra_links = (PrefectRunLink(),)
    ui_color = "#e6f0ff"

    def __init__(self, *, system: str, scale: str = "quick", overrides: dict[str, Any] | None = None,
                 deployment: str | None = None, prefect_conn_id: str = PrefectHook.default_conn_name,
                 mode: Literal["deployment", "in_process"] = "deployment", wait: bool = True,
                 deferrable: bool = True, poll_interval_s: float = 5.0, run_timeout_s: float = 6 * 3600,
                 idempotency_key: str | None = None, storage: str | None = None, cluster: str | None = None,
                 devices: str | None = None, run_key: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if mode not in ("deployment", "in_process"):
            raise ValueError(f"mode must be 'deployment' or 'in_process' (got {mode!r})")
        # a non-object (e.g. a list) is kept as given, so execute() refuses it naming `overrides`
        self.overrides = {} if overrides is None else dict(overrides) if isinstance(overrides, dict) else overrides
        self.system, self.scale = system, scale
        self.deployment, self.prefect_conn_id, self.mode, self.wait = deployment, prefect_conn_id, mode, wait
        self.deferrable, self.poll_interval_s, self.run_timeout_s = deferrable, poll_interval_s, run_timeout_s
        self.idempotency_key = idempotency_key
        # names of saved ObjectStorage / DaskCluster / ResourcePool blocks
        self.storage, self.cluster, self.devices = storage, cluster, devices
        self.run_key = run_key  # makes the run's training resumable under this key
        self.flow_run_id: str | None = None  # the run this task started and has not seen finish (on_kill)

    def _parameters(self) -> dict[str, Any]:
        """The flow parameters sent: every declared one that is set (scale and overrides always)."""
        values = {name: getattr(self, name) for name in flow_params.NAMES}
        return {k: v for k, v in values.items() if v is not None and v != ""}

    def _deployment_name(self) -> str:
        return self.deployment or f"{self.system}/{self.system}"

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

    def execute(self, context: Any) -> dict[str, Any] | None:
        self._validate()  # before any run is created
        if self.mode == "in_process":
            return self._run_in_process()
        api, name = PrefectHook(self.prefect_conn_id).get_api(), self._deployment_name()
        try:
            with api.rest() as rest:
                deployment = rest.read_deployment(name)
                run = rest.create_flow_run(deployment["id"], self._parameters(),
                                           idempotency_key=self._idempotency_key(context), tags=["airflow"])
        except PrefectAPIError as exc:
            raise AirflowException(str(exc)) from None
        self.flow_run_id, ui_url = run.id, api.run_url(run.id)
        if "ti" in context:
            context["ti"].xcom_push(key=PrefectRunLink().xcom_key, value=ui_url)
        self.log.info("Prefect flow run %s (%s) of %s: %s", run.name, run.id, name, ui_url)
        if not self.wait:
            self.flow_run_id = None  # not ours to cancel: the task ends now
            return {"flow_run_id": run.id, "state": "SCHEDULED", "deployment": name, "ui_url": ui_url}
        deadline = time.time() + self.run_timeout_s
        trigger = PrefectFlowRunTrigger(run.id, self.prefect_conn_id, self.poll_interval_s, deadline)
        if self.deferrable:
            self.defer(trigger=trigger, method_name="execute_complete")
        event = asyncio.run(anext(trigger.run()))  # waits in the worker: the trigger's loop, run here
        return self.execute_complete(context, event.payload)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """The run's final state (the trigger's event) -> the task's outcome."""
        run_id = self.flow_run_id = event["flow_run_id"]
        run = f"flow run {event['name']} ({run_id})" if event.get("name") else f"flow run {run_id}"
        if event.get("error"):
            raise AirflowException(f"{run}: {event['error']}")
        if event.get("timed_out"):
            PrefectHook(self.prefect_conn_id).cancel_flow_run(run_id, f"not finished after {self.run_timeout_s:.0f} s")
            self.flow_run_id = None
            raise AirflowException(f"{run} not finished after {self.run_timeout_s:.0f} s (state {event['state']}): "
                                   f"cancelled")
        self.flow_run_id = None  # final: nothing left to cancel
        if event["state"] != "COMPLETED":
            raise AirflowException(f"{run} ended {event['state']}: {event.get('message')}")
        self.log.info("%s completed", run)
        return {"flow_run_id": run_id, "state": event["state"], "deployment": self._deployment_name(),
                "ui_url": PrefectHook(self.prefect_conn_id).get_api().run_url(run_id)}

    def on_kill(self) -> None:
        """The task was killed while its worker waited on the run (SIGTERM from Airflow): cancel it."""
        if self.flow_run_id:
            status = PrefectHook(self.prefect_conn_id).cancel_flow_run(self.flow_run_id, "the Airflow task was killed")
            self.log.info("flow run %s: cancellation %s", self.flow_run_id, status)

    def _run_in_process(self) -> dict[str, Any]:
        from mlsys_flows.platform.runner import RunError, run_system  # imports prefect: only in this mode

        try:
            report = run_system(self.system, self.scale, self.overrides, storage=self.storage, cluster=self.cluster,
                                devices=self.devices, run_key=self.run_key)
        except RunError as exc:
            raise AirflowException(str(exc)) from None
        h = report.headline
        self.log.info("%s: %s %s vs %s = %.3fx (%s)", self.system, h.metric, h.technique, h.baseline, h.ratio, h.kind)
        return {"state": "COMPLETED", "run_id": report.run_id, "headline": h.model_dump(mode="json")}
