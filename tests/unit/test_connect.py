"""`mlsys_flows.connect()` in a session that imported prefect first: Prefect read its settings then, so
connect must rebuild them (else blocks go to ~/.prefect); inside an entered settings context, which it
cannot change, it fails naming the cause. No server: PREFECT_API_URL is taken as set, unprobed."""
from __future__ import annotations

import subprocess
import sys

import pytest

import mlsys_flows
from mlsys_flows.platform.runner import RunError

API = "http://127.0.0.1:9/api"


@pytest.fixture
def api_in_env(monkeypatch, tmp_path):
    from prefect.context import refresh_global_settings_context

    for key, value in {"PREFECT_API_URL": API, "MLSYS_FLOWS_HOME": str(tmp_path),
                       "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                       "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}.items():
        monkeypatch.setenv(key, value)
    yield
    monkeypatch.undo()
    refresh_global_settings_context()  # this process's other tests: Prefect's settings as they were


def test_connect_points_prefect_at_the_api_when_prefect_was_imported_first(api_in_env):
    from prefect.settings import PREFECT_API_URL, get_current_settings

    assert mlsys_flows.connect() == API
    assert get_current_settings().api.url == API and PREFECT_API_URL.value() == API


def test_connect_inside_a_settings_context_fails_naming_it(api_in_env):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:8/api"}):
        with pytest.raises(RunError, match="a settings context is entered .* call mlsys_flows.connect"):
            mlsys_flows.connect()


def test_import_mlsys_flows_imports_nothing_else():
    code = "import sys, mlsys_flows; print(sorted(m for m in sys.modules if m.startswith(('mlsys_flows.', 'prefect'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
