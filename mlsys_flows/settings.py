"""Where mlsys-flows keeps its local state. Pure: importable without prefect.

``MLSYS_FLOWS_HOME`` (default ``./.mlsys-flows`` in the working directory) holds the default
storage folder (``storage/``) and, unless ``PREFECT_HOME`` is set, the Prefect database.
"""
from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("MLSYS_FLOWS_HOME", Path.cwd() / ".mlsys-flows")).resolve()


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
