"""Where mlsys-flows keeps its local state. Pure: importable without prefect.

``MLSYS_FLOWS_HOME`` (default ``./.mlsys-flows`` in the working directory) holds the default
storage folder (``storage/``) and, unless ``PREFECT_HOME`` is set, the Prefect database.
:func:`project_root` says where the project's own files are, in a checkout or installed.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path


PACKAGE = Path(__file__).resolve().parent
WHEEL_PROJECT = "_project"  # setup.py copies the checkout's files here in the wheel


def project_root() -> Path:
    """The folder holding the project's files: ``flows/<name>.py`` (deployment entrypoints),
    ``infra/`` and ``benchmarks/results/``. In a checkout (editable install) the repository; installed
    from the wheel, the copy of those files it carries in ``mlsys_flows/_project/`` (setup.py)."""
    checkout = PACKAGE.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "flows").is_dir():
        return checkout
    return PACKAGE / WHEEL_PROJECT


def is_checkout() -> bool:
    """True in a source checkout, False installed from the wheel (no README, docs or git history)."""
    return project_root() == PACKAGE.parent


def home() -> Path:
    return Path(os.environ.get("MLSYS_FLOWS_HOME", Path.cwd() / ".mlsys-flows")).resolve()


def server_state_file(root: Path | None = None) -> Path:
    """Where a running `mlsys-flows server` records its API URL and its warm Dask cluster's address."""
    return (root or home()) / "server" / "server.json"


def warm_cluster_address(api_url: str | None) -> str | None:
    """The scheduler address of the warm Dask cluster of the running `mlsys-flows server` whose API is
    ``api_url`` (the API this run reports to), if it answers; else None (a run then starts its own)."""
    try:
        info = json.loads(server_state_file().read_text())
    except (OSError, ValueError):
        return None
    address = info.get("dask_address")
    if not address or not api_url or str(info.get("api_url", "")).rstrip("/") != api_url.rstrip("/"):
        return None
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    try:  # a server killed without its stop leaves the file behind
        socket.create_connection((host, int(port)), timeout=2).close()
    except (OSError, ValueError):
        return None
    return address


def default_storage_url() -> str:
    return (home() / "storage").as_uri()


def configure_prefect_home() -> None:
    """Keep Prefect's SQLite database under the project's data folder unless the user chose one.
    Must run before prefect is imported."""
    os.environ.setdefault("PREFECT_HOME", str(home() / "prefect"))
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # The embedded API's SQLite migrations can take over a minute on a loaded 2-core machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
