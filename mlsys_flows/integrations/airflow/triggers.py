"""``PrefectFlowRunTrigger``: waits for a Prefect flow run's final state in Airflow's triggerer.

Polls ``GET /flow_runs/{id}`` with an async HTTP client (the triggerer runs many triggers on one
event loop; nothing here blocks it) and fires one event, ``{"flow_run_id", "name", "state",
"message", "timed_out", "error"}``: the run's final state, or the state it was in when the
deadline passed, or why the API could not be read. The operator's ``execute_complete`` turns it
into the task's outcome. Its serialized arguments hold the connection id, never the API key.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

import httpx
from airflow.triggers.base import BaseTrigger, TriggerEvent

from mlsys_flows.integrations.airflow.hooks import PrefectHook
from mlsys_flows.platform.prefect_rest import FINAL_STATES, RETRY_STATUS

# consecutive failed reads (unreachable, or busy: 429/5xx) before the trigger gives up
MAX_FAILED_READS = 10


class PrefectFlowRunTrigger(BaseTrigger):
    """Fires when flow run ``flow_run_id`` reaches a final state (or at ``deadline``, epoch seconds)."""

    def __init__(self, flow_run_id: str, prefect_conn_id: str = PrefectHook.default_conn_name,
                 poll_interval_s: float = 5.0, deadline: float | None = None):
        super().__init__()
        self.flow_run_id, self.prefect_conn_id = flow_run_id, prefect_conn_id
        self.poll_interval_s, self.deadline = poll_interval_s, deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"flow_run_id": self.flow_run_id, "prefect_conn_id": self.prefect_conn_id,
                 "poll_interval_s": self.poll_interval_s, "deadline": self.deadline})

    def _event(self, run: dict[str, Any] | None = None, **fields: Any) -> TriggerEvent:
        state = (run or {}).get("state") or {}
        return TriggerEvent({"flow_run_id": self.flow_run_id, "name": (run or {}).get("name"),
                             "state": state.get("type"), "message": state.get("message"),
                             "timed_out": False, "error": None, **fields})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # the client is closed before the event is yielded: a caller may stop after one event
        # (Airflow's `dags test`, deferrable=False) and never resume the generator
        yield await self._wait()

    async def _wait(self) -> TriggerEvent:
        api = await PrefectHook(self.prefect_conn_id).aget_api()
        failed_reads = 0
        async with api.async_client() as http:
            while True:
                try:
                    response = await http.get(f"flow_runs/{self.flow_run_id}")
                except httpx.TransportError as exc:
                    failed_reads, why = failed_reads + 1, f"Prefect API at {api.api_url} unreachable: {type(exc).__name__}"
                else:
                    if response.status_code in RETRY_STATUS:
                        failed_reads, why = failed_reads + 1, f"Prefect API busy: HTTP {response.status_code}"
                    elif response.status_code >= 400:  # not found, unauthorized: waiting will not help
                        return self._event(error=f"GET flow_runs/{self.flow_run_id}: HTTP {response.status_code}: "
                                                 f"{response.text[:300]}")
                    else:
                        failed_reads, run = 0, response.json()
                        if (run.get("state") or {}).get("type") in FINAL_STATES:
                            return self._event(run)
                        if self.deadline is not None and time.time() >= self.deadline:
                            return self._event(run, timed_out=True)
                if failed_reads >= MAX_FAILED_READS:
                    return self._event(error=f"{why} ({failed_reads} reads in a row)")
                if failed_reads:
                    self.log.warning("flow run %s: %s; retrying", self.flow_run_id, why)
                await asyncio.sleep(self.poll_interval_s)

    async def on_kill(self) -> None:
        """A user killed the deferred task (marked it failed or success, or cleared it; Airflow >= 3.3
        calls this): cancel the Prefect run too. Not called when the triggerer restarts."""
        status = await PrefectHook(self.prefect_conn_id).acancel_flow_run(
            self.flow_run_id, "the deferred Airflow task was killed")
        self.log.info("flow run %s: cancellation %s", self.flow_run_id, status)
