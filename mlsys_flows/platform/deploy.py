"""`prefect.yaml` from the registry, and `mlsys-flows deploy` (= `prefect deploy --all` on it).

One deployment per implemented system: entrypoint ``flows/<name>.py:<name>``, default parameters
from ``flow_params.py`` (``scale: quick``), the ``mlsys-process`` work pool, tags ``mlsys`` + the
family. A few carry an example nightly cron schedule that is inactive until switched on in the UI. No
``pull`` section: Prefect then records the directory `prefect deploy` ran in (``settings.project_root()``:
the clone, or the wheel's copy of ``flows/``) as the runs' working directory.

``deploy --pool NAME --image IMAGE`` renders the same deployments for a container pool (docker by default): the
image as a job variable and a ``set_working_directory`` pull step to the images' WORKDIR (``CONTAINER_WORKDIR``),
where ``flows/<name>.py`` lies (infra/docker/Dockerfile*); without it Prefect would start the run in /opt/prefect.
That variant is written to its own file (``target_file``), never over the committed prefect.yaml. A prefect.yaml the
user edited is deployed as written with ``--prefect-file`` (no registry check: the user's choice).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from mlsys_flows import flow_params, registry
from mlsys_flows.errors import MlsysError
from mlsys_flows.platform.infra import POOL_TYPES, REPO, job_template
from mlsys_flows.platform.server import WORK_POOL, ensure_work_pool
from mlsys_flows.settings import home, is_checkout

PREFECT_YAML = REPO / "prefect.yaml"
PAUSED_EXAMPLE = "nightly-paused-example"  # slug of the example schedules, inactive as deployed
CONTAINER_WORKDIR = "/opt/mlsys-flows"  # WORKDIR of infra/docker/Dockerfile and Dockerfile.cuda
HEADER = ("# Generated from mlsys_flows/registry.py by `mlsys-flows deploy --write-yaml`; do not edit by hand\n"
          "# (tests/unit/test_prefect_yaml.py checks it matches the registry). Deploy all: `mlsys-flows deploy`\n"
          "# or `prefect deploy --all` from this folder with PREFECT_API_URL set.\n")


class DeployError(MlsysError, RuntimeError):
    """Deployment could not be done; the message is meant for a user."""


def deployment(spec: registry.SystemSpec, schedule_hour: int | None = None, pool: str = WORK_POOL,
               image: str | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": spec.name,
        "entrypoint": spec.entrypoint,
        "description": f"{spec.title} ({spec.paper}). Paper: {spec.headline.statement}.",
        "tags": ["mlsys", spec.family, f"system:{spec.name}"],  # as a CLI run is tagged: the UI filters by it
        "parameters": flow_params.deployment_parameters(),  # {"scale": "quick"}
        "enforce_parameter_schema": True,
        "work_pool": {"name": pool, "work_queue_name": "default", "job_variables": {"image": image} if image else {}},
    }
    if image:  # the run starts where the image keeps the flows, not in Prefect's default /opt/prefect
        d["pull"] = [{"prefect.deployments.steps.set_working_directory": {"directory": CONTAINER_WORKDIR}}]
    if schedule_hour is not None:
        # an example only: paused until switched on (UI, or `prefect deployment schedule resume`); the slug and
        # the description say so, where the UI would otherwise show "At 02:00 AM every day" as if it ran
        d["schedules"] = [{"cron": f"0 {schedule_hour} * * *", "timezone": "UTC", "active": False,
                           "slug": PAUSED_EXAMPLE}]
        d["description"] += (f" Schedule: a paused example, nightly at {schedule_hour:02d}:00 UTC; switch it on in the "
                             f"deployment's page to run it.")
    return d


def prefect_yaml(pool: str = WORK_POOL, image: str | None = None) -> dict[str, Any]:
    """The prefect.yaml document: every system; the first of each family scheduled."""
    deployments, scheduled_families = [], []
    for spec in registry.all_specs():
        hour = None
        if spec.family not in scheduled_families:
            hour = (2 + len(scheduled_families)) % 24  # stagger the nightly examples
            scheduled_families.append(spec.family)
        deployments.append(deployment(spec, hour, pool, image))
    return {"name": "mlsys-flows", "prefect-version": "3.8", "deployments": deployments}


def render(pool: str = WORK_POOL, image: str | None = None) -> str:
    return HEADER + yaml.safe_dump(prefect_yaml(pool, image), sort_keys=False, width=110)


def target_file(pool: str = WORK_POOL, image: str | None = None, project_dir: Path | None = None) -> Path:
    """Where ``deploy`` writes the rendered prefect.yaml: ``project_dir`` if given; else in a checkout the
    committed prefect.yaml for the default pool and ``<MLSYS_FLOWS_HOME>/deploy/<pool>/`` for another pool or
    an image; installed from the wheel, the current folder (the user's project)."""
    if project_dir is not None:
        return Path(project_dir) / "prefect.yaml"
    if not is_checkout():
        return Path.cwd() / "prefect.yaml"
    return PREFECT_YAML if (pool, image) == (WORK_POOL, None) else home() / "deploy" / pool / "prefect.yaml"


def write_yaml(path: Path = PREFECT_YAML) -> Path:
    path.write_text(render())
    return path


def yaml_in_sync(path: Path = PREFECT_YAML) -> bool:
    return path.exists() and yaml.safe_load(path.read_text()) == prefect_yaml()


def deploy(api_url: str, names: list[str] | None = None, path: Path | None = None, pool: str = WORK_POOL,
           image: str | None = None, pool_type: str | None = None, project_dir: Path | None = None,
           timeout_s: float = 600) -> list[str]:
    """Run `prefect deploy` against ``api_url``; returns ``flow/deployment`` names. ``path``: a prefect.yaml
    the user wrote or edited, deployed as written. Without it, the registry's deployments for ``pool`` (created
    as ``pool_type``: docker when an ``image`` is given, else process) are rendered to :func:`target_file`;
    the committed prefect.yaml must match the registry."""
    pool_type = pool_type or ("docker" if image else "process")
    if pool_type not in POOL_TYPES:
        raise DeployError(f"pool type must be one of {', '.join(POOL_TYPES)} (got {pool_type!r})")
    if image and pool_type == "process":
        raise DeployError(f"--image {image} needs a container pool type (docker, kubernetes, ...), not process")
    if path is None:
        path = target_file(pool, image, project_dir)
        if path == PREFECT_YAML:
            if not yaml_in_sync(path):
                raise DeployError(f"{path} does not match the registry; run `mlsys-flows deploy --write-yaml`, or "
                                  f"deploy your edited file with `mlsys-flows deploy --prefect-file {path}`")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(pool, image))
    elif not path.is_file():
        raise DeployError(f"--prefect-file {path}: no such file")
    declared = yaml.safe_load(path.read_text()).get("deployments") or []
    available = {d["name"] for d in declared}
    if not available:
        raise DeployError(f"{path} has no deployments")
    chosen = sorted(available) if not names else names
    unknown = [n for n in chosen if n not in available]
    if unknown:
        raise DeployError(f"no deployment for {', '.join(unknown)}; deployable: {', '.join(sorted(available))}")
    for name in sorted({d.get("work_pool", {}).get("name") or pool for d in declared}):
        existing = ensure_work_pool(api_url, name, pool_type, job_template(pool_type))
        if image and existing["type"] == "process":
            raise DeployError(f"work pool {name!r} is a process pool: it cannot run --image {image}; "
                              f"name another pool (created as {pool_type})")
    selection = ["--all"] if not names else [a for n in chosen for a in ("--name", f"{n}/{n}")]
    # run where flows/<name>.py lies (the entrypoints' base; a process pool's runs start there too)
    env = {**os.environ, "PREFECT_API_URL": api_url, "PWD": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    done = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", *selection,
                           "--prefect-file", str(path.resolve())],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise DeployError(f"prefect deploy failed ({done.returncode}):\n{tail}")
    return [f"{n}/{n}" for n in chosen]
