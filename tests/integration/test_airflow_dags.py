"""The Airflow provider in Airflow's own environment, against a live platform (`LocalPlatform`:
Prefect server, process work pool, worker): Airflow finds the provider through its entry point;
`airflow dags test` of a DAG with the deferrable MlsysFlowOperator defers to the trigger, which
waits on the run with its async client, and the task ends with the run's final state; killing the
task (SIGTERM to `airflow dags test`, sent once the Prefect run is RUNNING) cancels the run.

Airflow cannot share the project's venv (docs/platform.md, section 4: Airflow), so the tests use
`.venv-airflow` (tests/airflow_env.py: Airflow 3.3.2 alone from PyPI, plus this project with
--no-deps), which `make test` builds before the suite like the project's own venv. The tests skip
only when Airflow cannot be installed.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_env import AirflowUnavailable, airflow_venv

from mlsys_flows.platform import deploy
from mlsys_flows.platform.prefect_rest import FINAL_STATES, PrefectREST
from mlsys_flows.platform.server import LocalPlatform
from mlsys_flows.systems.common.net import free_port

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
API_KEY = f"pnu_{uuid.uuid4().hex}"  # sent as the bearer token (the local server ignores it); must never be printed


EXAMPLE = REPO / "infra" / "airflow" / "mlsys_recd_dag.py"  # the documented example DAG: recd, scale a param
DAG_ID, SYSTEM = "mlsys_recd", "recd"


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    """Airflow's venv, home (SQLite, migrated) and DAGs folder (the example DAG), and a
    `prefect_default` connection to a live platform with recd deployed."""
    started = time.perf_counter()
    try:
        venv = airflow_venv()  # `make test` built it before the suite; a run of this file alone builds it here
    except AirflowUnavailable as exc:
        pytest.skip(str(exc))
    print(f"\n.venv-airflow ready in {time.perf_counter() - started:.1f} s")
    tmp = tmp_path_factory.mktemp("airflow")
    started = time.perf_counter()
    # no warm Dask cluster: two runs here, each starts its own (cheaper than warming every flow's imports)
    with LocalPlatform(port=free_port(), root=tmp / ".mlsys-flows", worker_query_s=1, warm_cluster=False) as platform:
        deploy.deploy(platform.api_url, [SYSTEM])
        print(f"platform up and {SYSTEM} deployed in {time.perf_counter() - started:.1f} s")
        dags = tmp / "dags"
        dags.mkdir()
        shutil.copy(EXAMPLE, dags)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "VIRTUAL_ENV", "AIRFLOW"))}
        env.update(AIRFLOW_HOME=str(tmp / "home"), AIRFLOW__CORE__DAGS_FOLDER=str(dags),
                   AIRFLOW__CORE__LOAD_EXAMPLES="False", PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
                   AIRFLOW_CONN_PREFECT_DEFAULT=json.dumps({"conn_type": "prefect", "host": platform.api_url,
                                                            "password": API_KEY}))
        started = time.perf_counter()
        subprocess.run([str(venv / "bin" / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True,
                       timeout=300)
        print(f"airflow db migrate in {time.perf_counter() - started:.1f} s")
        with PrefectREST(platform.api_url) as api:
            yield SimpleNamespace(venv=venv, env=env, platform=platform, api=api, db=tmp / "home" / "airflow.db")


def dags_test(airflow, scale: str) -> list[str]:
    return [str(airflow.venv / "bin" / "airflow"), "dags", "test", DAG_ID, "-c", json.dumps({"scale": scale})]


def prefect_runs(airflow, scale: str) -> list[dict]:
    """The Prefect runs that the example DAG's task started at ``scale`` (key airflow:<dag>:...)."""
    runs = airflow.api.request("POST", "flow_runs/filter", json={"flow_runs": {"tags": {"all_": ["airflow"]}}}).json()
    return [r for r in runs if (r.get("idempotency_key") or "").startswith(f"airflow:{DAG_ID}:")
            and r["parameters"].get("scale") == scale]


def airflow_rows(airflow, prefect_run: dict, query: str) -> list[tuple]:
    """``query`` on Airflow's database for the DAG run that started ``prefect_run`` (its run id is in
    the idempotency key airflow:<dag>:<run_id>:<task>:<try>); ``?`` placeholders: dag id, run id."""
    run_id = prefect_run["idempotency_key"].removeprefix(f"airflow:{DAG_ID}:").rsplit(":", 2)[0]
    with contextlib.closing(sqlite3.connect(airflow.db)) as db:
        return db.execute(query, (DAG_ID, run_id)).fetchall()


def test_airflow_finds_the_provider(airflow):
    code = ("from airflow.providers_manager import ProvidersManager as P; p = P(); "
            "print(p.providers['mlsys-flows'].version, p.hooks['prefect'].hook_class_name, "
            "'mlsys_flows.integrations.airflow.operators.PrefectRunLink' in p.extra_links_class_names)")
    out = subprocess.run([str(airflow.venv / "bin" / "python"), "-c", code], env=airflow.env, capture_output=True,
                         text=True, timeout=300)
    assert out.stdout.split()[-3:] == ["0.1.0", "mlsys_flows.integrations.airflow.hooks.PrefectHook", "True"], out.stderr[-3000:]


@pytest.mark.budget(150, reason="`airflow dags test` in its own venv drives a deployment run through the "
                                "process worker, which starts the flow's own embedded cluster")
def test_dags_test_runs_a_deferrable_dag_to_the_runs_final_state(airflow):
    done = subprocess.run(dags_test(airflow, "smoke"), env=airflow.env, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "running trigger in line" in output, output[-4000:]  # the task deferred to the trigger
    assert API_KEY not in output
    [run] = prefect_runs(airflow, "smoke")
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert run["parameters"] == {"scale": "smoke", "overrides": {"seed": 1}}
    [(state,)] = airflow_rows(airflow, run, "SELECT state FROM task_instance WHERE dag_id = ? AND run_id = ?")
    assert state == "success"
    xcoms = dict(airflow_rows(airflow, run, "SELECT key, value FROM xcom WHERE dag_id = ? AND run_id = ?"))
    assert json.loads(xcoms["_link_PrefectRunLink"]) == f"{airflow.platform.ui_url}/runs/flow-run/{run['id']}"
    assert json.loads(xcoms["return_value"])["state"] == "COMPLETED"


@pytest.mark.budget(150, reason="as above: Airflow's run of a deployment, then its cancellation")
def test_killing_the_airflow_task_cancels_the_prefect_run(airflow, tmp_path):
    """SIGTERM to `airflow dags test` (what Airflow's supervisor sends a task it kills) once the
    run is RUNNING: the operator's on_kill cancels it, the worker stops it (Cancelled), and the
    task fails with that state."""
    log = tmp_path / "dags-test.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(dags_test(airflow, "quick"), env=airflow.env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600  # a hang guard, not the test's moment
        while not (runs := prefect_runs(airflow, "quick")) or runs[0]["state"]["type"] != "RUNNING":
            assert proc.poll() is None, f"dags test exited first:\n{log.read_text()[-3000:]}"
            assert not runs or runs[0]["state"]["type"] not in FINAL_STATES, f"the run ended first: {runs[0]['state']}"
            assert time.monotonic() < deadline, "the Prefect run never reached RUNNING"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    run = airflow.api.wait_for_final_state(runs[0]["id"], timeout_s=300, poll_s=0.5)
    assert run["state"]["type"] == "CANCELLED", (run["state"], output[-3000:])
    [(state,)] = airflow_rows(airflow, run, "SELECT state FROM task_instance WHERE dag_id = ? AND run_id = ?")
    assert state == "failed", output[-3000:]
    assert "ended CANCELLED" in output and API_KEY not in output


def test_the_deferred_tasks_kill_cancels_the_run_and_the_trigger_reports_it(prefect_api, monkeypatch):
    """The trigger in this venv (Airflow 3.2's triggers, imported without its runtime) against the
    session's Prefect API: its on_kill (what Airflow >= 3.3's triggerer calls when a user kills the
    deferred task) asks a RUNNING run to cancel, and its loop fires once the run is Cancelled."""
    pytest.importorskip("airflow.triggers.base", reason="apache-airflow-task-sdk not installed")
    import asyncio

    from prefect.settings import PREFECT_API_URL

    from mlsys_flows.integrations.airflow.triggers import PrefectFlowRunTrigger

    monkeypatch.setenv("AIRFLOW_CONN_PREFECT_TRIGGER_TEST", json.dumps({"conn_type": "prefect",
                                                                        "host": PREFECT_API_URL.value()}))
    with PrefectREST(PREFECT_API_URL.value()) as api:
        flow = api.request("POST", "flows/", json={"name": f"airflow-trigger-{uuid.uuid4().hex[:8]}"}).json()
        run = api.request("POST", "flow_runs/", json={"flow_id": flow["id"], "state": {"type": "SCHEDULED"}}).json()
        for state in ("PENDING", "RUNNING"):  # as a worker and the flow's process would
            api.request("POST", f"flow_runs/{run['id']}/set_state", json={"state": {"type": state}})
        trigger = PrefectFlowRunTrigger(run["id"], "prefect_trigger_test", poll_interval_s=0.2)
        assert trigger.serialize()[1] == {"flow_run_id": run["id"], "prefect_conn_id": "prefect_trigger_test",
                                          "poll_interval_s": 0.2, "deadline": None}

        asyncio.run(trigger.on_kill())
        assert api.read_flow_run(run["id"])["state"]["type"] == "CANCELLING"
        # Cancelling is not final: past its deadline the trigger reports it as a timeout, not an end
        late = PrefectFlowRunTrigger(run["id"], "prefect_trigger_test", poll_interval_s=0.2, deadline=0.0)
        event = asyncio.run(anext(late.run()))
        assert (event.payload["state"], event.payload["timed_out"]) == ("CANCELLING", True)
        # the worker's part: it stopped the flow's process
        api.request("POST", f"flow_runs/{run['id']}/set_state", json={"state": {"type": "CANCELLED"}})
        event = asyncio.run(anext(trigger.run()))
    assert event.payload["state"] == "CANCELLED" and event.payload["flow_run_id"] == run["id"]
    assert not event.payload["error"] and not event.payload["timed_out"]
