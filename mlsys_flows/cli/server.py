"""`mlsys-flows server`: a local Prefect server, its work pool and worker, and the warm Dask cluster."""
from __future__ import annotations

import typer

from mlsys_flows.cli.console import console, fail, warn
from mlsys_flows.settings import configure_prefect_home


def server(host: str = typer.Option("127.0.0.1", help="Interface to bind (keep 127.0.0.1 unless behind a proxy)."),
           port: int = typer.Option(4200, help="API and UI port."),
           worker: bool = typer.Option(True, help="Start a process worker for the mlsys-process work pool."),
           worker_query_seconds: float = typer.Option(5.0, min=1, max=60, help="How often the worker polls."),
           warm_cluster: bool = typer.Option(True, help="Start a Dask cluster with the flows imported; runs "
                                                        "without --cluster attach to it."),
           allow_insecure: bool = typer.Option(False, "--allow-insecure", help="Bind a non-loopback --host without "
                                               "PREFECT_SERVER_API_AUTH_STRING (warns; default: refuse).")) -> None:
    """Start a local Prefect server, the mlsys-process work pool, a worker, and register the blocks.

    SQLite under the data folder (MLSYS_FLOWS_HOME/server/), or PostgreSQL when
    PREFECT_API_DATABASE_CONNECTION_URL is set. Ctrl-C stops everything.
    """
    configure_prefect_home()
    from mlsys_flows.platform.server import LocalPlatform, PlatformError, check_binding, serve_forever, server_missing_auth

    try:
        warn(check_binding(host, "the Prefect API and UI", server_missing_auth(), allow_insecure))
        serve_forever(LocalPlatform(host=host, port=port, worker=worker, worker_query_s=worker_query_seconds,
                                    warm_cluster=warm_cluster),
                      echo=lambda m: console.print(m, highlight=False, soft_wrap=True))
    except PlatformError as exc:
        fail(str(exc))
