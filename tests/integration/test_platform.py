"""The whole platform, as a user runs it: `mlsys-flows server` (real Prefect server + process work
pool + worker + blocks), `mlsys-flows deploy` (prefect deploy --all on prefect.yaml), a run
triggered by a signed webhook and one by the Airflow operator, both completing on the worker, one
by `mlsys-flows run` in a fresh shell (a run of the deployment) and `mlsys-flows report --storage
local` finding the server, then the Prefect UI in headless Chromium showing the deployment, the runs
and the RunReport."""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import yaml
from doc_snippets import REPO, doc_snippets
from webhook_fixtures import ServerThread

from mlsys_flows import flow_params, registry
from mlsys_flows.platform import deploy
from mlsys_flows.platform.prefect_rest import PrefectREST
from mlsys_flows.platform.server import WORK_POOL
from mlsys_flows.integrations.webhooks import WebhookConfig, create_app, signed_headers

pytestmark = pytest.mark.integration
CHROMIUM = "/usr/bin/chromium"
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def system() -> str:
    names = registry.names()
    return "recd" if "recd" in names else names[0]


@pytest.fixture(scope="session")
def platform(user_server):
    """The session's `mlsys-flows server` (tests/integration/conftest.py): its Ctrl-C is the last test
    of the session, after which no process it started may remain."""
    return user_server


@pytest.fixture(scope="session")  # the Ctrl-C test, last of the session, uses the deployments too
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
        r = httpx.post(f"{hooks.url}/hooks/{name}", content=body, timeout=60,
                       headers=signed_headers(secret, body, f"e2e-{uuid.uuid4().hex}"))
        assert r.status_code == 202, r.text
        assert r.json()["parameters"] == {"scale": "smoke", "cluster": "threads"}
        out["webhook"] = api.wait_for_final_state(r.json()["flow_run_id"], timeout_s=540, poll_s=1)
        operator.join(timeout=540)
    finally:
        hooks.stop()
    out["api"] = api
    return out


AIRFLOW_CONN = "prefect_platform_test"


def _airflow_connection(api_url: str) -> None:
    """The operator's Prefect connection, as Airflow reads one from the environment."""
    os.environ[f"AIRFLOW_CONN_{AIRFLOW_CONN.upper()}"] = json.dumps({"conn_type": "prefect", "host": api_url})


def _run_operator(api_url: str, name: str):
    """The operator outside Airflow's task runner, waiting in the worker (deferrable=False: deferral
    needs Airflow's runtime, tested by test_airflow_dags.py); returns its XCom and pushed XComs."""
    try:
        from airflow.sdk.bases.operator import ExecutorSafeguard
    except ImportError as exc:
        return exc  # the test using it skips with the reason
    from mlsys_flows.integrations.airflow.operators import MlsysFlowOperator

    ExecutorSafeguard.test_mode = True  # execute() outside Airflow's task runner
    _airflow_connection(api_url)
    op = MlsysFlowOperator(task_id=f"{name}_smoke", system=name, scale="smoke", prefect_conn_id=AIRFLOW_CONN,
                           cluster="threads", deferrable=False, poll_interval_s=1, run_timeout_s=540)
    pushed: dict = {}
    ti = SimpleNamespace(dag_id="mlsys", task_id=op.task_id, try_number=1,
                         xcom_push=lambda key, value: pushed.update({key: value}))
    try:
        return {**op.execute({"ti": ti, "run_id": f"manual__{uuid.uuid4().hex}"}), "pushed": pushed}
    except Exception as exc:  # noqa: BLE001 - reported by the test
        return exc


def _cli(platform, *args: str) -> subprocess.CompletedProcess:
    """`mlsys-flows ARGS` as a user types it in a fresh shell: no PREFECT_* variable, the platform's
    data folder; it must find the running server itself."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["MLSYS_FLOWS_HOME"] = str(platform.root)
    return subprocess.run([str(Path(sys.executable).parent / "mlsys-flows"), *args], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cli_run(platform, runs, tmp_path_factory):
    """`mlsys-flows run <system> --scale smoke` against the running server (after the webhook and
    Airflow runs: one run at a time on 2 cores); its output, RunReport and flow run."""
    path = tmp_path_factory.mktemp("cli") / "report.json"
    out = _cli(platform, "run", runs["system"], "--scale", "smoke", "-p", "seed=3", "--json", str(path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads(path.read_text())
    return SimpleNamespace(out=out, report=report, run=runs["api"].read_flow_run(report["run_id"]))


def test_deploy_creates_every_deployment_from_prefect_yaml(platform, deployed):
    declared = yaml.safe_load(deploy.PREFECT_YAML.read_text())["deployments"]
    assert deployed == sorted(f"{d['name']}/{d['name']}" for d in declared)
    with PrefectREST(platform.api_url) as api:
        for d in declared:
            dep = api.read_deployment(f"{d['name']}/{d['name']}")
            assert dep["work_pool_name"] == WORK_POOL and dep["parameters"] == {"scale": "quick"}
            assert dep["entrypoint"] == d["entrypoint"] and set(d["tags"]) <= set(dep["tags"])
            assert all(not s["active"] for s in dep["schedules"]) and len(dep["schedules"]) == len(d.get("schedules", []))
            # a paused example says so: its slug and the deployment's description
            assert all(s["slug"] == deploy.PAUSED_EXAMPLE for s in dep["schedules"]), dep["schedules"]
            assert ("paused example" in dep["description"]) == bool(dep["schedules"]), dep["description"]
            # the Parameters tab: a type for every parameter, a default where one exists
            props = dep["parameter_openapi_schema"]["properties"]
            assert list(props) == list(flow_params.NAMES), (d["name"], list(props))
            for p in flow_params.PARAMETERS:
                assert props[p.name].get("type") and props[p.name].get("default") == p.default, (d["name"], props[p.name])
            assert Path(dep["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"]) == \
                deploy.PREFECT_YAML.parent


def test_webhook_run_completes_with_its_report(runs):
    run, api = runs["webhook"], runs["api"]
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert run["parameters"] == {"scale": "smoke", "cluster": "threads"}
    _assert_flow_run_artifacts(api, run["id"], runs["system"])


def _assert_flow_run_artifacts(api: PrefectREST, run_id: str, name: str) -> None:
    """The run's table and summary belong to the flow run itself, not to a task run of it (the UI's
    Artifacts tab would list them under the `publish-report` task run)."""
    arts = api.request("POST", "artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}).json()
    mine = {a["key"]: a for a in arts if a["key"] in (f"{name}-report", f"{name}-summary")}
    assert len(mine) == 2, [a["key"] for a in arts]
    assert all(a["flow_run_id"] == run_id and a["task_run_id"] is None for a in mine.values()), \
        [(a["key"], a["flow_run_id"], a["task_run_id"]) for a in mine.values()]


def test_the_run_the_user_started_holds_every_task_and_the_resolved_parameters(runs):
    """One run page: no body subflow; the system's tasks are task runs of the run the webhook
    started; the summary artifact carries the resolved parameters and the plot."""
    run, api = runs["webhook"], runs["api"]
    children = api.request("POST", "flow_runs/filter", json={
        "flow_runs": {"parent_flow_run_id": {"any_": [run["id"]]}}}).json()
    assert children == [], [c["name"] for c in children]
    tasks = api.request("POST", "task_runs/filter", json={"flow_runs": {"id": {"any_": [run["id"]]}}}).json()
    names = {t["name"].rsplit("-", 1)[0] for t in tasks}
    assert {f"{runs['system']}-train", "publish-report"} <= names, names
    arts = {a["key"]: a for a in api.request("POST", "artifacts/filter", json={
        "artifacts": {"flow_run_id": {"any_": [run["id"]]}}}).json()}
    summary = arts[f"{runs['system']}-summary"]["data"]
    assert "## Parameters (resolved)" in summary and "| scale | `smoke` |" in summary
    assert "](data:image/png;base64," in summary
    table = arts[f"{runs['system']}-report"]["data"]
    rows = json.loads(table) if isinstance(table, str) else table
    # the headline's row first, its roles as tags: "(headline)", or "(headline; strongest)" when the
    # run's strongest deployable baseline is the headline's own
    assert list(rows[0])[:4] == ["claim", "verdict", "paper", "this run"]
    assert re.search(r"\(headline(; [a-z]+)*\)$", rows[0]["claim"]), rows[0]["claim"]


def test_airflow_operator_runs_the_deployment(runs, platform):
    result = runs.get("airflow")
    if isinstance(result, ImportError):
        pytest.skip(f"apache-airflow-task-sdk not installed (pip install -e '.[airflow]'): {result}")
    assert not isinstance(result, Exception), repr(result)
    assert result["state"] == "COMPLETED"
    run = runs["api"].read_flow_run(result["flow_run_id"])
    assert run["state"]["type"] == "COMPLETED" and "airflow" in run["tags"]
    # a run created from the deployment (as the UI's Run button creates it) carries the system's tag
    assert f"system:{runs['system']}" in run["tags"], run["tags"]
    # the extra link's XCom, pushed as soon as the run existed
    assert result["pushed"] == {"_link_PrefectRunLink": f"{platform.ui_url}/runs/flow-run/{run['id']}"}


def test_airflow_operator_refuses_bad_parameters_before_any_run(platform, deployed):
    pytest.importorskip("airflow.sdk", reason="apache-airflow-task-sdk not installed (pip install -e '.[airflow]')")
    from airflow.sdk.bases.operator import ExecutorSafeguard
    from airflow.sdk.exceptions import AirflowException

    from mlsys_flows.integrations.airflow.operators import MlsysFlowOperator

    ExecutorSafeguard.test_mode = True
    _airflow_connection(platform.api_url)
    name = system()
    with PrefectREST(platform.api_url) as api:
        dep = api.read_deployment(f"{name}/{name}")
        before = api.count_flow_runs(dep["id"])
        op = MlsysFlowOperator(task_id="bad", system=name, overrides={"no_such_param": 1}, prefect_conn_id=AIRFLOW_CONN)
        with pytest.raises(AirflowException, match="no_such_param"):
            op.execute({})
        assert api.count_flow_runs(dep["id"]) == before


E_NOTATION = re.compile(r"\d[eE][+-]\d")  # 3.489e+04, -1.836e-10: unreadable in a table


def test_ui_shows_deployment_run_and_report(platform, runs, cli_run, tmp_path):
    """What a user sees in the Prefect UI (the one `/` opens, under /v2/): the example schedules
    labelled Paused in the deployments list, the CLI run in its deployment's Runs tab, a type for every
    parameter in the Parameters tab, the run form's override fields taking a value at once, the run's
    two artifacts on the flow run itself, the summary's plot loaded, and no number in scientific
    notation in the table artifact."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium; `make system-deps`)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    name, run, api = runs["system"], cli_run.run, runs["api"]
    ui = f"{platform.ui_url}/v2"
    deployment = api.read_deployment(f"{name}/{name}")
    arts = {a["key"]: a for a in api.request("POST", "artifacts/filter", json={
        "artifacts": {"flow_run_id": {"any_": [run["id"]]}}}).json()}
    shots = {}
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # nothing leaves the machine: the UI's analytics calls are aborted
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(platform.ui_url)
                       else route.abort())

            def shot(key: str, full_page: bool = True) -> None:
                # the pictures in the docs: taken once every loading placeholder has its content
                page.wait_for_function("() => !document.querySelector('.animate-pulse')", timeout=60_000)
                shots[key] = tmp_path / f"{key}.png"
                page.screenshot(path=str(shots[key]), full_page=full_page)

            # the deployments list: every example schedule on the page reads Paused, none Active
            page.goto(f"{ui}/deployments", wait_until="domcontentloaded")
            page.get_by_text("Paused", exact=True).first.wait_for(timeout=60_000)
            assert page.get_by_text("Active", exact=True).count() == 0
            # the deployment's own page (the list is paginated): its Runs tab lists the CLI run
            page.goto(f"{ui}/deployments/deployment/{deployment['id']}?tab=Runs", wait_until="domcontentloaded")
            page.get_by_text(run["name"]).first.wait_for(timeout=60_000)
            shot("deployments")
            # the Parameters tab: a Type for every parameter
            page.goto(f"{ui}/deployments/deployment/{deployment['id']}?tab=Parameters", wait_until="domcontentloaded")
            page.get_by_text("run_key", exact=True).first.wait_for(timeout=60_000)
            cells = page.locator("table tbody tr").evaluate_all(
                "rows => rows.map(r => Array.from(r.cells, c => c.innerText.trim()))")
            assert [c[0] for c in cells] == list(flow_params.NAMES), cells
            assert all(c[-1] for c in cells), f"a parameter without a type: {cells}"
            shot("parameters")
            # the custom run form: the system's own parameters with descriptions and presets, each a
            # typed field that takes a value at once (no "None" type to switch away from)
            field = next(f for n, f in registry.get(name).params_model().model_fields.items()
                         if n not in ("scale", "seed", "repeats"))  # the first of the system's own
            page.goto(f"{ui}/deployments/deployment/{deployment['id']}/run", wait_until="domcontentloaded")
            page.get_by_text(field.description[:40]).first.wait_for(timeout=60_000)
            page.get_by_text("Preset: smoke").first.wait_for(timeout=60_000)
            page.get_by_label("Seed (Optional)").fill("5")
            assert page.get_by_text('Property is type "None"').count() == 0
            shot("run-form", full_page=False)  # the first fields; the form is a few screens long
            # the CLI run's Artifacts tab: both artifacts, on the flow run, none under a task run
            with page.expect_response(lambda r: "/graph-v2" in r.url, timeout=60_000):  # the run's task graph
                page.goto(f"{ui}/runs/flow-run/{run['id']}", wait_until="domcontentloaded")
            page.get_by_text("Completed").first.wait_for(timeout=60_000)
            page.get_by_role("tab", name="Artifacts").first.click()
            panel = page.get_by_role("tabpanel", name="Artifacts")
            for key in (f"{name}-report", f"{name}-summary"):
                panel.get_by_text(key, exact=True).first.wait_for(timeout=60_000)
            listed = panel.inner_text()
            assert "publish-report" not in listed and "Task run" not in listed, listed
            shot("flow-run")
            # the summary artifact's page: the table with the paper column and the plot, really loaded
            page.goto(f"{ui}/artifacts/artifact/{arts[f'{name}-summary']['id']}", wait_until="domcontentloaded")
            page.get_by_text("Parameters (resolved)").first.wait_for(timeout=60_000)
            page.get_by_text("paper").first.wait_for(timeout=60_000)
            plot = page.locator(f"img[alt='{name} plot']").first
            plot.wait_for(timeout=60_000)
            page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=plot.element_handle(),
                                   timeout=60_000)
            width = plot.evaluate("img => img.naturalWidth")
            shot("report-artifact")
            # the table artifact's page: every cell as the UI shows it
            page.goto(f"{ui}/artifacts/artifact/{arts[f'{name}-report']['id']}", wait_until="domcontentloaded")
            page.locator("td").first.wait_for(timeout=60_000)
            shown = page.locator("td").evaluate_all("tds => tds.map(td => td.innerText.trim())")
            # the claim, its verdict and the paper's ratio in view without scrolling sideways (the UI
            # never wraps a cell; issue 52 item 7): each header's right edge against its scroll box's
            over = page.evaluate("""() => { const t = document.querySelector('table');
                const box = t.closest('.overflow-x-auto').getBoundingClientRect();
                return Object.fromEntries([...t.querySelectorAll('th')].map(
                    h => [h.innerText.trim(), Math.round(h.getBoundingClientRect().right - box.right)])) }""")
        finally:
            browser.close()
    assert width > 300, width
    assert shots["flow-run"].stat().st_size > 10_000
    if os.environ.get("MLSYS_FLOWS_SAVE_SCREENSHOTS"):  # refresh the docs' pictures
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        for key, path in shots.items():
            shutil.copy(path, DOCS_IMG / f"prefect-ui-{key}.png")
    # the UI shows a page of rows; the artifact's data holds them all
    data = arts[f"{name}-report"]["data"]
    rows = json.loads(data) if isinstance(data, str) else data
    assert len(shown) > 10 and rows, shown
    assert all(over[c] <= 0 for c in ("claim", "verdict", "paper")), over
    every = shown + [str(v) for row in rows for v in row.values()]
    assert not [c for c in every if E_NOTATION.search(c)], sorted({c for c in every if E_NOTATION.search(c)})


def test_cli_run_is_a_run_of_the_systems_deployment(platform, runs, cli_run):
    """`mlsys-flows run` in a fresh shell (no PREFECT_* variables) finds the running server through
    its server.json, says so, and its run is a run of the system's deployment (listed in that
    deployment's Runs tab), tagged `system:<name>` and `cli`, with its artifacts on the flow run; the
    command shows its tasks' progress and where the report was saved."""
    name, run, out = runs["system"], cli_run.run, cli_run.out
    assert f"Prefect API: {platform.api_url}" in out.stdout, out.stdout
    assert cli_run.report["parameters"]["seed"] == 3 and run["parameters"]["overrides"] == {"seed": 3}
    assert run["state"]["type"] == "COMPLETED" and f"/runs/flow-run/{run['id']}" in out.stdout
    deployment = runs["api"].read_deployment(f"{name}/{name}")
    assert run["deployment_id"] == deployment["id"], run
    assert {f"system:{name}", "cli"} <= set(run["tags"]), run["tags"]
    _assert_flow_run_artifacts(runs["api"], run["id"], name)
    # progress: the tasks ran on the server's warm cluster, whose workers log only to the API; the
    # command echoes their lines (issue 52 item 4), and says where the report was saved
    shown = out.stdout + out.stderr
    assert re.search(r"\| INFO +\| Task run '[^']+' - ", shown), shown[-3000:]
    assert re.search(rf"report: \S+/reports/{name}/{run['id']}\.json", out.stdout), out.stdout[-2000:]


def test_report_finds_the_running_server(platform, cli_run, tmp_path):
    """`mlsys-flows report --storage local` in a fresh shell reads the `local` block from the running
    server (found as `run` finds it) and lists the CLI run's report from that storage."""
    out = _cli(platform, "report", "--storage", "local", "--out", str(tmp_path / "catalogue"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    pages = "".join(p.read_text() for p in (tmp_path / "catalogue").rglob("*.html"))
    assert cli_run.report["run_id"] in pages


def _fresh_env(platform, home: Path) -> dict[str, str]:
    """A fresh shell's environment: no PREFECT_* variable, the platform's data folder, and a HOME of
    its own (Prefect's default profile, ~/.prefect, is where a block goes when nothing connects)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(MLSYS_FLOWS_HOME=str(platform.root), HOME=str(home))
    return env


@contextlib.contextmanager
def _on(api_url: str):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        yield


@pytest.fixture(scope="module")
def hook_secret(platform):
    """The webhook docs read `mlsys-hook-recd`, as `mlsys-flows webhooks init` leaves it: saved unless present."""
    from prefect.blocks.system import Secret

    with _on(platform.api_url):
        try:
            Secret.load("mlsys-hook-recd")
        except ValueError:
            Secret(value=f"whsec-{uuid.uuid4().hex}").save("mlsys-hook-recd")


@pytest.mark.parametrize("snippet", doc_snippets(), ids=lambda s: s.id)
def test_doc_snippet_saves_and_loads_on_the_running_server(platform, hook_secret, snippet, tmp_path):
    """Each ```python block of README.md and docs/platform.md that saves or loads a block runs as written
    in a fresh process (no PREFECT_* variable: `mlsys_flows.connect()` finds the server by itself) and exits
    0; each block it saves is on the server, written by this run (without connect() Prefect saves into
    ~/.prefect and exits 0 too)."""
    if snippet.skip:
        pytest.skip(snippet.skip)
    from prefect import get_client

    started = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=1)
    out = subprocess.run([sys.executable, "-c", snippet.code], cwd=REPO, env=_fresh_env(platform, tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{snippet.id}:\n{snippet.code}\n{out.stdout[-2000:]}{out.stderr[-3000:]}"
    with _on(platform.api_url), get_client(sync_client=True) as client:
        saved = {d.name for d in client.read_block_documents(include_secrets=False) if d.updated >= started}
    missing = [name for name in snippet.saved_names() if name not in saved]
    assert not missing, f"{snippet.id} saved {missing} elsewhere than the running server ({platform.api_url})"


def test_blocks_devices_saves_a_pool_the_server_loads(platform):
    """`mlsys-flows blocks devices lab-gpus --kind gpu --device cuda:0` in a fresh shell saves into the
    running server, which loads it back; saving the name again needs --overwrite (exit 2, one line)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from mlsys_flows.blocks import ResourcePool

    with _on(platform.api_url), get_client(sync_client=True) as client:  # a doc snippet may have saved one
        with contextlib.suppress(ObjectNotFound):
            client.delete_block_document(client.read_block_document_by_name("lab-gpus", "mlsys-resource-pool").id)
    out = _cli(platform, "blocks", "devices", "lab-gpus", "--kind", "gpu", "--device", "cuda:0")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert (f"saved mlsys-resource-pool 'lab-gpus' (gpu cuda:0, 1 per task, pool lab-gpus) to {platform.api_url}"
            in out.stdout.splitlines()), out.stdout
    with _on(platform.api_url):
        pool = ResourcePool.load("lab-gpus")
    assert (pool.kind, pool.devices, pool.name) == ("gpu", ["cuda:0"], "lab-gpus")
    again = _cli(platform, "blocks", "devices", "lab-gpus", "--kind", "gpu", "--device", "cuda:1")
    errors = [line for line in again.stderr.splitlines() if line.startswith("error:")]
    assert again.returncode == 2 and len(errors) == 1 and "--overwrite" in errors[0], again.stderr
    assert "Traceback" not in again.stderr, again.stderr
    with _on(platform.api_url):
        assert ResourcePool.load("lab-gpus").devices == ["cuda:0"]


def test_blocks_storage_list_and_delete(platform, monkeypatch):
    """`blocks storage` takes the secret key from the variable named, saves it (never printing it); `blocks
    list` shows it beside the server's own `local` blocks; `blocks delete` removes it."""
    from mlsys_flows.blocks import ObjectStorage

    secret = f"key-{uuid.uuid4().hex}"
    monkeypatch.setenv("T_S3_SECRET", secret)
    out = _cli(platform, "blocks", "storage", "t-s3", "--url", "s3://lab/runs", "--endpoint-url",
               "http://127.0.0.1:8333", "--access-key-id", "AKIA1", "--secret-access-key-env", "T_S3_SECRET",
               "--overwrite")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert secret not in out.stdout + out.stderr and f"to {platform.api_url}" in out.stdout, out.stdout
    with _on(platform.api_url):
        assert ObjectStorage.load("t-s3").secret_access_key.get_secret_value() == secret
    listed = _cli(platform, "blocks", "list")
    assert listed.returncode == 0, listed.stderr
    rows = {tuple(line.split()) for line in listed.stdout.splitlines()}
    assert {("storage", "t-s3"), ("storage", "local"), ("cluster", "local")} <= rows, listed.stdout
    gone = _cli(platform, "blocks", "delete", "storage", "t-s3")
    assert gone.returncode == 0 and f"deleted mlsys-object-storage 't-s3' from {platform.api_url}" in gone.stdout
    with _on(platform.api_url), pytest.raises(ValueError):
        ObjectStorage.load("t-s3")


@pytest.mark.stops_the_session_server
def test_ctrl_c_stops_everything_with_a_run_in_flight(platform, deployed):
    """Last of the session (tests/integration/conftest.py moves it there): Ctrl-C to a server started with SIGINT ignored, while a deployment run
    is in flight on the worker (its flow process and its Dask LocalCluster's worker processes up)
    and another process keeps a core busy. Within 10 s the command exits 0, no process it started
    is left, and the run reads Crashed or Cancelled in the API, not Running; so does the task run
    that was in flight."""
    cli, name = platform.cli, system()
    with PrefectREST(platform.api_url) as api:
        dep = api.read_deployment(f"{name}/{name}")
        run = api.create_flow_run(dep["id"], parameters={"scale": "smoke"})

        def a_task_is_running():  # the moment: the run's first task has started on its Dask cluster
            tasks = api.request("POST", "task_runs/filter", json={"flow_runs": {"id": {"any_": [run.id]}}}).json()
            return any(t["state"]["type"] == "RUNNING" for t in tasks if t.get("state"))

        deadline = time.monotonic() + 300  # a hang guard, not the test's moment
        while not a_task_is_running():
            state = api.read_flow_run(run.id)["state"]["type"]
            if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                logs = api.request("POST", "logs/filter", json={"logs": {"flow_run_id": {"any_": [run.id]}}}).json()
                pytest.fail(f"the run ended first: {state}\n" + "\n".join(x["message"][-1500:] for x in logs[-5:]))
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
        tasks = dict(db.execute("SELECT name, state_type FROM task_run WHERE flow_run_id = ?", (str(run.id),)))
    assert final in ("CRASHED", "CANCELLED"), final
    # no task run is left Running forever (issue 52 item 2): the one in flight, if it did not finish first,
    # is Crashed (test_embedded_api's Ctrl-C test stops a run while a long task is surely in flight)
    assert tasks and all(s in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for s in tasks.values()), tasks
