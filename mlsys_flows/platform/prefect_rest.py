"""A small client for the Prefect REST API that needs only httpx (no prefect import).

The webhook receiver and the Airflow operator use it: Airflow cannot share a virtualenv with
Prefect (docs/platform.md, section 4: their fastapi pins conflict), and the webhook needs the raw status code of ``create_flow_run`` (201 = a
new run, 200 = an existing run returned for the same idempotency key). The CLI's health probes use
it too: ``server.discover_api_url`` runs before prefect is imported (prefect reads its settings once,
at import), and ``EmbeddedAPI.ready`` polls every 0.1 s on the start-up path. Other code that runs
with prefect imported uses Prefect's own client (``prefect.get_client``; ``server.prefect_client``).
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from mlsys_flows.errors import MlsysError

FINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
RETRY_STATUS = {429, 502, 503, 504}  # a busy server (SQLite locked -> 503): retry like Prefect's client


def cancelling(message: str) -> dict[str, Any]:
    """The body of ``POST flow_runs/{id}/set_state`` that cancels a run, as Prefect's UI and
    `prefect flow-run cancel` do: Cancelling, after which the worker stops the run's process and
    sets Cancelled (a run with no process yet goes straight to Cancelled)."""
    return {"state": {"type": "CANCELLING", "name": "Cancelling", "message": message}}


class PrefectAPIError(MlsysError, RuntimeError):
    """The Prefect API refused a request or could not be reached."""


@dataclass
class CreatedRun:
    id: str
    name: str
    created: bool  # False: an existing run was returned for the same idempotency key


class PrefectREST:
    """Synchronous Prefect REST client. ``api_url`` ends in ``/api``.

    Auth: ``api_key`` (Prefect Cloud, bearer) or ``auth_string`` (``user:password`` of a
    self-hosted server with ``PREFECT_SERVER_API_AUTH_STRING``); both default to the
    ``PREFECT_API_KEY`` / ``PREFECT_API_AUTH_STRING`` environment variables.
    """

    def __init__(self, api_url: str, api_key: str | None = None, auth_string: str | None = None,
                 timeout: float = 30.0):
        self.api_url = api_url.rstrip("/")
        api_key = api_key or os.environ.get("PREFECT_API_KEY")
        auth_string = auth_string or os.environ.get("PREFECT_API_AUTH_STRING")
        auth = None
        headers = {}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        elif auth_string:
            user, _, password = auth_string.partition(":")
            auth = httpx.BasicAuth(user, password)
        self.http = httpx.Client(base_url=self.api_url + "/", headers=headers, auth=auth, timeout=timeout,
                                 limits=httpx.Limits(max_connections=64, max_keepalive_connections=32))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "PrefectREST":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, method: str, path: str, attempts: int = 10, **kwargs) -> httpx.Response:
        """One request to ``path`` (relative to ``api_url``), retried with jittered exponential backoff
        while the server is busy or unreachable, at most ``attempts`` times; raises ``PrefectAPIError``
        for an HTTP error. Safe for the POSTs made here: flow runs are created with an idempotency key."""
        for attempt in range(attempts):
            try:
                response = self.http.request(method, path.lstrip("/"), **kwargs)
            except httpx.TransportError as exc:
                if attempt == attempts - 1:
                    raise PrefectAPIError(f"Prefect API at {self.api_url} unreachable: {type(exc).__name__}") from None
            else:
                if response.status_code not in RETRY_STATUS or attempt == attempts - 1:
                    break
                retry_after = response.headers.get("retry-after", "")
                if retry_after.isdigit():
                    time.sleep(min(float(retry_after), 10.0))
                    continue
            time.sleep(min(0.1 * 2 ** attempt, 5.0) * (0.5 + random.random()))
        if response.status_code >= 400:
            raise PrefectAPIError(f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}")
        return response

    def healthy(self) -> bool:
        try:
            return self.http.get("health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def read_deployment(self, full_name: str) -> dict[str, Any]:
        """``flow-name/deployment-name`` -> the deployment."""
        flow, sep, name = full_name.partition("/")
        if not sep:
            raise PrefectAPIError(f"deployment {full_name!r}: expected flow-name/deployment-name")
        try:
            return self.request("GET", f"deployments/name/{flow}/{name}").json()
        except PrefectAPIError as exc:
            if "HTTP 404" in str(exc):
                raise PrefectAPIError(f"no deployment {full_name!r} on {self.api_url}") from None
            raise

    def create_flow_run(self, deployment_id: str, parameters: dict[str, Any] | None = None,
                        idempotency_key: str | None = None, tags: list[str] | None = None) -> CreatedRun:
        body: dict[str, Any] = {"parameters": parameters or {}, "tags": tags or [],
                                "state": {"type": "SCHEDULED", "name": "Scheduled"}}
        if idempotency_key:
            body["idempotency_key"] = idempotency_key
        response = self.request("POST", f"deployments/{deployment_id}/create_flow_run", json=body)
        run = response.json()
        return CreatedRun(id=run["id"], name=run["name"], created=response.status_code == 201)

    def read_flow_run(self, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"flow_runs/{run_id}").json()

    def wait_for_final_state(self, run_id: str, timeout_s: float = 3600, poll_s: float = 2.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.read_flow_run(run_id)
            if (run.get("state") or {}).get("type") in FINAL_STATES:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"flow run {run_id} not finished after {timeout_s:.0f} s "
                                   f"(state {(run.get('state') or {}).get('name')})")
            time.sleep(poll_s)

    def cancel_flow_run(self, run_id: str, message: str) -> str:
        """Ask for the run's cancellation; the orchestration status (ACCEPT, or REJECT for a run
        already in a final state)."""
        return self.request("POST", f"flow_runs/{run_id}/set_state", json=cancelling(message)).json()["status"]

    def count_flow_runs(self, deployment_id: str | None = None) -> int:
        body: dict[str, Any] = {}
        if deployment_id:
            body["deployments"] = {"id": {"any_": [deployment_id]}}
        return int(self.request("POST", "flow_runs/count", json=body).json())

    def read_secret(self, block_name: str) -> str:
        """The value of a Prefect ``Secret`` block (block type slug ``secret``)."""
        try:
            doc = self.request("GET", f"block_types/slug/secret/block_documents/name/{block_name}",
                             params={"include_secrets": "true"}).json()
        except PrefectAPIError as exc:
            if "HTTP 404" in str(exc):
                raise PrefectAPIError(f"no Secret block named {block_name!r}") from None
            raise
        value = (doc.get("data") or {}).get("value")
        if not isinstance(value, str) or not value:
            raise PrefectAPIError(f"Secret block {block_name!r} holds no string value")
        return value
