"""Work-pool base job templates and Dask cluster specs kept in ``infra/``.

The templates start from Prefect's own defaults, asked of Prefect's SDK (see
``default_job_template``), with mlsys-flows defaults on top: the worker image and resources a flow
at ``quick`` scale needs. ``python -m mlsys_flows.platform.infra`` rewrites ``infra/work-pools/*.json``; a
test keeps them in sync. ``python -m mlsys_flows.platform.infra --refresh-defaults`` first saves Prefect's
current defaults of the worker types whose packages the project does not install.
"""
from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

from mlsys_flows.settings import project_root

REPO = project_root()  # the checkout, or the wheel's copy of infra/ (settings.py)
INFRA = REPO / "infra"

# pool type -> the prefect collection that holds its worker
POOL_TYPES = {"process": "prefect", "docker": "prefect-docker", "kubernetes": "prefect-kubernetes",
              "ecs": "prefect-aws", "cloud-run": "prefect-gcp", "cloud-run-v2": "prefect-gcp"}
CPU_IMAGE = "mlsys-flows-worker:cpu"   # infra/docker/Dockerfile
CUDA_IMAGE = "mlsys-flows-worker:cuda"  # infra/docker/Dockerfile.cuda
RUN_ENV = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DASK_LOGGING__DISTRIBUTED": "warning"}

# variable -> new default, per pool type (only variables Prefect's template declares)
OVERRIDES: dict[str, dict[str, Any]] = {
    "process": {"env": RUN_ENV},
    "docker": {"env": RUN_ENV, "image": CPU_IMAGE, "image_pull_policy": "IfNotPresent", "mem_limit": "8g",
               "auto_remove": True},
    "kubernetes": {"env": RUN_ENV, "image": CPU_IMAGE, "namespace": "mlsys", "cpu_request": "2",
                   "memory_request": "8Gi", "finished_job_ttl": 3600},
    "ecs": {"env": RUN_ENV, "image": CPU_IMAGE, "cpu": 2048, "memory": 8192, "family": "mlsys-flows",
            "configure_cloudwatch_logs": True},
    "cloud-run": {"env": RUN_ENV, "image": CPU_IMAGE, "cpu": "2", "memory": "8Gi", "timeout": 3600},
    "cloud-run-v2": {"env": RUN_ENV, "image": CPU_IMAGE, "cpu": "2000m", "memory": "8Gi", "timeout": 3600},
}
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


# Worker types whose packages are dependencies of the project (pyproject.toml): their worker class
# gives the default. The others' defaults are saved under PREFECT_DEFAULTS (see refresh_defaults).
INSTALLED_WORKERS = ("process", "docker")
PREFECT_DEFAULTS = INFRA / "work-pools" / "prefect-defaults"


def _check_pool_type(pool_type: str) -> None:
    if pool_type not in POOL_TYPES:
        raise ValueError(f"pool type must be one of {', '.join(POOL_TYPES)} (got {pool_type!r})")


def default_job_template(pool_type: str) -> dict[str, Any]:
    """Prefect's default base job template of a worker type, offline: the worker class's own
    ``get_default_base_job_template()`` for the installed ones, else the copy that
    ``refresh_defaults`` saved from Prefect's API."""
    _check_pool_type(pool_type)
    if pool_type in INSTALLED_WORKERS:
        from prefect.workers.base import BaseWorker

        worker = BaseWorker.get_worker_class_from_type(pool_type)
        if worker is None:
            raise RuntimeError(f"the {pool_type} worker is not installed: pip install {POOL_TYPES[pool_type]}")
        return copy.deepcopy(worker.get_default_base_job_template())
    return json.loads((PREFECT_DEFAULTS / f"{pool_type}.json").read_text())


def fetch_default_job_template(pool_type: str) -> dict[str, Any]:
    """Prefect's default as `prefect work-pool get-default-base-job-template --type TYPE` gives it
    (the same SDK call): the installed worker's, else the collection registry's through the Prefect
    API (``PREFECT_API_URL``, or Prefect's temporary API when none is set)."""
    from prefect.utilities.asyncutils import run_coro_as_sync
    from prefect.workers.utilities import get_default_base_job_template_for_infrastructure_type

    _check_pool_type(pool_type)
    template = run_coro_as_sync(get_default_base_job_template_for_infrastructure_type(pool_type))
    if template is None:
        raise RuntimeError(f"Prefect knows no {pool_type!r} work pool type")
    return template


def refresh_defaults() -> list[Path]:
    """Save Prefect's current defaults of the worker types the project does not install."""
    PREFECT_DEFAULTS.mkdir(parents=True, exist_ok=True)
    paths = []
    for pool_type in POOL_TYPES:
        if pool_type not in INSTALLED_WORKERS:
            path = PREFECT_DEFAULTS / f"{pool_type}.json"
            path.write_text(json.dumps(fetch_default_job_template(pool_type), indent=2) + "\n")
            paths.append(path)
    return paths


def job_template(pool_type: str) -> dict[str, Any]:
    """Prefect's default with the mlsys-flows defaults applied."""
    template = default_job_template(pool_type)
    props = template["variables"]["properties"]
    for name, value in OVERRIDES.get(pool_type, {}).items():
        if name not in props:
            raise KeyError(f"{pool_type} job template has no variable {name!r}")
        props[name]["default"] = value
    return template


def placeholders(obj: Any) -> set[str]:
    """Every ``{{ variable }}`` a job configuration refers to."""
    if isinstance(obj, dict):
        return set().union(*(placeholders(v) for v in obj.values())) if obj else set()
    if isinstance(obj, list):
        return set().union(*(placeholders(v) for v in obj)) if obj else set()
    return set(PLACEHOLDER.findall(obj)) if isinstance(obj, str) else set()


def check_job_template(template: dict[str, Any]) -> list[str]:
    """Problems of a base job template: missing sections, placeholders without a variable,
    defaults of the wrong JSON type. Empty list = valid."""
    problems = [f"missing {key!r}" for key in ("job_configuration", "variables") if key not in template]
    if problems:
        return problems
    variables = template["variables"]
    if variables.get("type") != "object" or not isinstance(variables.get("properties"), dict):
        return ["variables must be a JSON schema of type object with properties"]
    props = variables["properties"]
    problems += [f"placeholder {{{{ {p} }}}} has no variable" for p in sorted(placeholders(template["job_configuration"]))
                 if p not in props and p != "prefect"]
    json_types = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}
    for name, prop in props.items():
        # a type, or (Prefect's optional fields) anyOf [{type: T}, {type: null}]
        types = [t for t in [prop.get("type"), *(a.get("type") for a in prop.get("anyOf", []))] if t in json_types]
        if "default" in prop and prop["default"] is not None and types:
            if not isinstance(prop["default"], tuple(json_types[t] for t in types)):
                problems.append(f"variable {name!r}: default {prop['default']!r} is not a {' or '.join(types)}")
    return problems


def template_path(pool_type: str) -> Path:
    return INFRA / "work-pools" / f"{pool_type}.json"


def write_templates() -> list[Path]:
    paths = []
    for pool_type in POOL_TYPES:
        path = template_path(pool_type)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(job_template(pool_type), indent=2) + "\n")
        paths.append(path)
    return paths


def dask_specs() -> dict[str, Path]:
    """name -> path of every Dask cluster spec in infra/dask/."""
    return {p.stem: p for p in sorted((INFRA / "dask").glob("*.yaml"))}


def load_dask_spec(path: str | Path) -> dict[str, Any]:
    """A cluster spec: the fields of a ``DaskCluster`` block (``cluster_class``, ``cluster_kwargs``, ...)."""
    import yaml

    spec = yaml.safe_load(Path(path).read_text())
    if not isinstance(spec, dict) or "cluster_class" not in spec:
        raise ValueError(f"{path}: a Dask cluster spec is a mapping with cluster_class and cluster_kwargs")
    return spec


if __name__ == "__main__":
    for p in refresh_defaults() if "--refresh-defaults" in sys.argv[1:] else []:
        print(p.relative_to(REPO))
    for p in write_templates():
        print(p.relative_to(REPO))
