"""prefect.yaml, infra/ templates and specs, webhook signing/templating, process groups: no server."""
from __future__ import annotations

import importlib
import inspect
import json
import shutil
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import yaml

from mlsys_flows import registry
from mlsys_flows.platform import deploy, infra
from mlsys_flows.platform.procs import Proc
from mlsys_flows.integrations.webhooks import HookConfig, Rejected, WebhookConfig, build_parameters, render_template, signature

REPO = infra.REPO


# --- prefect.yaml --------------------------------------------------------------------------------
def test_prefect_yaml_matches_registry():
    committed = yaml.safe_load(deploy.PREFECT_YAML.read_text())
    assert committed == deploy.prefect_yaml(), "prefect.yaml is stale: run `mlsys-flows deploy --write-yaml`"
    assert [d["name"] for d in committed["deployments"]] == registry.names()


def test_prefect_yaml_deployments_are_runnable_as_declared():
    from prefect.cli.deploy._models import PrefectYamlModel

    model = PrefectYamlModel.model_validate(yaml.safe_load(deploy.PREFECT_YAML.read_text()))
    for d in model.deployments:
        path, _, func = d.entrypoint.partition(":")
        assert (REPO / path).exists() and func == d.name
        assert d.work_pool.name == "mlsys-process"
        spec = registry.get(d.name)
        assert d.tags == ["mlsys", spec.family, f"system:{d.name}"]
        spec.params_model().for_scale(**d.parameters)  # the default parameters validate
        assert all(not s.active for s in (d.schedules or [])), "example schedules must start inactive"
    families = {registry.get(d.name).family for d in model.deployments}
    assert sum(bool(d.schedules) for d in model.deployments) == len(families)


# --- infra/ ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("pool_type", sorted(infra.POOL_TYPES))
def test_job_templates_in_sync_and_valid(pool_type):
    committed = json.loads(infra.template_path(pool_type).read_text())
    assert committed == infra.job_template(pool_type), "run `python -m mlsys_flows.platform.infra`"
    assert infra.check_job_template(committed) == []
    # same variables as Prefect's own template: only defaults changed, so every worker accepts it
    assert committed["variables"]["properties"].keys() == infra.default_job_template(pool_type)["variables"]["properties"].keys()


def test_job_template_check_catches_problems():
    t = infra.job_template("docker")
    t["job_configuration"]["image"] = "{{ imagee }}"
    t["variables"]["properties"]["mem_limit"]["default"] = 8
    problems = infra.check_job_template(t)
    assert any("imagee" in p for p in problems) and any("mem_limit" in p for p in problems)
    assert infra.check_job_template({"variables": {}}) == ["missing 'job_configuration'"]


@pytest.mark.parametrize("name", sorted(infra.dask_specs()))
def test_dask_specs_build_dask_cluster_blocks(name):
    from mlsys_flows.blocks import DaskCluster

    spec = infra.load_dask_spec(infra.dask_specs()[name])
    block = DaskCluster(**spec)
    assert block.mode == "class" and block.cluster_kwargs
    module, _, attr = block.cluster_class.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError:
        with pytest.raises(ValueError, match="cannot be imported"):
            block.task_runner()  # clear message naming the package to install
        return
    params = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        assert set(block.cluster_kwargs) <= set(params), f"{cls} does not take {set(block.cluster_kwargs) - set(params)}"
    assert block.task_runner().cluster_class is cls or block.task_runner()


def test_dask_specs_present():
    assert set(infra.dask_specs()) == {"kubernetes", "aws-ec2", "coiled"}


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfiles_copy_existing_paths_and_pin_torch(dockerfile):
    lines = [ln.strip() for ln in (REPO / "infra/docker" / dockerfile).read_text().splitlines()]
    instructions = [ln for ln in lines if ln and not ln.startswith("#")]
    assert instructions[0].startswith("FROM ")
    assert ("nvidia/cuda" in instructions[0]) == dockerfile.endswith(".cuda")
    for ln in instructions:
        if ln.startswith("COPY "):
            for src in ln.split()[1:-1]:
                assert (REPO / src).exists(), f"{dockerfile}: COPY source {src} missing"
    assert any("torch==2.13.0" in ln for ln in instructions)
    assert any(ln.startswith("CMD") and "worker" in ln for ln in instructions)


# --- webhooks: signing, templates, config -------------------------------------------------------------
def test_signature_matches_openssl():
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed")
    body, ts, delivery, secret = b'{"scale":"smoke"}', 1700000000, "d-1.x", "s3cr3t"
    out = subprocess.run(["openssl", "dgst", "-sha256", "-hmac", secret], input=f"{ts}\n{delivery}\n".encode() + body,
                         capture_output=True, check=True).stdout.decode()
    assert signature(secret, ts, delivery, body) == "sha256=" + out.split()[-1]
    assert signature(secret, ts, "d-2", body) != signature(secret, ts, delivery, body)  # the delivery id is signed


def _hook(**kw):
    system = registry.names()[0]
    return HookConfig(**{"system": system, "secret_env": "X", **kw})


def test_template_maps_body_fields_and_defaults():
    params, used = render_template({"scale": "{{ body.scale }}", "overrides": {"seed": "{{ body.cfg.seed }}"},
                                    "storage": "lab-s3"}, {"scale": "smoke", "cfg": {"seed": 3}})
    assert params == {"scale": "smoke", "overrides": {"seed": 3}, "storage": "lab-s3"} and used == {"scale", "cfg"}
    params, _ = render_template({"scale": "{{ body.scale }}"}, {})
    assert params == {}  # absent -> the deployment's default


@pytest.mark.parametrize("body, status, field", [
    ({"scale": "huge"}, 422, "scale"),
    ({"overrides": [1]}, 422, "overrides"),
    ({"overrides": {"no_such_param": 1}}, 422, "no_such_param"),
    ({"scal": "smoke"}, 422, "scal"),
    ([1, 2], 400, None),
])
def test_build_parameters_rejects_naming_the_field(body, status, field):
    with pytest.raises(Rejected) as exc:
        build_parameters(_hook(), body)
    assert exc.value.status == status and exc.value.field == field


def test_hook_config_validation():
    with pytest.raises(ValueError, match="exactly one of secret_block, secret_env"):
        HookConfig(system="moetuner")
    with pytest.raises(ValueError, match="unknown system"):
        HookConfig(system="nope", secret_env="X")
    with pytest.raises(ValueError, match="unknown flow parameter"):
        HookConfig(system="moetuner", secret_env="X", template={"scales": "quick"})
    with pytest.raises(ValueError, match="hook names"):
        WebhookConfig(hooks={"Bad Name": HookConfig(system="moetuner", secret_env="X")})


def test_example_hook_config_loads():
    cfg = WebhookConfig.load(REPO / "infra/webhooks/hooks.example.yaml")
    assert cfg.hooks and all(h.secret_block for h in cfg.hooks.values())


# --- the Airflow provider imports no prefect --------------------------------------------------------
def test_airflow_provider_imports_no_prefect():
    pytest.importorskip("airflow.sdk", reason="the `airflow` extra is not installed")
    code = "import sys, mlsys_flows.integrations.airflow.operators as m; print(m.MlsysFlowOperator.__name__, 'prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["MlsysFlowOperator", "False"], out.stderr[-2000:]


# --- process groups: TERM -> INT -> KILL, no strays -----------------------------------------------------
STUBBORN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)          # like a worker that needs INT
    # a grandchild in a session of its own, ignoring TERM and INT: only KILL stops it
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"], start_new_session=True)
    print("ready", flush=True)
    time.sleep(600)
""")


def test_proc_stop_leaves_no_strays(tmp_path):
    log = tmp_path / "p.log"
    proc = Proc("stubborn", [sys.executable, "-c", STUBBORN], log=log)
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    family = [proc.pid] + [p.pid for p in proc.descendants()]
    assert len(family) == 2
    started = time.monotonic()
    proc.stop(grace_s=1.0)
    assert time.monotonic() - started < 15
    for pid in family:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_cli_deploy_check_and_help():
    from typer.testing import CliRunner

    from mlsys_flows.cli import app

    runner = CliRunner()
    assert runner.invoke(app, ["deploy", "--check"]).exit_code == 0
    for cmd in (["server", "--help"], ["webhooks", "serve", "--help"], ["webhooks", "send", "--help"]):
        assert runner.invoke(app, cmd).exit_code == 0, cmd
