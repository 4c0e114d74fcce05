"""The embedded (ephemeral) Prefect API: started early, and reachable from Dask worker processes.

Without ``PREFECT_API_URL`` each Dask worker process would start its own temporary API and
time out (DESIGN.md, Known pitfalls). Inside a flow run the ephemeral server already runs in
a subprocess; its URL is exported so that workers spawned afterwards report to the same API.
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def shared_api() -> Iterator[str | None]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = PREFECT_API_URL.value()
    if url:
        os.environ.setdefault("PREFECT_API_URL", url)
        yield url
        return
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        url = str(client.api_url).rstrip("/")
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous


class EmbeddedAPI:
    """The embedded (temporary) Prefect API, started the moment a command knows it needs one.

    Prefect's own ephemeral mode starts this same server (uvicorn on
    ``prefect.server.api.server:create_app``, UI off) on the first API call, and the command waits
    for it: about 10 s of importing and booting on these 2 cores. Started first, in its own process,
    it boots while the command imports the flow and its libraries. ``PREFECT_API_URL`` is set at once
    (before prefect is imported) so that this process and every Dask worker use it; ``ready()``
    blocks until it answers. Stopped, by its process group, when the command exits."""

    def __init__(self, log: Path):
        from mlsys_flows.procs import Proc
        from mlsys_flows.server import free_port

        spec = importlib.util.find_spec("prefect")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("prefect is not installed")
        port = free_port()
        self.api_url = f"http://127.0.0.1:{port}/api"
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env.update({"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"})
        log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = Proc("embedded-api", [sys.executable, "-m", "uvicorn", "--app-dir",
                                          str(Path(spec.submodule_search_locations[0]).parent), "--factory",
                                          "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port",
                                          str(port), "--log-level", "error", "--lifespan", "on"], env=env, log=log)
        os.environ["PREFECT_API_URL"] = self.api_url
        self._ready = False
        atexit.register(self.stop)

    def ready(self, timeout_s: float | None = None) -> str:
        """Wait until the API answers its health check; its URL. Raises with the server's log tail
        when it exits or does not answer within ``timeout_s`` (default: Prefect's ephemeral timeout)."""
        if self._ready:
            return self.api_url
        timeout_s = timeout_s or float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise RuntimeError(f"the embedded Prefect API exited ({self.proc.popen.returncode}):\n{self.proc.tail()}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        self._ready = True
                        return self.api_url
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the embedded Prefect API did not answer within {timeout_s:.0f} s "
                           f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS):\n{self.proc.tail()}")

    def stop(self) -> None:
        if self.proc.alive():
            self.proc.stop(grace_s=5.0)
        if os.environ.get("PREFECT_API_URL") == self.api_url:
            os.environ.pop("PREFECT_API_URL")


_EMBEDDED: EmbeddedAPI | None = None


def start_embedded_api() -> EmbeddedAPI | None:
    """Start the embedded API now, unless an API is configured (``PREFECT_API_URL``) or one was
    started already; call before prefect is imported. Returns the one this process started."""
    global _EMBEDDED
    if _EMBEDDED is None and not os.environ.get("PREFECT_API_URL"):
        from mlsys_flows.settings import configure_prefect_home

        configure_prefect_home()
        _EMBEDDED = EmbeddedAPI(Path(os.environ["PREFECT_HOME"]) / "embedded-api.log")
    return _EMBEDDED


def embedded_api() -> EmbeddedAPI | None:
    """The embedded API this process started, if any."""
    return _EMBEDDED


def api_ready() -> None:
    """Block until the embedded API this process started answers (at once when none was started)."""
    if _EMBEDDED is not None:
        _EMBEDDED.ready()
