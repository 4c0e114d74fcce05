"""The whole platform, as a user runs it: `mlsys-flows server` (real Prefect server + process work
pool + worker + blocks), `mlsys-flows deploy` (prefect deploy --all on prefect.yaml), a run
triggered by a signed webhook and one by the Airflow operator, both completing on the worker,
then the Prefect UI in headless Chromium showing the deployment, the run and its RunReport."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import psutil
import pytest
import yaml
from faultkit import survivors
from webhook_fixtures import ServerThread

from mlsys_flows import deploy, registry
from mlsys_flows.prefect_rest import PrefectREST
from mlsys_flows.server import WORK_POOL, free_port, state_file
from mlsys_flows.webhooks import WebhookConfig, create_app, signed_headers

pytestmark = pytest.mark.integration
CHROMIUM = "/usr/bin/chromium"
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def system() -> str:
    names = [s.name for s in registry.implemented()]
    if not names:
        pytest.skip("no system is implemented yet")
    return "recd" if "recd" in names else names[0]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ServerCLI:
    """`mlsys-flows server` started the way a CI runner, a supervisor or `cmd &` in a script starts
    it: SIGINT ignored (inherited across exec), in a process group of its own so that a SIGINT to
    the group reaches it alone, like Ctrl-C at its terminal."""

    def __init__(self, root: Path, port: int):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env["MLSYS_FLOWS_HOME"] = str(root)
        root.mkdir(parents=True, exist_ok=True)
        self.log = root.parent / "server-cli.log"
        self.proc = subprocess.Popen([str(Path(sys.executable).parent / "mlsys-flows"), "server", "--port", str(port),
                                      "--worker-query-seconds", "1"], env=env, stdout=open(self.log, "wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_ignore_sigint)
        self.state = state_file(root)

    def family(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def ctrl_c(self) -> tuple[float, list[psutil.Process]]:
        """SIGINT to the group, as Ctrl-C sends it; (seconds until the command exited, every process it
        had started that is still alive then). Kills what is left after 90 s, and fails."""
        family = self.family()
        started = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:  # a failed stop: clean up, then fail
            for p in [psutil.Process(self.proc.pid), *family]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"SIGINT did not stop `mlsys-flows server` in 90 s:\n{self.log.read_text()[-3000:]}")
        elapsed = time.monotonic() - started
        strays = survivors(family)
        return elapsed, strays


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    """`mlsys-flows server` as a user starts it, with SIGINT ignored as a background job starts it;
    stopped with Ctrl-C (SIGINT) at the end (or by the last test), after which no process it
    started may remain."""
    root = tmp_path_factory.mktemp("platform") / ".mlsys-flows"
    cli = ServerCLI(root, free_port())
    deadline = time.monotonic() + 300
    while not cli.state.exists():
        assert cli.proc.poll() is None and time.monotonic() < deadline, cli.log.read_text()[-3000:]
        time.sleep(0.5)
    info = json.loads(cli.state.read_text())
    assert len(cli.family()) >= 2  # server and worker (and their children)
    yield SimpleNamespace(api_url=info["api_url"], ui_url=info["ui_url"], root=root, cli=cli)
    if cli.proc.poll() is None:
        _, strays = cli.ctrl_c()
        assert not strays, [p.cmdline() for p in strays]
    assert cli.proc.returncode == 0, cli.log.read_text()[-3000:]
    assert not cli.state.exists()


@pytest.fixture(scope="module")
def deployed(platform):
    started = time.perf_counter()
    names = deploy.deploy(platform.api_url)
    print(f"\nprefect deploy --all: {len(names)} deployments in {time.perf_counter() - started:.1f} s")
    return names


@pytest.fixture(scope="module")
def runs(platform, deployed):
    """One run started by a signed webhook and one by the Airflow operator, concurrently."""
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from mlsys_flows.blocks import DaskCluster

    name = system()
    secret = f"whsec-{uuid.uuid4().hex}"
    with temporary_settings(updates={PREFECT_API_URL: platform.api_url}):
        Secret(value=secret).save(f"mlsys-hook-{name}", overwrite=True)
        # two runs at once on 2 cores: Dask threads instead of 2 worker processes per run
        DaskCluster(processes=False, n_workers=1, threads_per_worker=2).save("threads", overwrite=True)
    config = WebhookConfig.model_validate({"hooks": {name: {
        "system": name, "secret_block": f"mlsys-hook-{name}",
        "template": {"scale": "{{ body.scale }}", "cluster": "threads"}}}})
    api = PrefectREST(platform.api_url)
    hooks = ServerThread(create_app(config, api)).start()
    out: dict = {"system": name}
    try:
        operator = threading.Thread(target=lambda: out.update(airflow=_run_operator(platform.api_url, name)))
        operator.start()
        body = b'{"scale": "smoke"}'
        r = httpx.post(f"{hooks.url}/hooks/{name}", content=body, headers=signed_headers(secret, body, "e2e-1"), timeout=60)
        assert r.status_code == 202, r.text
        assert r.json()["parameters"] == {"scale": "smoke", "cluster": "threads"}
        out["webhook"] = api.wait_for_final_state(r.json()["flow_run_id"], timeout_s=540, poll_s=1)
        operator.join(timeout=540)
    finally:
        hooks.stop()
    out["api"] = api
    return out


def _run_operator(api_url: str, name: str):
    try:
        from airflow.sdk.bases.operator import ExecutorSafeguard
    except ImportError as exc:
        return exc  # the test using it skips with the reason
    from mlsys_flows.airflow_operator import MlsysFlowOperator

    ExecutorSafeguard.test_mode = True  # execute() outside Airflow's task runner
    op = MlsysFlowOperator(task_id=f"{name}_smoke", system=name, scale="smoke", api_url=api_url, cluster="threads",
                           poll_interval_s=1, run_timeout_s=540)
    ti = SimpleNamespace(dag_id="mlsys", task_id=op.task_id, try_number=1)
    try:
        return op.execute({"ti": ti, "run_id": f"manual__{uuid.uuid4().hex}"})
    except Exception as exc:  # noqa: BLE001 - reported by the test
        return exc


def test_deploy_creates_every_deployment_from_prefect_yaml(platform, deployed):
    declared = yaml.safe_load(deploy.PREFECT_YAML.read_text())["deployments"]
    assert deployed == sorted(f"{d['name']}/{d['name']}" for d in declared)
    with PrefectREST(platform.api_url) as api:
        for d in declared:
            dep = api.read_deployment(f"{d['name']}/{d['name']}")
            assert dep["work_pool_name"] == WORK_POOL and dep["parameters"] == {"scale": "quick"}
            assert dep["entrypoint"] == d["entrypoint"] and set(d["tags"]) <= set(dep["tags"])
            assert all(not s["active"] for s in dep["schedules"]) and len(dep["schedules"]) == len(d.get("schedules", []))
            assert Path(dep["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"]) == \
                deploy.PREFECT_YAML.parent


def test_webhook_run_completes_with_its_report(runs):
    run, api = runs["webhook"], runs["api"]
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert run["parameters"] == {"scale": "smoke", "cluster": "threads"}
    arts = api._call("POST", "artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run["id"]]}}}).json()
    assert {a["key"] for a in arts} >= {f"{runs['system']}-report", f"{runs['system']}-summary"}


def test_the_run_the_user_started_holds_every_task_and_the_resolved_parameters(runs):
    """One run page: no body subflow; the system's tasks are task runs of the run the webhook
    started; the summary artifact carries the resolved parameters and the plot."""
    run, api = runs["webhook"], runs["api"]
    children = api._call("POST", "flow_runs/filter", json={
        "flow_runs": {"parent_flow_run_id": {"any_": [run["id"]]}}}).json()
    assert children == [], [c["name"] for c in children]
    tasks = api._call("POST", "task_runs/filter", json={"flow_runs": {"id": {"any_": [run["id"]]}}}).json()
    names = {t["name"].rsplit("-", 1)[0] for t in tasks}
    assert {f"{runs['system']}-train", "publish-report"} <= names, names
    arts = {a["key"]: a for a in api._call("POST", "artifacts/filter", json={
        "artifacts": {"flow_run_id": {"any_": [run["id"]]}}}).json()}
    summary = arts[f"{runs['system']}-summary"]["data"]
    assert "## Parameters (resolved)" in summary and "| scale | `smoke` |" in summary
    assert "](data:image/png;base64," in summary
    table = arts[f"{runs['system']}-report"]["data"]
    rows = json.loads(table) if isinstance(table, str) else table
    assert list(rows[0])[:3] == ["claim", "paper", "this run"] and rows[0]["claim"].endswith("(headline)")


def test_airflow_operator_runs_the_deployment(runs):
    result = runs.get("airflow")
    if isinstance(result, ImportError):
        pytest.skip(f"apache-airflow-task-sdk not installed (pip install -e '.[airflow]'): {result}")
    assert not isinstance(result, Exception), repr(result)
    assert result["state"] == "COMPLETED"
    run = runs["api"].read_flow_run(result["flow_run_id"])
    assert run["state"]["type"] == "COMPLETED" and "airflow" in run["tags"]


def test_airflow_operator_refuses_bad_parameters_before_any_run(platform, deployed):
    pytest.importorskip("airflow.sdk", reason="apache-airflow-task-sdk not installed (pip install -e '.[airflow]')")
    from airflow.sdk.bases.operator import ExecutorSafeguard
    from airflow.sdk.exceptions import AirflowException

    from mlsys_flows.airflow_operator import MlsysFlowOperator

    ExecutorSafeguard.test_mode = True
    name = system()
    with PrefectREST(platform.api_url) as api:
        dep = api.read_deployment(f"{name}/{name}")
        before = api.count_flow_runs(dep["id"])
        op = MlsysFlowOperator(task_id="bad", system=name, overrides={"no_such_param": 1}, api_url=platform.api_url)
        with pytest.raises(AirflowException, match="no_such_param"):
            op.execute({})
        assert api.count_flow_runs(dep["id"]) == before


def test_ui_shows_deployment_run_and_report(platform, runs, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium; `make system-deps`)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    name, run = runs["system"], runs["webhook"]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # nothing leaves the machine: the UI's analytics calls are aborted
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(platform.ui_url)
                       else route.abort())
            # the deployment's own page: the list is paginated, and with every system deployed this
            # one need not be on its first page
            deployment = runs["api"].read_deployment(f"{name}/{name}")
            page.goto(f"{platform.ui_url}/deployments/deployment/{deployment['id']}", wait_until="domcontentloaded")
            page.get_by_text(f"{name}", exact=True).first.wait_for(timeout=60_000)
            page.get_by_text("Parameters").first.wait_for(timeout=60_000)
            page.screenshot(path=str(tmp_path / "deployments.png"))
            # the custom run form: the system's own parameters, each with its description
            field = next(f for n, f in registry.get(name).params_model().model_fields.items()
                         if n not in ("scale", "seed", "repeats"))  # the first of the system's own
            page.goto(f"{platform.ui_url}/deployments/deployment/{deployment['id']}/run", wait_until="domcontentloaded")
            overrides = registry.get(name).params_model().overrides_model().__name__
            page.get_by_text(overrides, exact=True).first.click()  # the form's "<Model> | None" switch
            page.get_by_text(field.description[:40]).first.wait_for(timeout=60_000)
            page.get_by_text("Preset: smoke").first.wait_for(timeout=60_000)
            page.screenshot(path=str(tmp_path / "run-form.png"), full_page=True)
            page.goto(f"{platform.ui_url}/runs/flow-run/{run['id']}", wait_until="domcontentloaded")
            page.get_by_text(run["name"]).first.wait_for(timeout=60_000)
            page.get_by_text("Completed").first.wait_for(timeout=60_000)
            page.get_by_text("Artifacts").first.click()
            page.get_by_text(f"{name}-report").first.wait_for(timeout=60_000)
            shot = tmp_path / "flow-run.png"
            page.screenshot(path=str(shot), full_page=True)
            # the summary artifact's page: the table with the paper column and the plot, really loaded
            summary = next(a for a in runs["api"]._call("POST", "artifacts/filter", json={
                "artifacts": {"flow_run_id": {"any_": [run["id"]]}}}).json() if a["key"] == f"{name}-summary")
            page.goto(f"{platform.ui_url}/artifacts/artifact/{summary['id']}", wait_until="domcontentloaded")
            page.get_by_text("Parameters (resolved)").first.wait_for(timeout=60_000)
            page.get_by_text("paper").first.wait_for(timeout=60_000)
            plot = page.locator(f"img[alt='{name} plot']").first
            plot.wait_for(timeout=60_000)
            page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=plot.element_handle(),
                                   timeout=60_000)
            width = plot.evaluate("img => img.naturalWidth")
            plot.scroll_into_view_if_needed()
            report_shot = tmp_path / "report-artifact.png"
            page.screenshot(path=str(report_shot), full_page=True)
        finally:
            browser.close()
    assert width > 300, width
    assert shot.stat().st_size > 10_000
    if os.environ.get("MLSYS_FLOWS_SAVE_SCREENSHOTS"):  # refresh the docs' picture
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, DOCS_IMG / "prefect-ui-flow-run.png")
        shutil.copy(tmp_path / "deployments.png", DOCS_IMG / "prefect-ui-deployments.png")
        shutil.copy(report_shot, DOCS_IMG / "prefect-ui-report-artifact.png")
        shutil.copy(tmp_path / "run-form.png", DOCS_IMG / "prefect-ui-run-form.png")


def test_cli_run_uses_the_running_server(platform, runs, tmp_path):
    """`mlsys-flows run` in a fresh shell (no PREFECT_* variables) finds the running server through
    its server.json, says so, and its run is on that server (so in its UI)."""
    name = runs["system"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["MLSYS_FLOWS_HOME"] = str(platform.root)
    out = subprocess.run([str(Path(sys.executable).parent / "mlsys-flows"), "run", name, "--scale", "smoke",
                          "-p", "seed=3", "--json", str(tmp_path / "report.json")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"Prefect API: {platform.api_url}" in out.stdout, out.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["parameters"]["seed"] == 3
    run = runs["api"].read_flow_run(report["run_id"])
    assert run["state"]["type"] == "COMPLETED" and f"/runs/flow-run/{report['run_id']}" in out.stdout


def test_ctrl_c_stops_everything_with_a_run_in_flight(platform, deployed):
    """Last in this module: Ctrl-C to a server started with SIGINT ignored, while a deployment run
    is in flight on the worker (its flow process and its Dask LocalCluster's worker processes up)
    and another process keeps a core busy. Within 10 s the command exits 0, no process it started
    is left, and the run reads Crashed or Cancelled in the API, not Running."""
    cli, name = platform.cli, system()
    with PrefectREST(platform.api_url) as api:
        dep = api.read_deployment(f"{name}/{name}")
        run = api.create_flow_run(dep["id"], parameters={"scale": "smoke"})

        def a_task_is_running():  # the moment: the run's first task has started on its Dask cluster
            tasks = api._call("POST", "task_runs/filter", json={"flow_runs": {"id": {"any_": [run.id]}}}).json()
            return any(t["state"]["type"] == "RUNNING" for t in tasks if t.get("state"))

        deadline = time.monotonic() + 300  # a hang guard, not the test's moment
        while not a_task_is_running():
            state = api.read_flow_run(run.id)["state"]["type"]
            assert state not in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"), f"the run ended first: {state}"
            assert time.monotonic() < deadline, "the run's first task never started"
            time.sleep(0.2)
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            family = cli.family()
            worker = next(p for p in family if "worker" in p.cmdline() and "start" in p.cmdline())
            in_flight = worker.children(recursive=True)  # the flow-run process and its Dask cluster
            print("\nin flight:", [" ".join(p.cmdline())[:120] for p in in_flight])
            elapsed, strays = cli.ctrl_c()
        finally:
            busy.kill()
            busy.wait()
    print(f"\nCtrl-C with a run in flight: stopped in {elapsed:.1f} s")
    assert cli.proc.returncode == 0, cli.log.read_text()[-3000:]
    assert not strays, [p.cmdline() for p in strays]
    assert elapsed < 10, f"stopping took {elapsed:.1f} s:\n{cli.log.read_text()[-2000:]}"
    assert in_flight, "the worker had no flow-run process in flight"
    # the server is gone: its SQLite database holds the run's last state
    import sqlite3

    with contextlib.closing(sqlite3.connect(platform.root / "server" / "prefect.db")) as db:
        (final,) = db.execute("SELECT state_type FROM flow_run WHERE id = ?", (str(run.id),)).fetchone()
    assert final in ("CRASHED", "CANCELLED"), final
