"""`prefect.yaml` from the registry, and `mlsys-flows deploy` (= `prefect deploy --all` on it).

One deployment per implemented system: entrypoint ``flows/<name>.py:<name>``, default parameters
from ``flow_params.py`` (``scale: quick``), the ``mlsys-process`` work pool, tags ``mlsys`` + the
family. A few carry an example nightly cron schedule that is inactive until switched on in the UI. No ``pull`` section: Prefect
then records the directory `prefect deploy` ran in (the clone) as the runs' working directory.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from mlsys_flows import flow_params, registry
from mlsys_flows.infra import REPO
from mlsys_flows.server import WORK_POOL, _bin, ensure_work_pool

PREFECT_YAML = REPO / "prefect.yaml"
HEADER = ("# Generated from mlsys_flows/registry.py by `mlsys-flows deploy --write-yaml`; do not edit by hand\n"
          "# (tests/unit/test_prefect_yaml.py checks it matches the registry). Deploy all: `mlsys-flows deploy`\n"
          "# or `prefect deploy --all` from this folder with PREFECT_API_URL set.\n")


class DeployError(RuntimeError):
    """Deployment could not be done; the message is meant for a user."""


def deployment(spec: registry.SystemSpec, schedule_hour: int | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": spec.name,
        "entrypoint": spec.entrypoint,
        "description": f"{spec.title} ({spec.paper}). Paper: {spec.headline.statement}.",
        "tags": ["mlsys", spec.family],
        "parameters": flow_params.deployment_parameters(),  # {"scale": "quick"}
        "enforce_parameter_schema": True,
        "work_pool": {"name": WORK_POOL, "work_queue_name": "default", "job_variables": {}},
    }
    if schedule_hour is not None:
        # an example only: inactive until switched on (UI, or `prefect deployment schedule resume`)
        d["schedules"] = [{"cron": f"0 {schedule_hour} * * *", "timezone": "UTC", "active": False,
                           "slug": "nightly"}]
    return d


def prefect_yaml() -> dict[str, Any]:
    """The prefect.yaml document: every implemented system; the first of each family scheduled."""
    deployments, scheduled_families = [], []
    for spec in registry.implemented():
        hour = None
        if spec.family not in scheduled_families:
            hour = (2 + len(scheduled_families)) % 24  # stagger the nightly examples
            scheduled_families.append(spec.family)
        deployments.append(deployment(spec, hour))
    return {"name": "mlsys-flows", "prefect-version": "3.8", "deployments": deployments}


def render() -> str:
    return HEADER + yaml.safe_dump(prefect_yaml(), sort_keys=False, width=110)


def write_yaml(path: Path = PREFECT_YAML) -> Path:
    path.write_text(render())
    return path


def yaml_in_sync(path: Path = PREFECT_YAML) -> bool:
    return path.exists() and yaml.safe_load(path.read_text()) == prefect_yaml()


def deploy(api_url: str, names: list[str] | None = None, path: Path = PREFECT_YAML,
           timeout_s: float = 600) -> list[str]:
    """Run `prefect deploy` on prefect.yaml against ``api_url``; returns ``flow/deployment`` names."""
    if not yaml_in_sync(path):
        raise DeployError(f"{path} does not match the registry; run `mlsys-flows deploy --write-yaml`")
    available = {d["name"] for d in yaml.safe_load(path.read_text())["deployments"]}
    if not available:
        raise DeployError("no system is implemented yet: prefect.yaml has no deployments")
    chosen = sorted(available) if not names else names
    unknown = [n for n in chosen if n not in available]
    if unknown:
        raise DeployError(f"no deployment for {', '.join(unknown)}; deployable: {', '.join(sorted(available))}")
    ensure_work_pool(api_url, WORK_POOL)
    selection = ["--all"] if not names else [a for n in chosen for a in ("--name", f"{n}/{n}")]
    env = {**os.environ, "PREFECT_API_URL": api_url, "PWD": str(path.parent),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    done = subprocess.run([_bin("prefect"), "--no-prompt", "deploy", *selection, "--prefect-file", str(path)],
                          cwd=path.parent, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise DeployError(f"prefect deploy failed ({done.returncode}):\n{tail}")
    return [f"{n}/{n}" for n in chosen]
