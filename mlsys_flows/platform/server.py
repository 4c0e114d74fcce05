"""`mlsys-flows server`: a working local platform in one command.

A real ``prefect server`` (SQLite under ``<MLSYS_FLOWS_HOME>/server/`` by default, PostgreSQL
when ``PREFECT_API_DATABASE_CONNECTION_URL`` is set), the ``mlsys-process`` process work pool,
a process worker, and the mlsys block types registered. Server and worker run in process
groups of their own and stop TERM -> INT -> KILL (see procs.py), so Ctrl-C leaves no strays.
The API URL is written to ``<home>/server/server.json`` so that `mlsys-flows deploy` and
`mlsys-flows webhooks serve` in another terminal find it without any export.

A warm Dask cluster (on by default, ``warm_cluster=False`` / ``--no-warm-cluster`` to skip): a scheduler and
two worker processes (the default ``DaskCluster``'s shape) whose workers import every flow as they start
(``dask_setup``, their preload). Its address goes into the same server.json; a flow run reporting to this
server with no cluster of its own attaches to it (``settings.warm_cluster_address``), so no run starts or
stops a cluster or waits for cold imports. It outlives the runs and stops with the platform.
"""
from __future__ import annotations

import atexit
import ipaddress
import json
import os
import shutil
import signal
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from mlsys_flows.errors import MlsysError
from mlsys_flows.platform.prefect_rest import PrefectREST
from mlsys_flows.platform.procs import Proc, stop_all, stop_on_signals
from mlsys_flows.settings import configure_prefect_home, home, server_state_file
from mlsys_flows.systems.common.net import free_port

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

WORK_POOL = "mlsys-process"
STOP_GRACE_S = 3.0  # per signal and process: the whole platform stops within 10 s of Ctrl-C
WARM_WORKERS = 2  # as DaskCluster()'s embedded LocalCluster: 2 processes, 1 thread each
LOOPBACK = "127.0.0.1"  # every port of the warm cluster (issue 52)


class PlatformError(MlsysError, RuntimeError):
    """The platform could not start; the message says why (with the log tail)."""


def state_file(root: Path | None = None) -> Path:
    return server_state_file(root)


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


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; any other name or address may be reachable from outside."""
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_binding(host: str, what: str, missing_auth: str | None, allow_insecure: bool = False) -> str | None:
    """Refuse (PlatformError) to serve ``what`` on a non-loopback ``host`` when ``missing_auth`` says
    which authentication is lacking, unless ``allow_insecure``: then the warning to print. None: fine."""
    if missing_auth is None or is_loopback(host):
        return None
    problem = f"{what} on {host} would be reachable from other machines, and {missing_auth}"
    if not allow_insecure:
        raise PlatformError(f"refusing to bind: {problem}. Bind 127.0.0.1 (behind a proxy that authenticates), "
                            f"configure the authentication, or pass --allow-insecure")
    return f"insecure binding (--allow-insecure): {problem}"


def server_missing_auth() -> str | None:
    """What `mlsys-flows server` lacks to authenticate its API and UI, or None."""
    if os.environ.get("PREFECT_SERVER_API_AUTH_STRING"):
        return None
    return "PREFECT_SERVER_API_AUTH_STRING is not set (the API and UI accept anyone)"


@contextmanager
def prefect_client(api_url: str, retries: int | None = None) -> Iterator["SyncPrefectClient"]:
    """Prefect's own synchronous client (``prefect.get_client``) on ``api_url``, whatever this
    process's ``PREFECT_API_URL`` says; ``retries`` overrides ``PREFECT_CLIENT_MAX_RETRIES``."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    updates: dict[Any, Any] = {PREFECT_API_URL: api_url}
    if retries is not None:
        updates[PREFECT_CLIENT_MAX_RETRIES] = retries
    with temporary_settings(updates=updates), get_client(sync_client=True) as client:
        yield client


def discover_api_url() -> str | None:
    """``PREFECT_API_URL`` if set, else the URL of a running `mlsys-flows server`, else None.
    Imports no prefect (a bare HTTP health check): the CLI calls it before prefect is imported,
    and prefect reads its settings once, at import."""
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
                 database_url: str | None = None, extra_env: dict[str, str] | None = None,
                 warm_cluster: bool = True):
        self.host, self.port, self.work_pool, self.with_worker = host, port, work_pool, worker
        self.with_warm_cluster, self.dask_address = warm_cluster, None
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
            if self.with_warm_cluster:
                self.start_warm_cluster(timeout_s)
            if self.with_worker:
                self.start_worker(timeout_s)
            state_file(self.root).write_text(json.dumps(
                {"api_url": self.api_url, "ui_url": self.ui_url, "pid": os.getpid(), "work_pool": self.work_pool,
                 "dask_address": self.dask_address}))
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        with prefect_client(self.api_url, retries=0) as client:
            _wait_ready(self.procs[0], lambda: client.api_healthcheck() is None, "healthy", timeout_s)

    def setup(self) -> None:
        """Create the process work pool and register the block types (idempotent)."""
        ensure_work_pool(self.api_url, self.work_pool)
        register_blocks(self.api_url, self.root)

    def start_warm_cluster(self, timeout_s: float = 240.0) -> str:
        """`dask scheduler` and `dask worker` (its nannies restart a lost worker, preloaded again) on
        127.0.0.1; returns the scheduler's address once every worker has imported the flows.

        Every port on 127.0.0.1 (issue 52): Dask's HTTP servers bind all interfaces unless told, even
        with --no-dashboard (the scheduler's on 8787), and a worker's comm port runs pickled tasks
        unauthenticated. The scheduler's HTTP server (its /status dashboard with bokeh installed, a page
        saying to install it without) takes a free loopback port, so the link a run prints answers."""
        scheduler_file = self.dir / "dask-scheduler.json"
        scheduler_file.unlink(missing_ok=True)
        cwd = self.root.parent if self.root.parent.exists() else None
        dask = [sys.executable, "-m", "dask"]  # no console script needed (an installed wheel borrowing a venv's)
        scheduler = Proc("dask-scheduler", [*dask, "scheduler", "--host", LOOPBACK, "--port", "0",
                                            "--dashboard-address", f"{LOOPBACK}:0",
                                            "--scheduler-file", str(scheduler_file)],
                         env=self.env(), cwd=cwd, log=self.dir / "dask-scheduler.log")
        self.procs.append(scheduler)
        _wait_ready(scheduler, lambda: _scheduler_address(scheduler_file) is not None, "up", timeout_s)
        address = _scheduler_address(scheduler_file)
        workers = Proc("dask-workers", [*dask, "worker", address, "--nworkers", str(WARM_WORKERS),
                                        "--host", LOOPBACK,  # the nannies' and workers' comm ports
                                        "--no-dashboard", "--dashboard-address", f"{LOOPBACK}:0",  # HTTP
                                        "--nthreads", "1", "--preload", __name__,
                                        "--local-directory", str(self.dir / "dask-workers")],
                       env=self.env(), cwd=cwd, log=self.dir / "dask-workers.log")
        self.procs.append(workers)
        from distributed import Client

        with Client(address, timeout=timeout_s) as client:  # a worker registers after its preload
            _wait_ready(workers, lambda: len(client.scheduler_info(n_workers=-1)["workers"]) >= WARM_WORKERS,
                        "registered (flows imported)", timeout_s)
        self.dask_address = address
        return address

    def start_worker(self, timeout_s: float = 120.0) -> Proc:
        worker = Proc("worker", [_bin("prefect"), "worker", "start", "--pool", self.work_pool, "--type", "process",
                                 "--name", f"{self.work_pool}-local"],
                      env=self.env(), cwd=self.root.parent if self.root.parent.exists() else None,
                      log=self.dir / "worker.log")
        self.procs.append(worker)

        from prefect.client.schemas.objects import WorkerStatus

        with prefect_client(self.api_url) as client:  # online: the worker has polled the pool
            _wait_ready(worker, lambda: any(w.status == WorkerStatus.ONLINE for w in
                                            client.read_workers_for_work_pool(self.work_pool)), "online", timeout_s)
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
        are gone with the worker, and a run left Running would read as still going in the UI. So are
        the unfinished task runs of any of the pool's runs: the flow process crashes its own in-flight
        task runs when interrupted, but a task a Dask worker moved to Running after that sweep (or
        one whose flow process was killed first) would read Running forever."""
        from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterId, FlowRunFilterState,
                                                    FlowRunFilterStateType, TaskRunFilter, TaskRunFilterState,
                                                    TaskRunFilterStateType, WorkPoolFilter, WorkPoolFilterName)
        from prefect.client.schemas.objects import StateType
        from prefect.states import Crashed

        from mlsys_flows.task_runs import UNFINISHED

        crashed = []
        live = [StateType.PENDING, StateType.RUNNING, StateType.CANCELLING]
        message = "the local platform (`mlsys-flows server`) was stopped during the run"
        pool = WorkPoolFilter(name=WorkPoolFilterName(any_=[self.work_pool]))
        unfinished = TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(
            any_=[StateType(s) for s in UNFINISHED])))
        try:
            with prefect_client(self.api_url, retries=1) as client:  # one retry: the stop has 10 s in all
                runs = client.read_flow_runs(
                    work_pool_filter=pool,
                    flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=live))))
                for run in runs:
                    client.set_flow_run_state(run.id, Crashed(message=message), force=True)
                    crashed.append(str(run.id))
                # every process the worker started is gone by now: nothing can move these again
                with_tasks = client.read_flow_runs(work_pool_filter=pool, task_run_filter=unfinished)
                if with_tasks:
                    for task in client.read_task_runs(
                            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[r.id for r in with_tasks])),
                            task_run_filter=unfinished):
                        client.set_task_run_state(task.id, Crashed(message=message), force=True)
        except Exception:  # noqa: BLE001 - best effort: the stop goes on whatever the API says
            pass
        return crashed

    def __enter__(self) -> "LocalPlatform":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _scheduler_address(path: Path) -> str | None:
    try:  # absent, or half-written on the first look
        return json.loads(path.read_text())["address"]
    except (OSError, ValueError, KeyError):
        return None


def dask_setup(worker) -> None:
    """The warm cluster's worker preload (`dask worker --preload mlsys_flows.platform.server`): import every
    flow and the report's plotting now, so no run waits for it. A system that fails to import is only logged: its
    runs fail on their own, the others still run warm."""
    import importlib
    import logging

    from mlsys_flows import registry

    for name in registry.names():
        try:
            importlib.import_module(f"mlsys_flows.flows.{name}")
        except Exception as exc:  # noqa: BLE001 - see above
            logging.getLogger("distributed.worker").warning("warm cluster: flow %s not imported: %r", name, exc)
    # every run ends by rendering its report's plot on a worker
    importlib.import_module("mlsys_flows.systems.common.plotting").warm()


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
    """Create the work pool unless it exists; returns it (as JSON)."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    from mlsys_flows.platform.infra import default_job_template

    with prefect_client(api_url) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            pool = client.create_work_pool(WorkPoolCreate(
                name=name, type=pool_type, description=f"mlsys-flows {pool_type} work pool",
                base_job_template=base_job_template or default_job_template(pool_type)))
        return pool.model_dump(mode="json")


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
        if platform.dask_address:
            echo(f"warm cluster    {platform.dask_address} ({WARM_WORKERS} Dask workers, flows imported; "
                 f"runs with no --cluster use it)")
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


# Prefect's public settings that make `prefect server start` what its own temporary API is: no UI, no
# analytics, and only the services a temporary API runs (task-run recording, events, automations):
# the scheduler, late runs, foreman, cancellation cleanup, pause expirations, repossessor, cleanup
# reconciler and database vacuum stay off.
EMBEDDED_SETTINGS = {
    "PREFECT_SERVER_UI_ENABLED": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    **{f"PREFECT_SERVER_SERVICES_{service}_ENABLED": "false" for service in
       ("SCHEDULER", "LATE_RUNS", "FOREMAN", "CANCELLATION_CLEANUP", "PAUSE_EXPIRATIONS", "REPOSSESSOR",
        "CLEANUP_RECONCILER")},
    "PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED": "[]",  # a set of what to vacuum: nothing
}


class EmbeddedAPI:
    """The embedded (temporary) Prefect API, started the moment a command knows it needs one.

    Prefect's own ephemeral mode starts a server on the first API call, and the command waits for
    it: several seconds of importing and booting on 2 cores. This one is `prefect server start` on a
    free 127.0.0.1 port with ``EMBEDDED_SETTINGS`` (over the user's environment), started
    first, in its own process group, so that it boots while the command imports the flow and its
    libraries. ``PREFECT_API_URL`` is set at once (before prefect is imported) so that this process
    and every Dask worker use it; ``ready()`` blocks until it answers. Stopped, by its process group
    (TERM, INT, KILL), when the command exits."""

    def __init__(self, log: Path):
        port = free_port()
        self.api_url = f"http://127.0.0.1:{port}/api"
        env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}, **EMBEDDED_SETTINGS}
        log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = Proc("embedded-api", [_bin("prefect"), "--no-prompt", "server", "start", "--host", "127.0.0.1",
                                          "--port", str(port)], env=env, log=log)
        os.environ["PREFECT_API_URL"] = self.api_url
        self._ready = False
        atexit.register(self.stop)

    def ready(self, timeout_s: float | None = None) -> str:
        """Wait until the API answers its health check; its URL. Raises with the server's log tail
        when it exits or does not answer within ``timeout_s`` (default: Prefect's ephemeral timeout).
        A bare HTTP probe every 0.1 s: through Prefect's client the first task started ~0.5 s later."""
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
