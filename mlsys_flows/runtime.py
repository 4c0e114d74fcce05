"""Dask runtime glue: the embedded Prefect API reachable from Dask worker processes; workers warmed.

Without ``PREFECT_API_URL`` each Dask worker process would start its own temporary API and
time out. Inside a flow run the ephemeral server already runs in
a subprocess; its URL is exported so that workers spawned afterwards report to the same API.
"""
from __future__ import annotations

import importlib
import logging
import os
from contextlib import contextmanager
from typing import Iterator

from distributed.diagnostics.plugin import WorkerPlugin


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


class WarmImports(WorkerPlugin):
    """A Dask worker plugin that imports ``module`` on every worker of the cluster, those present
    when a run starts and those that join later (an adaptive cluster's), before their first task:
    a cold worker would stall the run in the middle. One name per module: registering it again
    replaces it rather than adding one."""

    def __init__(self, module: str):
        self.module = module
        self.name = f"mlsys-warm-{module}"

    def setup(self, worker) -> None:
        try:
            importlib.import_module(self.module)
        except ImportError as exc:  # warming only saves time: the first task would fail on its own, clearly
            logging.getLogger(__name__).warning("could not pre-import %s on worker %s: %s",
                                                self.module, worker.address, exc)


class QuickExit(WorkerPlugin):
    """Frees a closing worker process from the interpreter's final garbage collections: they traverse
    every object its imports made (Prefect, pydantic, torch), which on a loaded machine took past the
    nanny's 4 s, so the nanny killed the process ("Worker process still alive after 4.0 seconds,
    killing") at the end of every local run. Frozen objects are skipped by those collections."""

    name = "mlsys-quick-exit"

    def teardown(self, worker) -> None:
        import gc

        gc.freeze()


def quick_exit(client) -> None:
    """Register :class:`QuickExit` on every worker of ``client``'s cluster (once per name)."""
    client.register_plugin(QuickExit(), name=QuickExit.name)


def warm_workers(client, module: str) -> None:
    """Register :class:`WarmImports` for ``module``: the workers present import it now, in parallel."""
    plugin = WarmImports(module)
    client.register_plugin(plugin, name=plugin.name)
