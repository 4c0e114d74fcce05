"""`mlsys-flows server`: a working local platform in one command.

A real ``prefect server`` (SQLite under ``<MLSYS_FLOWS_HOME>/server/`` by default, PostgreSQL
when ``PREFECT_API_DATABASE_CONNECTION_URL`` is set), the ``mlsys-process`` process work pool,
a process worker, and the mlsys block types registered. Server and worker run in process
groups of their own and stop TERM -> INT -> KILL (see procs.py), so Ctrl-C leaves no strays.
The API URL is written to ``<home>/server/server.json`` so that `mlsys-flows deploy` and
`mlsys-flows webhooks serve` in another terminal find it without any export.
"""
from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from mlsys_flows.prefect_rest import PrefectREST
from mlsys_flows.procs import Proc, stop_all, stop_on_signals
from mlsys_flows.settings import configure_prefect_home, home

WORK_POOL = "mlsys-process"
STOP_GRACE_S = 3.0  # per signal and process: the whole platform stops within 10 s of Ctrl-C


class PlatformError(RuntimeError):
    """The platform could not start; the message says why (with the log tail)."""


def state_file(root: Path | None = None) -> Path:
    return (root or home()) / "server" / "server.json"


def _bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise PlatformError(f"`{name}` executable not found next to {sys.executable} or on PATH")
    return found


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def discover_api_url() -> str | None:
    """``PREFECT_API_URL`` if set, else the URL of a running `mlsys-flows server`, else None."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    path = state_file()
    if path.exists():
        url = json.loads(path.read_text()).get("api_url")
        if url:
            with PrefectREST(url) as api:
                if api.healthy():
                    return url
    return None


class LocalPlatform:
    """Server + work pool + worker + blocks; a context manager. ``worker=False`` skips the worker."""

    def __init__(self, host: str = "127.0.0.1", port: int = 4200, root: Path | None = None,
                 work_pool: str = WORK_POOL, worker: bool = True, worker_query_s: float = 5.0,
                 database_url: str | None = None, extra_env: dict[str, str] | None = None):
        self.host, self.port, self.work_pool, self.with_worker = host, port, work_pool, worker
        self.root = Path(root or home()).resolve()
        self.dir = self.root / "server"
        self.api_url = f"http://{host}:{port}/api"
        self.ui_url = f"http://{host}:{port}"
        self.database_url = database_url or os.environ.get("PREFECT_API_DATABASE_CONNECTION_URL") \
            or f"sqlite+aiosqlite:///{self.dir / 'prefect.db'}"
        self.worker_query_s = worker_query_s
        self.extra_env = dict(extra_env or {})
        self.procs: list[Proc] = []

    @property
    def database(self) -> str:
        """The database kind and location, without credentials."""
        url = self.database_url
        return "PostgreSQL at " + url.rsplit("@", 1)[-1] if url.startswith("postgresql") else f"SQLite {url.split(':///', 1)[-1]}"

    def env(self) -> dict[str, str]:
        """Environment of the server, the worker and the flow runs it starts."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update({
            "PREFECT_HOME": str(self.dir),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_UI_API_URL": self.api_url,  # else the UI cannot connect on a non-default port
            "PREFECT_API_DATABASE_CONNECTION_URL": self.database_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": str(self.worker_query_s),
            "MLSYS_FLOWS_HOME": str(self.root),
        })
        for key in ("PREFECT_API_AUTH_STRING", "PREFECT_SERVER_API_AUTH_STRING", "PREFECT_LOGGING_LEVEL"):
            if key in os.environ:
                env[key] = os.environ[key]
        env.update(self.extra_env)
        return env

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout_s: float = 240.0) -> "LocalPlatform":
        if not port_free(self.host, self.port):
            raise PlatformError(f"port {self.port} on {self.host} is in use (another Prefect server?); "
                                f"choose one with --port")
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self.procs.append(Proc("server", [_bin("prefect"), "server", "start", "--host", self.host,
                                              "--port", str(self.port)],
                                   env=self.env(), log=self.dir / "server.log"))
            self._wait_healthy(timeout_s)
            self.setup()
            if self.with_worker:
                self.start_worker(timeout_s)
            state_file(self.root).write_text(json.dumps(
                {"api_url": self.api_url, "ui_url": self.ui_url, "pid": os.getpid(), "work_pool": self.work_pool}))
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        with PrefectREST(self.api_url) as api:
            _wait_ready(self.procs[0], api.healthy, "healthy", timeout_s)

    def setup(self) -> None:
        """Create the process work pool and register the block types (idempotent)."""
        ensure_work_pool(self.api_url, self.work_pool)
        register_blocks(self.api_url, self.root)

    def start_worker(self, timeout_s: float = 120.0) -> Proc:
        worker = Proc("worker", [_bin("prefect"), "worker", "start", "--pool", self.work_pool, "--type", "process",
                                 "--name", f"{self.work_pool}-local"],
                      env=self.env(), cwd=self.root.parent if self.root.parent.exists() else None,
                      log=self.dir / "worker.log")
        self.procs.append(worker)

        def online(api: PrefectREST) -> bool:  # the worker has polled the pool
            workers = api._call("POST", f"work_pools/{self.work_pool}/workers/filter", json={}).json()
            return any(w.get("status") == "ONLINE" for w in workers)

        with PrefectREST(self.api_url) as api:
            _wait_ready(worker, lambda: online(api), "online", timeout_s)
        return worker

    def stop(self) -> None:
        """The worker (and the flow-run processes and Dask clusters it started) first, so that a run
        in flight can report its crash to the server; runs still left Pending or Running are then
        marked Crashed; the server last. Each process: TERM, INT, KILL, ``STOP_GRACE_S`` apart."""
        server, others = self.procs[:1], self.procs[1:]
        stop_all(others, grace_s=STOP_GRACE_S)
        if server and server[0].alive():
            self._crash_orphans()
        stop_all(server, grace_s=STOP_GRACE_S)
        self.procs.clear()
        path = state_file(self.root)
        if path.exists() and json.loads(path.read_text()).get("api_url") == self.api_url:
            path.unlink()

    def _crash_orphans(self) -> list[str]:
        """Mark this work pool's runs that are still Pending or Running as Crashed: their processes
        are gone with the worker, and a run left Running would read as still going in the UI."""
        crashed = []
        try:
            with PrefectREST(self.api_url) as api:
                runs = api._call("POST", "flow_runs/filter", attempts=2, json={
                    "work_pools": {"name": {"any_": [self.work_pool]}},
                    "flow_runs": {"state": {"type": {"any_": ["PENDING", "RUNNING", "CANCELLING"]}}}}).json()
                for run in runs:
                    api._call("POST", f"flow_runs/{run['id']}/set_state", attempts=2, json={
                        "state": {"type": "CRASHED", "name": "Crashed",
                                  "message": "the local platform (`mlsys-flows server`) was stopped during the run"},
                        "force": True})
                    crashed.append(run["id"])
        except Exception:  # noqa: BLE001 - best effort: the stop goes on whatever the API says
            pass
        return crashed

    def __enter__(self) -> "LocalPlatform":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_ready(proc: Proc, ready: Callable[[], bool], what: str, timeout_s: float, poll_s: float = 0.5) -> None:
    """Poll ``ready`` until it holds; fail with the process's log tail if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if not proc.alive():
            raise PlatformError(f"prefect {proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise PlatformError(f"prefect {proc.name} not {what} after {timeout_s:.0f} s:\n{proc.tail()}")
        time.sleep(poll_s)


def ensure_work_pool(api_url: str, name: str = WORK_POOL, pool_type: str = "process",
                     base_job_template: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create the work pool unless it exists; returns it."""
    from mlsys_flows.infra import default_job_template

    with PrefectREST(api_url) as api:
        existing = api._http.get(f"work_pools/{name}")
        if existing.status_code == 200:
            return existing.json()
        return api._call("POST", "work_pools/", json={
            "name": name, "type": pool_type, "description": f"mlsys-flows {pool_type} work pool",
            "base_job_template": base_job_template or default_job_template(pool_type)}).json()


def register_blocks(api_url: str, root: Path | None = None) -> list[str]:
    """Register the mlsys block types and save the local defaults (storage, cluster) as ``local``."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from mlsys_flows.blocks import CheckpointStore, DaskCluster, ObjectStorage, ResourcePool

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        slugs = []
        for block in (ObjectStorage, CheckpointStore, DaskCluster, ResourcePool):
            block.register_type_and_schema()
            slugs.append(block.get_block_type_slug())
        ObjectStorage(url=((root or home()) / "storage").as_uri()).save("local", overwrite=True)
        DaskCluster().save("local", overwrite=True)
    return slugs


def serve_forever(platform: LocalPlatform, echo=print) -> None:
    """Start, print where things are, block until Ctrl-C / SIGTERM, then stop everything."""
    previous = stop_on_signals()  # also when started with SIGINT ignored (a background job)
    try:
        echo(f"starting Prefect server on {platform.ui_url} ({platform.database}) ...")
        platform.start()
        echo(f"Prefect UI      {platform.ui_url}")
        echo(f"API             export PREFECT_API_URL={platform.api_url}")
        echo(f"work pool       {platform.work_pool} (process), worker online" if platform.with_worker
             else f"work pool       {platform.work_pool} (process), no worker")
        echo(f"logs            {platform.dir}/server.log, worker.log")
        echo("next: `mlsys-flows deploy` in another terminal; Ctrl-C stops everything")
        while all(p.alive() for p in platform.procs):
            time.sleep(0.2)
        dead = [p for p in platform.procs if not p.alive()]
        echo(f"{dead[0].name} exited unexpectedly:\n{dead[0].tail()}")
    except KeyboardInterrupt:
        echo("stopping (worker and its runs, then server) ...")
    finally:
        platform.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        echo("stopped")


class EmbeddedAPI:
    """The embedded (temporary) Prefect API, started the moment a command knows it needs one.

    Prefect's own ephemeral mode starts this same server (uvicorn on
    ``prefect.server.api.server:create_app``, UI off) on the first API call, and the command waits
    for it: about 10 s of importing and booting on these 2 cores. Started first, in its own process,
    it boots while the command imports the flow and its libraries. ``PREFECT_API_URL`` is set at once
    (before prefect is imported) so that this process and every Dask worker use it; ``ready()``
    blocks until it answers. Stopped, by its process group, when the command exits."""

    def __init__(self, log: Path):
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
        if not self._ready:
            timeout_s = timeout_s or float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))
            with PrefectREST(self.api_url) as api:
                _wait_ready(self.proc, api.healthy, "healthy", timeout_s, poll_s=0.1)
            self._ready = True
        return self.api_url

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
