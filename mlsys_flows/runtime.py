"""Make the embedded (ephemeral) Prefect API reachable from Dask worker processes.

Without ``PREFECT_API_URL`` each Dask worker process would start its own temporary API and
time out (DESIGN.md, Known pitfalls). Inside a flow run the ephemeral server already runs in
a subprocess; its URL is exported so that workers spawned afterwards report to the same API.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
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
