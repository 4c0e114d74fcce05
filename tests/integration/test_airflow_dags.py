"""`airflow dags test` in Airflow's own environment (Airflow 3.3.2 alone in a separate venv: it
cannot share one with Prefect), running a DAG whose MlsysFlowOperator triggers a deployment on
a live `mlsys-flows server` platform and waits for it. Builds the venv (minutes), so it runs only
with MLSYS_FLOWS_AIRFLOW_VENV=1 (`make test-airflow`); the operator's execute() is tested in the
project venv by test_platform.py on every `make test`."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from mlsys_flows import deploy, registry
from mlsys_flows.prefect_rest import PrefectREST
from mlsys_flows.server import LocalPlatform, free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.environ.get("MLSYS_FLOWS_AIRFLOW_VENV"),
                                 reason="builds an Airflow 3.3.2 venv (minutes): set MLSYS_FLOWS_AIRFLOW_VENV=1 "
                                        "or run `make test-airflow`")]
REPO = Path(__file__).resolve().parents[2]
AIRFLOW = "apache-airflow==3.3.2"


def airflow_venv() -> Path:
    """A venv with Airflow only, plus this project without its dependencies (for the operator)."""
    venv = Path(os.environ.get("MLSYS_FLOWS_AIRFLOW_VENV_DIR", REPO / ".venv-airflow"))
    py = venv / "bin" / "python"
    if not (venv / "bin" / "airflow").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", AIRFLOW], check=True, timeout=1500)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO)], check=True, timeout=600)
    return venv


def test_airflow_dags_test_runs_a_deployment(tmp_path):
    names = [s.name for s in registry.implemented()]
    if not names:
        pytest.skip("no system is implemented yet")
    name = "recd" if "recd" in names else names[0]
    venv = airflow_venv()
    with LocalPlatform(port=free_port(), root=tmp_path / ".mlsys-flows", worker_query_s=1) as platform:
        deploy.deploy(platform.api_url, [name])
        dags = tmp_path / "dags"
        dags.mkdir()
        dag_id = f"mlsys_{uuid.uuid4().hex[:8]}"
        (dags / "mlsys_dag.py").write_text(textwrap.dedent(f"""
            from airflow.sdk import DAG
            from mlsys_flows.airflow_operator import MlsysFlowOperator

            with DAG("{dag_id}", schedule=None, catchup=False):
                MlsysFlowOperator(task_id="{name}", system="{name}", scale="smoke",
                                  api_url="{platform.api_url}", poll_interval_s=1, run_timeout_s=600)
        """))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "VIRTUAL_ENV"))}
        env.update(AIRFLOW_HOME=str(tmp_path / "airflow"), AIRFLOW__CORE__DAGS_FOLDER=str(dags),
                   AIRFLOW__CORE__LOAD_EXAMPLES="False", PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
        airflow = str(venv / "bin" / "airflow")
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
        done = subprocess.run([airflow, "dags", "test", dag_id], env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        with PrefectREST(platform.api_url) as api:
            dep = api.read_deployment(f"{name}/{name}")
            runs = api._call("POST", "flow_runs/filter", json={
                "deployments": {"id": {"any_": [dep["id"]]}}, "flow_runs": {"tags": {"all_": ["airflow"]}}}).json()
        assert [r["state"]["type"] for r in runs] == ["COMPLETED"]
        assert f"airflow:{dag_id}:" in runs[0]["idempotency_key"]
