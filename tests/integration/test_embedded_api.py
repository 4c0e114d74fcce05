"""The CLI's default API: with no server running, `mlsys-flows run` starts the embedded API first (it
boots while the flow is imported), runs the flow against it and stops it on exit."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

APP = "prefect.server.api.server:create_app"


def _api_servers() -> set[int]:
    found = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if APP in " ".join(p.info["cmdline"] or []):
                found.add(p.info["pid"])
        except psutil.Error:
            pass
    return found


def test_cli_run_starts_the_embedded_api_early_and_stops_it(tmp_path):
    before = _api_servers()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(MLSYS_FLOWS_HOME=str(tmp_path / "home"), PREFECT_LOGGING_LEVEL="WARNING")
    cli = str(Path(sys.executable).parent / "mlsys-flows")
    proc = subprocess.run([cli, "run", "moetuner", "--scale", "smoke"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Prefect API: embedded, temporary" in proc.stdout
    assert "moetuner finished" in proc.stdout
    log = tmp_path / "home" / "prefect" / "embedded-api.log"
    assert log.exists()  # the server this command started, not Prefect's on-demand one
    assert _api_servers() <= before, "the embedded API outlived the command"
