"""``PrefectHook``: the Prefect API named by an Airflow Connection of type ``prefect``.

The connection's host is the API URL (``http://127.0.0.1:4200/api``, or Prefect Cloud's
``https://api.prefect.cloud/api/accounts/<a>/workspaces/<w>``; a host without a scheme is
``http://host:port/<schema or api>``). Its password is the API key (a bearer token, as Prefect
Cloud takes it); with a login too, login and password are a self-hosted server's basic auth
(``PREFECT_SERVER_API_AUTH_STRING``). Extra ``{"ui_url": ...}`` overrides the UI address that run
links point at. The key stays in the connection (Airflow masks it in task logs) and in the HTTP
headers: it is never logged, never part of a trigger's serialized arguments nor of a repr.

    AIRFLOW_CONN_PREFECT_DEFAULT='{"conn_type": "prefect", "host": "http://127.0.0.1:4200/api"}'
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException

from mlsys_flows.platform.prefect_rest import PrefectREST, cancelling


@dataclass(frozen=True)
class PrefectAPI:
    """Where the Prefect API is and how to authenticate (from a connection)."""

    api_url: str
    ui_url: str
    api_key: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)

    def rest(self) -> PrefectREST:
        """A synchronous client (with retries while the server is busy), for the worker."""
        return PrefectREST(self.api_url, api_key=self.api_key,
                           auth_string=":".join(self.basic_auth) if self.basic_auth else None)

    def async_client(self, timeout_s: float = 30.0) -> httpx.AsyncClient:
        """An async client, for the triggerer's event loop: the same auth as :meth:`rest`."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        auth = httpx.BasicAuth(*self.basic_auth) if self.basic_auth and not self.api_key else None
        return httpx.AsyncClient(base_url=self.api_url + "/", headers=headers, auth=auth, timeout=timeout_s)

    def run_url(self, flow_run_id: str) -> str:
        """The run's page in the Prefect UI."""
        return f"{self.ui_url}/runs/flow-run/{flow_run_id}"


def ui_url_of(api_url: str) -> str:
    """The UI that serves ``api_url``: Prefect Cloud's app.prefect.cloud page of the workspace, or a
    self-hosted server's root (the API lives under ``/api``), as Prefect derives its own UI URL."""
    if "://api.prefect.cloud/" in api_url:
        return (api_url.replace("://api.", "://app.", 1).replace("/api/accounts/", "/account/", 1)
                .replace("/workspaces/", "/workspace/", 1))
    return api_url.removesuffix("/api")


class PrefectHook(BaseHook):
    """Talks to the Prefect API of connection ``prefect_conn_id`` (type ``prefect``)."""

    conn_name_attr = "prefect_conn_id"
    default_conn_name = "prefect_default"
    conn_type = "prefect"
    hook_name = "Prefect"

    def __init__(self, prefect_conn_id: str = default_conn_name, **kwargs: Any):
        super().__init__(**kwargs)
        self.prefect_conn_id = prefect_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form in Airflow's UI."""
        return {
            "hidden_fields": ["schema", "port"],
            "relabeling": {"host": "Prefect API URL", "password": "API key (or basic-auth password)",
                           "login": "Basic-auth user (self-hosted; empty for an API key)"},
            "placeholders": {"host": "http://127.0.0.1:4200/api", "extra": '{"ui_url": "http://127.0.0.1:4200"}'},
        }

    def get_api(self) -> PrefectAPI:
        return self._api(self.get_connection(self.prefect_conn_id))

    async def aget_api(self) -> PrefectAPI:
        return self._api(await self.aget_connection(self.prefect_conn_id))

    def _api(self, conn: Any) -> PrefectAPI:
        host = (conn.host or "").strip().rstrip("/")
        if not host:
            raise AirflowException(f"Airflow connection {self.prefect_conn_id!r}: host is empty; set it to the "
                                   f"Prefect API URL (e.g. http://127.0.0.1:4200/api)")
        if "://" in host:
            api_url = host
        else:
            api_url = f"http://{host}{f':{conn.port}' if conn.port else ''}/{(conn.schema or 'api').strip('/')}"
        extra = conn.extra_dejson
        ui_url = str(extra.get("ui_url") or ui_url_of(api_url)).rstrip("/")
        if conn.login:
            return PrefectAPI(api_url, ui_url, basic_auth=(conn.login, conn.password or ""))
        return PrefectAPI(api_url, ui_url, api_key=conn.password or None)

    def cancel_flow_run(self, flow_run_id: str, reason: str) -> str:
        """Cancel the run (Cancelling; the worker stops it). Returns Prefect's orchestration status."""
        with self.get_api().rest() as api:
            return api.cancel_flow_run(flow_run_id, reason)

    async def acancel_flow_run(self, flow_run_id: str, reason: str) -> str:
        """:meth:`cancel_flow_run` from an event loop (the triggerer)."""
        async with (await self.aget_api()).async_client() as http:
            response = await http.post(f"flow_runs/{flow_run_id}/set_state", json=cancelling(reason))
            response.raise_for_status()
            return response.json()["status"]
